"""The layering in :mod:`compactrl.layers` holds: every module has a layer, no import runs up the layers
(function-level imports included), leaf libraries import nothing of compactrl, and private names stay in
the package that owns them. docs/overview.md shows the same map."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from compactrl import layers

ROOT = Path(__file__).resolve().parents[1]



def test_every_module_has_a_layer():
    graph = layers.import_graph()
    assert len(graph) > 100 and "compactrl.shell_sim.shell" in graph
    for name in graph:
        layers.layer_of(name)  # raises KeyError naming a module in no layer


def test_no_import_runs_up_the_layers():
    assert layers.upward_imports(layers.import_graph()) == [], "imports running up compactrl.layers.LAYERS"


def test_private_names_stay_in_their_package():
    assert layers.private_imports() == [], "private names imported from outside their package"


def test_the_overview_shows_the_declared_layers():
    text = (ROOT / "docs" / "overview.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [m.group(1) for line in section.splitlines() if (m := re.match(r"\| `(\w+)` \| `", line))]
    assert rows == [name for name, _ in reversed(layers.LAYERS)]


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / "compactrl" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "compactrl" / rel).write_text(text)
    return tmp_path / "compactrl"


@pytest.mark.parametrize("files, expected", [
    # a function-level import from a lower layer to a higher one
    ({"__init__.py": "", "types.py": "def f():\n    from compactrl.training import x\n", "training/__init__.py": ""},
     [("compactrl.types", "compactrl.training", 2)]),
    # downward and same-layer imports are fine; TYPE_CHECKING-only ones never run
    ({"__init__.py": "", "types.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import compactrl.training\n",
      "training/__init__.py": "from compactrl import types\n", "training/a.py": "from compactrl.training import b\n",
      "training/b.py": ""}, []),
    # a name in a package's lazy export table is an import too
    ({"__init__.py": "", "types.py": "_EXPORTS = {\"X\": \"compactrl.training\"}\n", "training/__init__.py": ""},
     [("compactrl.types", "compactrl.training", 1)]),
    # a leaf library may import only itself
    ({"__init__.py": "", "types.py": "", "shell_sim/__init__.py": "from compactrl.types import x\n"},
     [("compactrl.shell_sim", "compactrl.types", 1)]),
])
def test_the_checker_finds_upward_imports_and_only_those(tmp_path, files, expected):
    assert layers.upward_imports(layers.import_graph(_package(tmp_path, files))) == expected


def test_the_checker_finds_private_names_across_packages(tmp_path):
    package = _package(tmp_path, {
        "__init__.py": "", "sandbox/__init__.py": "", "sandbox/_shell.py": "X = 1\n",
        "sandbox/local.py": "from compactrl.sandbox._shell import X\nfrom compactrl.sandbox.base import _y\n",
        "sandbox/base.py": "_y = 1\n",
        "tasksets/__init__.py": "", "tasksets/a.py": "from compactrl.sandbox import _shell\nfrom compactrl.sandbox.base import _y\n"})
    assert [(a, b) for a, b, _ in layers.private_imports(package)] == [
        ("compactrl.tasksets.a", "compactrl.sandbox._shell"), ("compactrl.tasksets.a", "compactrl.sandbox.base._y")]
