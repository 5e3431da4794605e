"""Which graded tests of a SWE-bench row reach a host other than this machine (read from their source).

The harness grades in a container with a network; the sandbox has none, so a required test that
fetches from a remote host (requests' old suites call httpbin.org, its ``TestTimeout`` connects to the
blackhole 10.255.255.1) fails here for a reason the row does not name. Such a row is flagged before
any episode, as Terminal-Bench tasks whose tests fetch at test time are.

The rule, per test file the row grades (its text after ``test_patch``), with Python's own parser:

* a *remote literal* is a string holding a URL (``http(s)``, ``ftp``, ``ws(s)``) or a bare IPv4
  address whose host is not this machine's loopback (``localhost``, ``127.*``, ``0.0.0.0``, ``::1``);
* a module-level statement holding a remote literal taints the names it binds and the identifier-like
  strings in it (``os.environ['HTTPBIN_URL'] = 'http://httpbin.org/'`` taints ``HTTPBIN_URL``); a
  module-level assignment or helper function that uses a tainted name or string is tainted too
  (``HTTPBIN_URL = os.environ.get('HTTPBIN_URL')``, ``def httpbin(*s)``, ``SERVICES = (httpbin,)``),
  up to a fixed point; test functions and classes taint nothing;
* a required test reaches a remote host when its body (or a method of its class it calls on
  ``self``, or a tainted module helper it calls) makes a call that opens a connection (``get``,
  ``post``, ``request``, ``send``, ``urlopen``, ``create_connection``, ``connect``...) with an
  argument that names a remote host: a remote literal, a tainted name the test does not shadow with a
  parameter (pytest-httpbin's ``httpbin`` fixture is a local server), or a local name assigned from
  one (``req = Request('GET', httpbin('get'))`` ... ``s.send(req.prepare())``). ``header.get(key)``
  beside a URL in a header value is not a connection.

A file that does not parse (Python 2 syntax) is read as one statement: any remote literal and
connecting call in it flag the test ids found in its text. What the rule cannot see (a library
function that downloads with a default URL, a fixture in another package) is not flagged.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping

_URL = re.compile(r"\b(?:https?|ftp|wss?)://(\[[0-9A-Fa-f:]+\]|[A-Za-z0-9_.-]+)")
_IPV4 = re.compile(r"^(\d{1,3}(?:\.\d{1,3}){3})(?::\d+)?$")
_LOOPBACK = re.compile(r"^(?:localhost|127(?:\.\d{1,3}){3}|0\.0\.0\.0|\[?::1\]?|\[?::\]?)$", re.IGNORECASE)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONNECTING_CALLS = frozenset({
    "get", "post", "put", "patch", "delete", "head", "options", "request", "send", "urlopen", "urlretrieve",
    "create_connection", "connect", "connect_ex", "getaddrinfo", "gethostbyname", "HTTPConnection",
    "HTTPSConnection", "urlopen_with_retry", "download_file",
})
"""Names of calls that open a connection (a method or a function of that name)."""


def remote_host(text: str) -> str | None:
    """The first host other than loopback that ``text`` names as a URL or is as a bare IPv4 address."""
    for m in _URL.finditer(text):
        host = m.group(1).strip("[]").rstrip(".")
        if host and not _LOOPBACK.match(host):
            return host
    m = _IPV4.match(text.strip())
    if m and not _LOOPBACK.match(m.group(1)):
        return m.group(1)
    return None


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _bound(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets = [node.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _is_test(node: ast.stmt) -> bool:
    return isinstance(node, ast.ClassDef) or (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                                              and node.name.startswith("test"))


def tainted_names(tree: ast.Module) -> dict[str, str]:
    """Module-level names (and identifier-like strings) that stand for a remote host -> the host."""
    statements = [s for s in tree.body if not _is_test(s)]
    tainted: dict[str, str] = {}
    for s in statements:
        host = next(filter(None, map(remote_host, _strings(s))), None)
        if host:
            for name in _bound(s) | {t for t in _strings(s) if _IDENT.match(t)}:
                tainted.setdefault(name, host)
    changed = True
    while changed:
        changed = False
        for s in statements:
            uses = _names(s) | set(_strings(s))
            hit = next((tainted[u] for u in sorted(uses) if u in tainted), None)
            for name in _bound(s) if hit else ():
                if name not in tainted:
                    tainted[name], changed = hit, True
    return tainted


def _self_calls(node: ast.AST) -> set[str]:
    return {n.func.attr for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id in ("self", "cls")}


def _params(fn: ast.AST) -> set[str]:
    a = fn.args  # type: ignore[attr-defined]
    return {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]}


def _functions(tree: ast.Module) -> dict[str, list[tuple[ast.AST, ast.ClassDef | None]]]:
    """Every function of the module by name, with the class it is a method of (None at module level)."""
    out: dict[str, list[tuple[ast.AST, ast.ClassDef | None]]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(node.name, []).append((node, None))
        elif isinstance(node, ast.ClassDef):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.setdefault(sub.name, []).append((sub, node))
    return out


def _mentions(expr: ast.AST, tainted: Mapping[str, str], local: Mapping[str, str], shadow: set[str]) -> str | None:
    """The remote host ``expr`` names: a remote literal in it, or a tainted name not shadowed."""
    host = next(filter(None, map(remote_host, _strings(expr))), None)
    if host:
        return host
    for name in sorted(_names(expr)):
        if name in local:
            return local[name]
        if name in tainted and name not in shadow:
            return tainted[name]
    return None


def _connects(fn: ast.AST, tainted: Mapping[str, str], module_fns: Mapping[str, ast.AST], depth: int = 1) -> str | None:
    """The remote host a connecting call in ``fn`` is given (an argument that names it, directly or
    through a local name assigned from one), or a tainted module helper called that connects."""
    shadow = _params(fn)
    local: dict[str, str] = {}
    for _ in range(3):  # assignments in any order: a few passes reach the fixed point of real tests
        for n in ast.walk(fn):
            value = getattr(n, "value", None) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) \
                else n.iter if isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)) else None
            if value is None:
                continue
            host = _mentions(value, tainted, local, shadow)
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]  # type: ignore[union-attr]
            for name in (_names(t) for t in targets) if host else ():
                for x in name:
                    local.setdefault(x, host)  # type: ignore[arg-type]
    for n in ast.walk(fn):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        args = [*n.args, *(k.value for k in n.keywords)]
        if name in CONNECTING_CALLS:
            host = next(filter(None, (_mentions(a, tainted, local, shadow) for a in args)), None)
            if host:
                return host
        elif depth and name in module_fns and name in tainted and name not in shadow:
            host = _connects(module_fns[name], tainted, module_fns, depth - 1)
            if host:
                return host
    return None


def _reach(fn: ast.AST, cls: ast.ClassDef | None, tree: ast.Module, tainted: Mapping[str, str]) -> str | None:
    """The remote host ``fn`` (or a method of its class it calls on ``self``) connects to, or None."""
    module_fns = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    methods = {n.name: n for n in (cls.body if cls else []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    bodies = [fn] + [methods[m] for m in sorted(_self_calls(fn)) if m in methods and m != getattr(fn, "name", "")]
    return next(filter(None, (_connects(b, tainted, module_fns) for b in bodies)), None)


def function_of(test_id: str) -> str:
    """The function a test id names: ``a.py::Cls::test_x[p]`` -> ``test_x``, django's ``test_x (m.Cls)``
    -> ``test_x``, sympy's ``test_x`` as it is."""
    name = test_id.split("::")[-1] if "::" in test_id else test_id.split(" (")[0]
    return name.split("[")[0].strip()


def network_tests(files: Mapping[str, str], tests: Iterable[str]) -> list[tuple[str, str, str]]:
    """``(test id, file, host)`` of each of ``tests`` that reaches a remote host, per the rule above;
    ``files``: the graded test files' text (path -> source)."""
    found: list[tuple[str, str, str]] = []
    tests = list(tests)
    for path, source in sorted(files.items()):
        if not path.endswith(".py"):
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):  # Python 2 only: the whole file as one statement
            host = remote_host(source) or next(filter(None, map(remote_host, re.findall(r"['\"]([^'\"\n]+)['\"]", source))), None)
            calls = set(re.findall(r"\b(\w+)\s*\(", source))
            if host and calls & CONNECTING_CALLS:
                found += [(t, path, host) for t in tests if re.search(rf"def {re.escape(function_of(t))}\b", source)]
            continue
        tainted, functions = tainted_names(tree), _functions(tree)
        for t in tests:
            if "::" in t and not path.endswith(t.split("::")[0]) and not t.split("::")[0].endswith(path):
                continue
            for fn, cls in functions.get(function_of(t), []):
                host = _reach(fn, cls, tree, tainted)
                if host:
                    found.append((t, path, host))
                    break
    return found


def network_reason(files: Mapping[str, str], tests: Iterable[str]) -> str | None:
    """``needs network at test time: ...`` naming the first required test that reaches a remote host,
    the host and how many required tests do; None when none does."""
    hits = network_tests(files, tests)
    if not hits:
        return None
    test, path, host = hits[0]
    more = f" (and {len(hits) - 1} more required test{'s' if len(hits) > 2 else ''})" if len(hits) > 1 else ""
    return (f"needs network at test time: {test}{more} reaches {host} (read from {path}); the sandbox has no "
            "network, so the test would fail for a reason the row does not name")
