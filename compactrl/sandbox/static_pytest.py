"""A static pytest judge: each test's verdict from the files, with :mod:`ast`, never executing them.

The sim sandbox (:mod:`compactrl.sandbox.sim`) uses it as its ``run_tests``. It decides each
test's outcome from the current files for generated code tasks (``task.metadata["sim"]``, see
:mod:`compactrl.tasksets.generators.code`), so that it equals what ``python -m pytest`` would report on
the same files (``docs/environments.md`` lists the edits on which the two can disagree):

0. What pytest does before running a test: a config file it cannot read (invalid TOML) stops it;
   a collected file (``test_*.py``, ``*_test.py``, ``conftest.py``) that certainly fails to import
   (does not compile, its top level raises, it imports a missing module or a name the module cannot
   bind) is a collection error. Either way no test runs: every test fails.
1. A module that is missing, does not parse, or whose import would raise (a constant's value
   expression raising, a name used before it is bound) is *broken*: a test file whose imports
   reach it is a collection error (0).
2. A module whose code differs from the original in anything but comments, formatting, docstrings
   and the value expressions of the bug file's constants is *changed*: tests reaching it fail (the
   sim does not guess what new code does).
3. Otherwise each constant's value expression is evaluated by a small evaluator over literals,
   arithmetic, earlier constants and a few pure builtins, and compared with the correct value; a
   spec test passes iff the constants its function uses are correct.

Verdicts are cached by file-content hash, so repeated test runs are cheap.
"""

from __future__ import annotations

import ast
import builtins
import math
import sys
import tomllib
import warnings
from collections import OrderedDict
from functools import lru_cache

from compactrl.sandbox.base import TestReport
from compactrl.task import Task

_REPORTS: OrderedDict[tuple, TestReport] = OrderedDict()


def judge_code_task(task: Task, files: dict[str, str]) -> TestReport:
    """Per-test verdict of a generated code task on ``files`` (see the module docstring)."""
    paths = tuple(files)
    key = (task.id, task.files.get(task.metadata["bug_file"]), paths, *map(files.__getitem__, _judged_paths(paths)))
    report = _REPORTS.get(key)
    if report is None:
        report = _REPORTS[key] = _judge(task, files)
        if len(_REPORTS) > 4096:
            _REPORTS.popitem(last=False)
    return report


def _judge(task: Task, files: dict[str, str]) -> TestReport:
    meta = task.metadata
    sim = meta["sim"]
    bug_file = meta["bug_file"]
    problem = _config_problem(files, task.files)
    if problem is not None:  # pytest exits with a usage error before collecting anything
        return TestReport((), tuple(task.check.must_pass), f"ERROR: {problem}\nno tests ran (sim)", False)
    facts = tuple((f["key"], f["compare"], f["value"]) for f in meta["facts"])
    sites = tuple((s["line"], s["key"], frozenset(s["names_before"])) for s in sim.get("sites", ())) or None
    status: dict[str, str] = {}
    fact_ok: dict[str, bool] = {}
    for path in sim["modules"]:
        if path == bug_file:
            status[path], ok = _module_verdict(files.get(path), task.files[path], facts, sites)
            fact_ok.update(ok)
        else:
            status[path], _ = _module_verdict(files.get(path), task.files[path], ())
    errors = _collection_errors(task, files, status)
    if errors:  # pytest reports "Interrupted: N errors during collection" and runs no test at all
        lines = [f"ERROR {p}" for p in errors] + [f"Interrupted: {len(errors)} error(s) during collection (sim)"]
        return TestReport((), tuple(task.check.must_pass), "\n".join(lines), False)
    reach = _reach(task)
    # A missing module nobody imports is no error (a missing __init__.py makes a namespace package).
    not_ok = {m for m, s in status.items() if s == "changed" or (s == "broken" and m in files)}
    passed, failed = [], []
    for test_id in task.check.must_pass:
        ok = reach[test_id].isdisjoint(not_ok) and all(fact_ok.get(k, False) for k in sim["tests"][test_id]["facts"])
        (passed if ok else failed).append(test_id)
    return TestReport(tuple(passed), tuple(failed), _pytest_like_output(passed, failed), not failed)


@lru_cache(maxsize=1024)
def _judged_paths(paths: tuple[str, ...]) -> tuple[str, ...]:
    """The files whose contents the verdict depends on: Python files and pytest's config files."""
    return tuple(p for p in paths if p.endswith(".py") or p in _CONFIG_FILES)


_REACH: OrderedDict[tuple[str, str], dict[str, frozenset[str]]] = OrderedDict()


def _reach(task: Task) -> dict[str, frozenset[str]]:
    """Modules each test's imports reach (cached per task: it never changes)."""
    sim = task.metadata["sim"]
    key = (task.id, task.files[task.metadata["bug_file"]])
    reach = _REACH.get(key)
    if reach is None:
        tests = sim["tests"]
        if all("reach" in tests[t] for t in task.check.must_pass):  # recorded by the generator
            reach = {t: frozenset(tests[t]["reach"]) for t in task.check.must_pass}
        else:
            closures = _closures(sim["modules"])
            reach = {t: frozenset().union(*(closures[m] for m in tests[t]["imports"])) for t in task.check.must_pass}
        _REACH[key] = reach
        if len(_REACH) > 1024:
            _REACH.popitem(last=False)
    return reach


def _closures(graph: dict[str, list[str]]) -> dict[str, frozenset[str]]:
    out = {}
    for start in graph:
        seen, todo = {start}, [start]
        while todo:
            for dep in graph.get(todo.pop(), ()):
                if dep not in seen:
                    seen.add(dep)
                    todo.append(dep)
        out[start] = frozenset(seen)
    return out


def _pytest_like_output(passed: list[str], failed: list[str]) -> str:
    lines = [f"PASSED {t}" for t in passed] + [f"FAILED {t}" for t in failed]
    counts = ", ".join(s for s in (f"{len(failed)} failed" if failed else "", f"{len(passed)} passed" if passed else "") if s)
    return "\n".join(lines + [f"{counts or 'no tests ran'} (sim)"])


@lru_cache(maxsize=8192)
def _module_verdict(
    current: str | None, original: str, facts: tuple[tuple[str, str, object], ...], sites=None
) -> tuple[str, dict[str, bool]]:
    """``("ok" | "broken" | "changed", {fact key: correct})`` for one module's source.

    ``sites``: ``(line index, key, names bound before)`` of the original's fact assignments, when
    the generator recorded them (saves parsing the original)."""
    keys = frozenset(k for k, _, _ in facts)
    none_ok = {k: False for k in keys}
    if current is None:
        return "broken", none_ok
    if current == original and not facts:
        return "ok", {}
    fast = _fact_lines_only(current, original, facts, sites) if facts else None
    return fast if fast is not None else _full_verdict(current, original, facts)


def _full_verdict(current: str, original: str, facts) -> tuple[str, dict[str, bool]]:
    keys = frozenset(k for k, _, _ in facts)
    none_ok = {k: False for k in keys}
    try:
        tree = ast.parse(current)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "broken", none_ok
    if _changed(tree, current, original, keys):
        return "changed", none_ok
    values = _evaluate_module(tree, keys)
    if values is None:
        return "broken", none_ok
    ok = {key: _matches(values.get(key, _UNKNOWN), compare, expected) for key, compare, expected in facts}
    return "ok", ok


# -- fast path: only fact lines changed ----------------------------------------------------------


@lru_cache(maxsize=1024)
def _original_sites(original: str, keys: frozenset[str]) -> tuple[tuple[str, ...], dict[int, str], dict[int, frozenset[str]]]:
    """Lines of the original, ``{line index: fact key}`` of its one-line fact assignments, and the
    names bound at module level before each of them."""
    tree = ast.parse(original)
    sites, before, bound = {}, {}, set()
    for stmt in tree.body:
        key = _fact_target(stmt, set(keys))
        if key is not None and stmt.lineno == stmt.end_lineno:
            sites[stmt.lineno - 1] = key
            before[stmt.lineno - 1] = frozenset(bound)
        bound.update(_bound_names(stmt))
    return tuple(original.split("\n")), sites, before


def _fact_lines_only(current: str, original: str, facts, sites=None) -> tuple[str, dict[str, bool]] | None:
    """The verdict when the only edits are to the fact assignment lines, each still one complete
    ``KEY = expr`` statement; None when the edit is anything else (then the full analysis runs).

    Sound because a top-level statement that parses on its own line cannot change how any other
    line tokenizes, so the module equals the original with those statements' values replaced.
    """
    keys = frozenset(k for k, _, _ in facts)
    if sites is None:
        lines, where, before = _original_sites(original, keys)
    else:
        lines, where, before = _split(original), {i: k for i, k, _ in sites}, {i: b for i, _, b in sites}
    cur = tuple(current.split("\n"))
    if len(cur) != len(lines):
        return None
    edges = [-1, *sorted(where), len(lines)]
    if any(cur[a + 1 : b] != lines[a + 1 : b] for a, b in zip(edges, edges[1:])):
        return None  # a line other than a fact assignment changed
    values: dict[str, object] = {}
    for i in sorted(where):
        key = where[i]
        body = _parse_line(cur[i])
        if body is None:
            return None
        if len(body) != 1 or _fact_target(body[0], {key}) != key:
            return None
        env: dict[str, object] = dict.fromkeys(before[i], _UNKNOWN)
        env.update((k, v) for k, v in values.items() if k in before[i])
        try:
            values[key] = _eval(body[0].value, env)
        except _Raises:
            return "broken", {k: False for k in keys}
    return "ok", {key: _matches(values.get(key, _UNKNOWN), compare, expected) for key, compare, expected in facts}


@lru_cache(maxsize=1024)
def _split(source: str) -> tuple[str, ...]:
    return tuple(source.split("\n"))


@lru_cache(maxsize=8192)
def _parse_line(line: str) -> list[ast.stmt] | None:
    """The statements of one source line (cached: the same edits recur), None if it does not parse."""
    try:
        return ast.parse(line).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


# -- full path: statement-level comparison with the original -------------------------------------


class _Original:
    """The original module parsed once, with statement dumps computed on demand."""

    def __init__(self, source: str, keys: frozenset[str]) -> None:
        self.lines = source.split("\n")
        self.body = _strip_docstrings(ast.parse(source).body)
        self.keys = keys
        self._dumps: dict[int, str] = {}

    def dump(self, index: int) -> str:
        if index not in self._dumps:
            self._dumps[index] = _stmt_dump(self.body[index], self.keys)
        return self._dumps[index]


@lru_cache(maxsize=256)
def _original(source: str, keys: frozenset[str]) -> _Original:
    return _Original(source, keys)


def _changed(tree: ast.Module, current: str, original: str, keys: frozenset[str]) -> bool:
    """Whether the module's code differs from the original beyond comments, formatting, docstrings
    and the fact constants' values. Statements on lines untouched by the edit (same text, same
    position relative to the start or the end of the file) are equal without comparing ASTs."""
    orig = _original(original, keys)
    body = _strip_docstrings(tree.body)
    if len(body) != len(orig.body):
        return True
    cur_lines = current.split("\n")
    prefix = 0
    for a, b in zip(cur_lines, orig.lines):
        if a != b:
            break
        prefix += 1
    suffix = 0
    for a, b in zip(reversed(cur_lines), reversed(orig.lines)):
        if a != b or suffix >= min(len(cur_lines), len(orig.lines)) - prefix:
            break
        suffix += 1
    shift = len(orig.lines) - len(cur_lines)
    for i, (c, o) in enumerate(zip(body, orig.body)):
        span_c = (c.lineno, c.end_lineno, c.col_offset, c.end_col_offset)
        if c.end_lineno <= prefix and span_c == (o.lineno, o.end_lineno, o.col_offset, o.end_col_offset):
            continue
        if c.lineno > len(cur_lines) - suffix and span_c == (o.lineno - shift, o.end_lineno - shift, o.col_offset, o.end_col_offset):
            continue
        if _stmt_dump(c, keys) != orig.dump(i):
            return True
    return False


def _stmt_dump(stmt: ast.stmt, keys: frozenset[str]) -> str:
    """One top-level statement's AST without docstrings, a fact constant's value blanked.
    (Mutates ``stmt``: callers pass statements of trees they own, once.)"""
    target = _fact_target(stmt, set(keys))
    if target is not None:
        return f"fact {target}"
    for node in ast.walk(stmt):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node.body = _strip_docstrings(node.body) or [ast.Pass()]
    return ast.dump(stmt, annotate_fields=False, include_attributes=False)


def _strip_docstrings(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _fact_target(stmt: ast.stmt, keys: set[str]) -> str | None:
    """The fact constant a top-level statement assigns (``KEY = expr`` or ``KEY: T = expr``)."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        name = stmt.targets[0].id
    elif isinstance(stmt, ast.AnnAssign) and stmt.simple and stmt.value is not None and isinstance(stmt.target, ast.Name):
        name = stmt.target.id
    else:
        return None
    return name if name in keys else None


# -- the evaluator --------------------------------------------------------------------------


class _Unknown:
    """A value the evaluator does not model (a function object, a call it does not allow...)."""

    def __repr__(self) -> str:
        return "<unknown>"


_UNKNOWN = _Unknown()
_PURE_BUILTINS = {"int": int, "float": float, "str": str, "abs": abs, "round": round, "min": min, "max": max}
_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}
_UNARY = {ast.USub: lambda a: -a, ast.UAdd: lambda a: +a, ast.Not: lambda a: not a, ast.Invert: lambda a: ~a}
_MAX_BITS = 100_000
_MAX_STR = 1_000_000


class _Raises(Exception):
    """Evaluating the expression raises at import time (real Python would fail the import)."""


def _evaluate_module(tree: ast.Module, keys: set[str]) -> dict[str, object] | None:
    """Values of the fact constants as importing the module would bind them; None if it raises."""
    env: dict[str, object] = {}
    out: dict[str, object] = {}
    for stmt in tree.body:
        target = _fact_target(stmt, keys)
        if target is not None:
            try:
                value = _eval(stmt.value, env)
            except _Raises:
                return None
            env[target] = out[target] = value
        else:
            for name in _bound_names(stmt):
                env[name] = _UNKNOWN
    return out


def _bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return [n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def _eval(node: ast.expr, env: dict[str, object]) -> object:
    try:
        return _eval_node(node, env)
    except _Raises:
        raise
    except (ArithmeticError, TypeError, ValueError) as exc:
        raise _Raises(type(exc).__name__) from None
    except RecursionError:
        return _UNKNOWN


def _eval_node(node: ast.expr, env: dict[str, object]) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        if node.id in _PURE_BUILTINS:
            return _PURE_BUILTINS[node.id]
        if hasattr(builtins, node.id):
            return _UNKNOWN
        raise _Raises("NameError")
    args: list[object]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        args = [_eval_node(node.operand, env)]
        op = _UNARY[type(node.op)]
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        args = [_eval_node(node.left, env), _eval_node(node.right, env)]
        op = _BINOPS[type(node.op)]
        if not _affordable(node.op, *args):
            return _UNKNOWN
    elif isinstance(node, ast.Call) and not node.keywords and not any(isinstance(a, ast.Starred) for a in node.args):
        func = _eval_node(node.func, env)
        args = [_eval_node(a, env) for a in node.args]
        if func not in _PURE_BUILTINS.values():
            return _UNKNOWN
        op = func
    else:
        return _UNKNOWN
    if any(a is _UNKNOWN for a in args) or any(not isinstance(a, (int, float, complex, str, bool, type(None), bytes)) for a in args):
        return _UNKNOWN
    return _bounded(op(*args))


def _affordable(op: ast.operator, a: object, b: object) -> bool:
    """Refuse operations whose result would be huge (real Python would just be slow)."""
    if isinstance(op, ast.Pow) and isinstance(a, int) and isinstance(b, int) and b > 0:
        return max(1, abs(a).bit_length()) * b <= _MAX_BITS
    if isinstance(op, ast.Mult) and isinstance(a, (str, bytes)) and isinstance(b, int):
        return len(a) * b <= _MAX_STR
    if isinstance(op, ast.Mult) and isinstance(b, (str, bytes)) and isinstance(a, int):
        return len(b) * a <= _MAX_STR
    return True


def _bounded(value: object) -> object:
    if isinstance(value, int) and value.bit_length() > _MAX_BITS:
        return _UNKNOWN
    return value


def _matches(value: object, compare: str, expected: object) -> bool:
    if compare == "int":
        return type(value) is int and value == expected
    if compare == "number":
        return type(value) in (int, float) and not (isinstance(value, float) and math.isnan(value)) and value == expected
    if compare == "str":
        return type(value) is str and value == expected
    raise ValueError(f"unknown compare rule {compare!r}")


# -- collection: what pytest does before it runs a test -----------------------------------------
#
# Modelled on pytest 9 with the task's command (``python -m pytest`` in the work dir, no options):
# the config files it reads from the work dir, the files it collects by default (``test_*.py``,
# ``*_test.py``, ``conftest.py``; not under ``.*``, ``build``, ``dist``... or a virtualenv), their
# module names ("prepend" import mode) and whether importing each certainly raises. Only *certain*
# errors count: code the analysis cannot decide (a call, a loop, a third-party import) is assumed
# to import fine.

_CONFIG_FILES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
_NORECURSE = frozenset({"_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}"})
_MODULE_DUNDERS = frozenset({"__name__", "__file__", "__doc__", "__package__", "__loader__", "__spec__",
                             "__builtins__", "__cached__", "__annotations__", "__path__"})
_DYNAMIC = frozenset({"globals", "vars", "locals", "exec", "eval", "setattr", "__import__", "__getattr__", "__dict__", "modules"})


def _config_problem(files: dict[str, str], original: dict[str, str]) -> str | None:
    """Why pytest stops with a usage error before collecting (from the config files it looks for in
    the work dir, in its precedence order); None if it starts. INI files are not parsed; the
    project's own config (``original``) is known to work, and nothing after it is modelled."""
    for name in _CONFIG_FILES:
        text = files.get(name)
        if text is None:
            continue
        if not name.endswith(".toml") or text is original.get(name) or text == original.get(name):
            return None  # pytest.ini configures whatever it holds; tox.ini/setup.cfg: not modelled
        problem, configures = _toml_config(name, text)
        if problem is not None or configures:
            return problem
    return None


@lru_cache(maxsize=256)
def _toml_config(name: str, text: str) -> tuple[str | None, bool]:
    """``(usage error or None, whether the file is pytest's configuration)``, as pytest's loaders."""
    try:
        text.encode("utf-8")  # pytest reads it as UTF-8 text with universal newlines
        doc = tomllib.loads(text.replace("\r\n", "\n").replace("\r", "\n"))
    except UnicodeError:
        return f"{name}: not valid UTF-8", False
    except tomllib.TOMLDecodeError as exc:
        return f"{name}: {exc}", False
    if name != "pyproject.toml":  # pytest.toml: always the configuration, from its [pytest] table
        loose = [k for k, v in doc.items() if not isinstance(v, dict)]
        bad = not isinstance(doc.get("pytest", {}), dict) or ("pytest" not in doc and loose)
        return (f"{name}: pytest configuration must be under a [pytest] table" if bad else None), True
    tool = doc.get("tool", {})
    table = tool.get("pytest", {}) if isinstance(tool, dict) else None
    if not isinstance(table, dict):
        return f"{name}: [tool] and [tool.pytest] must be tables", False
    toml_mode, ini = any(k != "ini_options" for k in table), table.get("ini_options")
    if toml_mode and ini:
        return f"{name}: cannot use both [tool.pytest] and [tool.pytest.ini_options]", True
    return None, toml_mode or ini is not None


@lru_cache(maxsize=1024)
def _collected(paths: tuple[str, ...]) -> tuple[str, ...]:
    """The files pytest imports while collecting from the work dir, in path order."""
    candidates = [p for p in paths if p.endswith(".py") and _collectable_name(p.rpartition("/")[2])]
    if not candidates:
        return ()
    venvs = {p.rpartition("/")[0] for p in paths if p.endswith("/pyvenv.cfg")}
    out = []
    for path in sorted(candidates):
        dirs = path.split("/")[:-1]
        if any(d[:1] == "." or d.endswith(".egg") or d in _NORECURSE for d in dirs) or (
                venvs and any("/".join(dirs[: i + 1]) in venvs for i in range(len(dirs)))):
            continue
        out.append(path)
    return tuple(out)


def _raising_modules(task: Task, files: dict[str, str], status: dict[str, str]) -> set[str] | None:
    """The modules whose own code raises at import, when every module is present and imports what
    its original imports and may still bind every name its original binds (then a test file fails
    to import iff its imports reach one of them); None otherwise."""
    raising = set()
    for path, state in status.items():
        if path not in files:
            return None
        if state == "broken":
            raising.add(path)
        elif state == "changed":
            info, original = _file_info(files[path]), _generated_info(task.files[path])
            if info.raises:
                raising.add(path)
            elif info.imports != original.imports or (info.names is not None and not original.names <= info.names):
                return None
    return raising


def _as_generated(task: Task, files: dict[str, str]) -> bool:
    """Whether the Python files, their paths, the collected test files and the config files are the
    generated project's (the modules' contents aside: the caller judges those)."""
    py, collected, config = _generated_layout(task)
    return (
        _same_layout(tuple(files), py, tuple(p for p, _ in collected), task.metadata["package"])
        and all(files[p] is c or files[p] == c for p, c in collected)
        and all(files.get(n) == c for n, c in config)
    )


@lru_cache(maxsize=1024)
def _same_layout(paths: tuple[str, ...], py: frozenset[str], collected: tuple[str, ...], package: str) -> bool:
    """Every generated Python file present, the same files collected, and any added module unable
    to change an import."""
    if not py <= set(paths):
        return False
    extra = [p for p in paths if p.endswith(".py") and p not in py]
    return not extra or (_collected(paths) == collected and all(_cannot_shadow(p, package, collected) for p in extra))


def _cannot_shadow(path: str, package: str, collected: tuple[str, ...]) -> bool:
    """Whether an added, uncollected module can change no import: it is no package's
    ``__init__.py`` (a package directory wins over a module of the same name), is not next to the
    test files (their directory is on ``sys.path``) and not named like the project's package."""
    folder, _, name = path.rpartition("/")
    return name not in ("__init__.py", f"{package}.py") and not any(p.rpartition("/")[0] == folder for p in collected)


_LAYOUTS: OrderedDict[tuple[str, str], tuple] = OrderedDict()


def _generated_layout(task: Task) -> tuple[frozenset[str], tuple[tuple[str, str], ...], tuple[tuple[str, str | None], ...]]:
    """The generated project's Python paths, collected files with their contents (the hidden tests
    installed) and config files (cached per task)."""
    key = (task.id, task.files[task.metadata["bug_file"]])
    layout = _LAYOUTS.get(key)
    if layout is None:
        files = task.files | task.check.hidden_files
        layout = _LAYOUTS[key] = (
            frozenset(p for p in files if p.endswith(".py")),
            tuple((p, files[p]) for p in _collected(tuple(files))),
            tuple((n, files.get(n)) for n in _CONFIG_FILES),
        )
        if len(_LAYOUTS) > 1024:
            _LAYOUTS.popitem(last=False)
    return layout


def _collectable_name(name: str) -> bool:
    """pytest's default ``python_files`` (``test_*.py``, ``*_test.py``), and conftest files."""
    return name == "conftest.py" or (name.startswith("test_") and len(name) >= 8) or name.endswith("_test.py")


def _test_module(path: str, files: dict[str, str]) -> tuple[str, str]:
    """``(basedir, dotted module name)`` of a collected file: pytest's "prepend" mode puts the first
    directory above it without an ``__init__.py`` on ``sys.path`` and imports it from there."""
    parts = path.split("/")
    i = len(parts) - 1
    while i > 0 and "/".join(parts[:i]) + "/__init__.py" in files:
        i -= 1
    return "/".join(parts[:i]), ".".join(parts[i:])[: -len(".py")]


def _collection_errors(task: Task, files: dict[str, str], status: dict[str, str]) -> list[str]:
    """The collected files whose import certainly fails (each a collection error)."""
    broken = _raising_modules(task, files, status) if _as_generated(task, files) else None
    if broken is not None:  # the generated layout, each module's imports and names kept
        if not broken:
            return []
        reach = _reach(task)
        return sorted({task.metadata["sim"]["tests"][t]["file"] for t in reach if not reach[t].isdisjoint(broken)})
    collected = _collected(tuple(files))
    modules = {p: _test_module(p, files) for p in collected}
    roots = sorted({base for base, _ in modules.values()} - {""}, reverse=True) + [""]
    sources = {p: None if s == "broken" else task.files[p] if s == "ok" else files[p] for p, s in status.items()}
    generated = {p for p, s in status.items() if s == "ok"} | {p for p, c in _generated_layout(task)[1] if files.get(p) == c}
    importer = _Importer(files, sources, roots, generated)
    seen: set[str] = set()
    errors = []
    for path in collected:
        base, name = modules[path]
        duplicate = name in seen and not path.endswith("conftest.py")  # "import file mismatch"
        seen.add(name)
        if duplicate or importer.import_raises(name, 0, None, ""):
            errors.append(path)
    return errors


class _Importer:
    """Whether importing a module of the work dir certainly raises, from the files' static facts."""

    def __init__(self, files: dict[str, str], sources: dict[str, str | None], roots: list[str],
                 generated: set[str]) -> None:
        self.files, self.sources, self.roots = files, sources, roots
        self.generated = generated  # paths whose source is the generator's (imports fine by itself)
        self.raises: dict[str, bool] = {}
        self.names: dict[str, str] = {}  # path -> dotted module name it was imported as
        self._dirs: set[str] | None = None

    def is_dir(self, path: str) -> bool:
        if self._dirs is None:
            self._dirs = {"/".join(p.split("/")[:i]) for p in self.files for i in range(1, p.count("/") + 1)}
        return path in self._dirs

    def file_raises(self, path: str) -> bool:
        if path not in self.raises:
            self.raises[path] = False  # an import cycle meets a partly run module: not modelled
            source = self.sources.get(path, self.files.get(path))
            info = None if source is None else (_generated_info if path in self.generated else _file_info)(source)
            self.raises[path] = info is None or info.raises or any(
                self.import_raises(*imp, path) for imp in info.imports)
        return self.raises[path]

    def import_raises(self, module: str, level: int, names: tuple[str, ...] | None, importer: str) -> bool:
        """``import module`` (``names`` None) or ``from module import names`` run by ``importer``."""
        if level:
            package = self.names.get(importer, "").split(".")
            package = package if importer.endswith("__init__.py") else package[:-1]
            if level - 1 >= len(package) or not package[0]:
                return True  # no known parent package / beyond the top-level package
            module = ".".join(package[: len(package) - level + 1] + ([module] if module else []))
        found = self.find(module)
        if found is None:
            return True  # ModuleNotFoundError
        run, target = found
        if any(self.file_raises(f) for f in run):
            return True
        if names is None or not target:  # a plain import, or a module outside the work dir
            return False
        source = self.sources.get(target) or self.files[target]
        info = (_generated_info if target in self.generated else _file_info)(source) if target.endswith(".py") else None
        for name in names:
            if info is not None and (info.names is None or name in info.names or name in _MODULE_DUNDERS):
                continue
            sub = self.find(f"{module}.{name}")
            if sub is None or any(self.file_raises(f) for f in sub[0]):
                return True  # ImportError: cannot import name, or the submodule raises
        return False

    def find(self, module: str) -> tuple[list[str], str] | None:
        """``(files importing module runs, packages' __init__.py first; its file, or its directory
        for a namespace package, or "" for a module outside the work dir)``: the standard library
        and installed packages are assumed importable. None where it certainly does not exist."""
        parts = module.split(".")
        if parts[0] in sys.stdlib_module_names or parts[0] in sys.builtin_module_names:
            return [], ""
        bases = [f"{r}/{parts[0]}" if r else parts[0] for r in self.roots]
        run: list[str] = []
        target = ""
        for depth, part in enumerate(parts):
            if depth:
                bases = [f"{b}/{part}" for b in bases]
            hit = next((b for b in bases if f"{b}/__init__.py" in self.files or f"{b}.py" in self.files), None)
            if hit is not None:
                target = f"{hit}/__init__.py" if f"{hit}/__init__.py" in self.files else f"{hit}.py"
                self.names.setdefault(target, ".".join(parts[: depth + 1]))
                run.append(target)
                bases = [hit] if target.endswith("__init__.py") else []
            else:
                bases = [b for b in bases if self.is_dir(b)]
                if not bases:
                    return ([], "") if depth == 0 else None  # an unknown top-level name: maybe installed
                target = bases[0]  # a namespace package: no code
        return run, target


class _FileInfo:
    """What importing a source certainly does: raise on its own, import modules, bind names."""

    __slots__ = ("raises", "imports", "names")

    def __init__(self, raises: bool, imports: tuple, names: frozenset[str] | None) -> None:
        self.raises = raises  # its own top-level code certainly raises (compile errors included)
        self.imports = imports  # (module, level, from-names or None) of its unconditional imports
        self.names = names  # every name its top level may bind; None: any (star import, __getattr__...)


@lru_cache(maxsize=4096)
def _file_info(source: str) -> _FileInfo:
    try:
        tree = ast.parse(source)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(tree, "<sim>", "exec", dont_inherit=True)  # compiles only: `return` outside a function...
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return _FileInfo(True, (), frozenset())
    imports = tuple(
        imp for stmt in tree.body if isinstance(stmt, (ast.Import, ast.ImportFrom)) for imp in _import_requests(stmt))
    names = _module_names(tree)
    future = any(isinstance(s, ast.ImportFrom) and s.module == "__future__" and any(a.name == "annotations" for a in s.names)
                 for s in tree.body)
    return _FileInfo(_body_raises(tree.body, set(_MODULE_DUNDERS), names is None, future), imports, names)


@lru_cache(maxsize=4096)
def _generated_info(source: str) -> _FileInfo:
    """:func:`_file_info` of a generated file (top-level definitions, assignments and imports only,
    which import fine by themselves): parsed, not compiled or walked."""
    body = ast.parse(source).body
    imports = tuple(imp for stmt in body if isinstance(stmt, (ast.Import, ast.ImportFrom)) for imp in _import_requests(stmt))
    return _FileInfo(False, imports, frozenset(n for stmt in body for n in _bound_names(stmt)))


def _import_requests(stmt: ast.Import | ast.ImportFrom) -> list[tuple[str, int, tuple[str, ...] | None]]:
    if isinstance(stmt, ast.Import):
        return [(a.name, 0, None) for a in stmt.names]
    if stmt.module == "__future__":
        return []
    return [(stmt.module or "", stmt.level, tuple(a.name for a in stmt.names if a.name != "*"))]


def _module_names(tree: ast.Module) -> frozenset[str] | None:
    """Every name the module's top level may bind (a superset); None when it may bind any name."""
    names: set[str] = set()
    todo: list[tuple[ast.AST, bool]] = [(node, True) for node in tree.body]  # (node, runs at top level)
    while todo:
        node, top = todo.pop()
        if isinstance(node, ast.Global):
            names.update(node.names)
        elif isinstance(node, ast.Name):
            if node.id in _DYNAMIC:
                return None
            if top and not isinstance(node.ctx, ast.Load):
                names.add(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in _DYNAMIC:
            return None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(a.name == "*" for a in node.names):
                return None
            if top:
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif top and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif top and isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif top and isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        inner = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))
        todo.extend((child, inner) for child in ast.iter_child_nodes(node))
    return None if "__getattr__" in names else frozenset(names)


def _body_raises(body: list[ast.stmt], bound: set[str], any_name: bool, future: bool) -> bool:
    """Whether running these top-level (or class-body) statements certainly raises; binds names
    into ``bound`` as it goes. Imports are judged by the caller (they are resolved on the files)."""
    for stmt in body:
        if _stmt_raises(stmt, bound, any_name, future):
            return True
        if isinstance(stmt, ast.Delete):
            bound.difference_update(n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name))
        else:
            bound.update(_bound_names(stmt))
    return False


def _stmt_raises(stmt: ast.stmt, bound: set[str], any_name: bool, future: bool) -> bool:
    check = lambda *exprs: any(e is not None and _expr_raises(e, bound, any_name) for e in exprs)  # noqa: E731
    if isinstance(stmt, ast.Raise):
        return True
    if isinstance(stmt, (ast.Expr, ast.Assign)):
        return check(stmt.value)
    if isinstance(stmt, ast.AnnAssign):
        return check(stmt.value, None if future or not stmt.simple else stmt.annotation)
    if isinstance(stmt, ast.AugAssign):
        return check(stmt.value) or (isinstance(stmt.target, ast.Name) and not any_name and not _known(stmt.target.id, bound))
    if isinstance(stmt, ast.Delete):
        return not any_name and any(isinstance(t, ast.Name) and t.id not in bound for t in stmt.targets)
    if isinstance(stmt, ast.Assert):
        value = _value_or_unknown(stmt.test, bound)
        return check(stmt.test) or (value is not _UNKNOWN and not value)
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
        a = stmt.args
        annotations = [] if future else [x.annotation for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg)
                                         if x is not None] + [stmt.returns]
        return check(*stmt.decorator_list, *a.defaults, *a.kw_defaults, *annotations)
    if isinstance(stmt, ast.ClassDef):
        return (check(*stmt.decorator_list, *stmt.bases, *(k.value for k in stmt.keywords))
                or _body_raises(stmt.body, set(bound), any_name, future))
    if isinstance(stmt, ast.If):
        if _is_main_guard(stmt.test):
            return _body_raises(stmt.orelse, bound, any_name, future)
        value = _value_or_unknown(stmt.test, bound)
        if value is _UNKNOWN:
            return check(stmt.test)
        return _body_raises(stmt.body if value else stmt.orelse, bound, any_name, future)
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return check(stmt.iter)
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return check(stmt.items[0].context_expr)
    return False  # pass, imports, global, and compound statements the analysis does not follow


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"``: false when the module is imported."""
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__")


def _known(name: str, bound: set[str]) -> bool:
    return name in bound or hasattr(builtins, name)


def _value_or_unknown(node: ast.expr, bound: set[str]) -> object:
    try:
        return _eval(node, dict.fromkeys(bound, _UNKNOWN))
    except _Raises:
        return _UNKNOWN


def _expr_raises(node: ast.expr, bound: set[str], any_name: bool) -> bool:
    """Whether evaluating the expression certainly raises: the evaluator raises (a name error, a
    division by zero, a bad operand type...), or it loads an unbound name on a path always taken."""
    try:
        _eval(node, dict.fromkeys(bound, _UNKNOWN))
    except _Raises as exc:
        return not (any_name and str(exc) == "NameError")
    if any_name or any(isinstance(n, ast.NamedExpr) for n in ast.walk(node)):
        return False
    return _unbound_load(node, bound)


def _unbound_load(node: ast.AST, bound: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return isinstance(node.ctx, ast.Load) and not _known(node.id, bound)
    if isinstance(node, ast.Lambda):
        children: list = [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
    elif isinstance(node, ast.BoolOp):
        children = node.values[:1]
    elif isinstance(node, ast.IfExp):
        children = [node.test]
    elif isinstance(node, ast.Compare):
        children = [node.left, node.comparators[0]]
    elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        children = [node.generators[0].iter]
    else:
        children = list(ast.iter_child_nodes(node))
    return any(_unbound_load(c, bound) for c in children)
