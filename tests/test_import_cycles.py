"""No import cycle among compactrl's modules: each module imports only modules below it.

The graph is :func:`compactrl.layers.import_graph`: built statically from the source with ``ast``, one node per
module (a package is its ``__init__``). An edge ``a -> b`` is an import statement in ``a`` that names
``b``: ``import b``, ``from b import x`` (``b.x`` when ``x`` is a submodule) and relative imports.

Function-level imports count. A deferred import only postpones a cycle to the first call: the
two modules still need each other to be understood or tested, and which one loads first then
depends on the caller. So a dependency is a dependency wherever the statement sits. Imports under
``if TYPE_CHECKING:`` do not count: they never run, and exist for annotations only.

Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``; those implicit edges to parent
packages are left out, or every package whose ``__init__`` re-exports its modules would be a
cycle. A module that imports its own package's ``__init__`` by name still counts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from compactrl.layers import import_graph

ROOT = Path(__file__).resolve().parents[1]


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    edges = [f"  {a} -> {b} (line {graph[a][b]})" for a in component for b in sorted(graph[a]) if b in component]
    return "cycle among " + ", ".join(component) + ":\n" + "\n".join(edges)


def test_no_import_cycle_among_compactrl_modules():
    graph = import_graph(ROOT / "compactrl")
    assert len(graph) > 50 and "compactrl.shell_sim.shell" in graph
    found = cycles(graph)
    assert not found, "\n".join(_describe(c, graph) for c in found)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / "pkg" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / rel).write_text(text)
    return tmp_path / "pkg"


@pytest.mark.parametrize("files, expected", [
    # a top-level cycle
    ({"__init__.py": "", "a.py": "import pkg.b\n", "b.py": "from pkg import a\n"}, [["pkg.a", "pkg.b"]]),
    # a function-level import closes a cycle too
    ({"__init__.py": "", "a.py": "from pkg.b import x\n",
      "b.py": "x = 1\ndef f():\n    from pkg.a import y\n"}, [["pkg.a", "pkg.b"]]),
    # relative imports, three modules
    ({"__init__.py": "", "a.py": "from .b import x\n", "b.py": "from . import c\n", "c.py": "from .a import z\n"},
     [["pkg.a", "pkg.b", "pkg.c"]]),
    # a module importing its own package's __init__, which imports it
    ({"__init__.py": "from pkg.a import f\n", "a.py": "from pkg import g\n"}, [["pkg", "pkg.a"]]),
    # TYPE_CHECKING-only imports do not count, their else branch does
    ({"__init__.py": "", "a.py": "from pkg.b import x\n",
      "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import y\n"}, []),
    ({"__init__.py": "", "a.py": "from pkg.b import x\n",
      "b.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    from pkg.a import y\n"},
     [["pkg.a", "pkg.b"]]),
    # importing downward through a package's __init__ is not a cycle
    ({"__init__.py": "from pkg.sub.a import f\n", "sub/__init__.py": "", "sub/a.py": "from pkg.sub import b\n",
      "sub/b.py": "x = 1\n"}, []),
])
def test_the_checker_finds_cycles_and_only_cycles(tmp_path, files, expected):
    assert cycles(import_graph(_package(tmp_path, files))) == expected
