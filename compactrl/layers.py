"""The layers of compactrl, declared once: which package may import which (``tests/test_layers.py`` enforces
it), and the import-graph report behind docs/overview.md (``python -m compactrl.layers``).

Layers run bottom to top; a module may import its own layer and the layers below it, never one above.
The folder names are the layers::

    core         compactrl/{types,task,tools,tokenizer,provenance,cli_options,layers,lazy}.py
    shell_sim    compactrl/shell_sim/     a bash interpreter; a leaf: imports nothing of compactrl
    sandbox      compactrl/sandbox/       sim, local, docker: start what a Task's runtime asks for
    tasksets     compactrl/tasksets/      generators, SWE-bench, Terminal-Bench: load, prepare, validate
    envs         compactrl/envs/          the Gymnasium envs (tool use over a sandbox)
    wrappers     compactrl/wrappers/      ContextBudget; the Gymnasium ids (registration, ``import compactrl``)
    policies     compactrl/policies/      the sampling contract, Hugging Face models, critic, scripted/
    serving      compactrl/serving/       the OpenAI-compatible server, the vLLM engine
    collectors   compactrl/collectors/    the trace collector, its episodes, trace batches
    rollouts     compactrl/distributed/, compactrl/gateway/   Ray rollouts; black-box agents
    eval         compactrl/eval/          evaluation and task-set validation
    algos        compactrl/algos/         the maths: GAE, tree GAE, losses, packing
    training     compactrl/training/      the loop, its config tree, run directories, rollout sources
    entry        compactrl/{cli,cli_tasks,bench}.py, compactrl/testing/

The graph is built statically with :mod:`ast`, nothing imported. An edge ``a -> b`` is an import
statement in ``a`` naming module ``b`` (``import b``, ``from b import x``, ``b.x`` when ``x`` is a
submodule, relative imports), wherever the statement sits: a function-level import is a dependency
too, and so is a module named in a package's lazy ``_EXPORTS`` table (:mod:`compactrl.lazy`). Imports
under ``if TYPE_CHECKING:`` do not count; they never run. The implicit imports of parent
packages are left out.
"""

from __future__ import annotations

import ast
import collections
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent

#: bottom to top: (layer, the modules it holds, by dotted prefix; "compactrl" alone is the root package)
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("compactrl.types", "compactrl.task", "compactrl.tools", "compactrl.tokenizer",
              "compactrl.provenance", "compactrl.cli_options", "compactrl.layers", "compactrl.lazy")),
    ("shell_sim", ("compactrl.shell_sim",)),
    ("sandbox", ("compactrl.sandbox",)),
    ("tasksets", ("compactrl.tasksets",)),
    ("envs", ("compactrl.envs",)),
    ("wrappers", ("compactrl.wrappers", "compactrl.registration", "compactrl")),
    ("policies", ("compactrl.policies",)),
    ("serving", ("compactrl.serving",)),
    ("collectors", ("compactrl.collectors",)),
    ("rollouts", ("compactrl.distributed", "compactrl.gateway")),
    ("eval", ("compactrl.eval",)),
    ("algos", ("compactrl.algos",)),
    ("training", ("compactrl.training",)),
    ("entry", ("compactrl.cli", "compactrl.cli_tasks", "compactrl.bench", "compactrl.testing")),
)

#: packages that import nothing of compactrl outside themselves (libraries that happen to live here)
LEAVES: tuple[str, ...] = ("compactrl.shell_sim", "compactrl.tasksets.generators.terminal_check")


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (its longest matching prefix)."""
    best, found = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            hit = module == prefix or (prefix != "compactrl" and module.startswith(prefix + "."))
            if hit and len(prefix) > best:
                best, found = len(prefix), index
    if found is None:
        raise KeyError(f"{module}: in no layer of compactrl.layers.LAYERS; add it to one")
    return found


# ------------------------------------------------------------------------------------------ the graph
def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package is its ``__init__``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@dataclass(frozen=True)
class Import:
    """One imported name: ``source`` the module named, ``name`` what was taken from it (None for
    ``import source``), at ``line``."""

    source: str
    name: str | None
    line: int


def _statements(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and _type_checking(child):
            for other in child.orelse:
                yield from _statements_of(other)
            continue
        yield from _statements_of(child)


def _statements_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    yield from _statements(node)


def raw_imports(name: str, path: Path) -> list[Import]:
    """Every import statement of module ``name`` (at ``path``), relative ones resolved."""
    is_package = path.name == "__init__.py"
    out = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:  # a package's lazy exports, {name: "module"}, are imports run on first use
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            out += [Import(v.value, None, v.lineno) for v in node.value.values
                    if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    for node in _statements(tree):
        if isinstance(node, ast.Import):
            out += [Import(alias.name, None, node.lineno) for alias in node.names]
            continue
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        out += [Import(source, alias.name, node.lineno) for alias in node.names]
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> dict[str, int]:
    """The package's modules that ``name`` imports, each with the line of its first import."""
    found: dict[str, int] = {}
    for imp in raw_imports(name, path):
        if imp.name is not None and f"{imp.source}.{imp.name}" in known:
            target = f"{imp.source}.{imp.name}"
        elif imp.source in known:
            target = imp.source
        else:
            continue
        if target != name:
            found.setdefault(target, imp.line)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    known = modules(package)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def upward_imports(graph: dict[str, dict[str, int]]) -> list[tuple[str, str, int]]:
    """Edges that run up :data:`LAYERS`, or out of a :data:`LEAVES` package: (importer, imported, line)."""
    out = []
    for a, targets in sorted(graph.items()):
        leaf = next((p for p in LEAVES if a == p or a.startswith(p + ".")), None)
        for b, line in sorted(targets.items()):
            if leaf is not None and not (b == leaf or b.startswith(leaf + ".")):
                out.append((a, b, line))
            elif leaf is None and layer_of(b) > layer_of(a):
                out.append((a, b, line))
    return out


def _package_of(module: str, known: dict[str, Path]) -> str:
    return module if known[module].name == "__init__.py" else module.rpartition(".")[0]


def private_imports(package: Path = PACKAGE, *, siblings: bool = False) -> list[tuple[str, str, int]]:
    """Private names (``_x``) or private modules imported from outside the package that owns them:
    (importer, ``module.name``, line). Siblings in one package may share private names; with
    ``siblings=True`` their imports are listed too (every private name imported across modules)."""
    known = modules(package)
    out = []
    for name, path in known.items():
        for imp in raw_imports(name, path):
            if not imp.source.startswith("compactrl"):
                continue
            target = f"{imp.source}.{imp.name}" if imp.name else imp.source
            module = target if target in known else imp.source
            if module not in known or module == name:
                continue
            owner = _package_of(module, known)
            private = [p for p in target.split(".")[1:] if p.startswith("_") and not p.startswith("__")]
            inside = name == owner or name.startswith(owner + ".")
            if private and (siblings or not inside):
                out.append((name, target, imp.line))
    return sorted(set(out))


# --------------------------------------------------------------------------------- metadata keys
def _metadata_keys(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(keys read, keys written) of ``Task.metadata`` dictionaries in one module, as far as a static
    reading can tell: ``x.metadata["k"]``, ``x.metadata.get("k")``, through a local alias
    (``meta = task.metadata``), and ``metadata={"k": ...}`` or ``{**x.metadata, "k": ...}`` when built."""
    aliases = {"metadata"}
    built = set()  # names passed as metadata=NAME: the dictionaries assigned to them are written keys
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr == "metadata":
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.keyword) and node.arg == "metadata" and isinstance(node.value, ast.Name):
            built.add(node.value.id)
    aliases |= built

    def is_meta(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "metadata") or (
            isinstance(node, ast.Name) and node.id in aliases)

    read, written = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_meta(node.value) and isinstance(node.slice, ast.Constant):
            (written if isinstance(node.ctx, ast.Store) else read).add(str(node.slice.value))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop")
              and is_meta(node.func.value) and node.args and isinstance(node.args[0], ast.Constant)):
            read.add(str(node.args[0].value))
        elif isinstance(node, ast.keyword) and node.arg == "metadata" and isinstance(node.value, ast.Dict):
            written |= {str(k.value) for k in node.value.keys if isinstance(k, ast.Constant)}
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
              and any(isinstance(t, ast.Name) and t.id in built for t in node.targets)):
            written |= {str(k.value) for k in node.value.keys if isinstance(k, ast.Constant)}
        elif isinstance(node, ast.Dict) and any(k is None and is_meta(v) for k, v in zip(node.keys, node.values)):
            written |= {str(k.value) for k in node.keys if isinstance(k, ast.Constant)}
    return read, written


def metadata_keys(package: Path = PACKAGE) -> dict[str, dict[str, set[str]]]:
    """Per ``Task.metadata`` key: the modules that read it and those that write it."""
    table: dict[str, dict[str, set[str]]] = collections.defaultdict(lambda: {"read": set(), "written": set()})
    for name, path in modules(package).items():
        read, written = _metadata_keys(ast.parse(path.read_text()))
        for key in read:
            table[key]["read"].add(name)
        for key in written:
            table[key]["written"].add(name)
    return dict(table)


def _writer_package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[1] == "tasksets" else ".".join(parts[:2])


def foreign_metadata_reads(package: Path = PACKAGE) -> dict[str, list[str]]:
    """Keys read by a module outside every package that writes them: key -> the reading modules."""
    out = {}
    for key, who in sorted(metadata_keys(package).items()):
        writers = {_writer_package(m) for m in who["written"]}
        foreign = sorted(m for m in who["read"] if not any(m == w or m.startswith(w + ".") for w in writers))
        if foreign:
            out[key] = foreign
    return out


# ------------------------------------------------------------------------------------------ report
def report(package: Path = PACKAGE) -> str:
    """The figures docs/overview.md quotes, as markdown."""
    graph = import_graph(package)
    lines_of_code = sum(len(p.read_text().splitlines()) for p in modules(package).values())
    up = upward_imports(graph)
    private = private_imports(package)
    keys = metadata_keys(package)
    foreign = foreign_metadata_reads(package)
    out = [f"- modules: {len(graph)} ({lines_of_code} lines), imports between them: "
           f"{sum(len(t) for t in graph.values())}",
           f"- imports running up the layers: {len(up)}",
           *[f"  - {a} -> {b} (line {line})" for a, b, line in up],
           f"- private names imported across modules: {len(private_imports(package, siblings=True))}; "
           f"from outside their package: {len(private)}",
           *[f"  - {a}: {b} (line {line})" for a, b, line in private],
           f"- `Task.metadata` keys: {len(keys)}; read outside the package that writes them: {len(foreign)}",
           *[f"  - `{k}`: {', '.join(m.replace('compactrl.', '') for m in v)}" for k, v in foreign.items()]]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    root = Path(argv[0]).resolve() if argv else PACKAGE
    print(report(root))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
