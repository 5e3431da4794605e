"""The public API is listed in one place, docs/api.md: one row per module, its ``__all__``. Every layer's
package is there, the page and each module's ``__all__`` agree, and every listed name resolves."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from compactrl import layers

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| `(compactrl[\w.]*)` \| (.*?) \|")


def listed() -> dict[str, list[str]]:
    rows = {}
    for line in (ROOT / "docs" / "api.md").read_text().splitlines():
        if m := ROW.match(line):
            rows[m.group(1)] = re.findall(r"`([^`]+)`", m.group(2))
    return rows


def test_every_layer_package_is_listed():
    packages = {prefix for _, prefixes in layers.LAYERS for prefix in prefixes
                if (ROOT / prefix.replace(".", "/") / "__init__.py").exists() and prefix not in ("compactrl", "compactrl.testing")}
    assert packages - set(listed()) == set()


def test_the_page_and_each_modules_all_agree_and_resolve():
    for name, names in listed().items():
        module = importlib.import_module(name)
        assert sorted(names) == sorted(module.__all__), name
        for attr in names:
            assert getattr(module, attr) is not None, f"{name}.{attr}"


def test_no_public_name_shadows_a_submodule():
    # `from package import name` would give the function or the module depending on what was imported before
    for name in listed():
        path = ROOT / name.replace(".", "/")
        if (path / "__init__.py").exists():
            submodules = {p.stem for p in path.glob("*.py")} | {p.name for p in path.iterdir() if (p / "__init__.py").exists()}
            assert set(importlib.import_module(name).__all__) & submodules == set(), name
