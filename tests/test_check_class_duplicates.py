"""scripts/check_class_duplicates.py: a name defined twice in a class or module body fails the check."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_class_duplicates.py"


def _check(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    path = tmp_path / "mod.py"
    path.write_text(textwrap.dedent(source))
    return subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("source", "name", "line", "first"),
    [
        # the case ruff's F811 lets through: a private method (dummy-variable-rgx matches `_round`)
        ("class C:\n    def _round(self):\n        return 1\n\n    def _round(self):\n        return 2\n",
         "C._round", 5, 2),
        ("class C:\n    x: int = 0\n    y: int = 1\n    x: int = 2\n", "C.x", 4, 2),
        ("class Outer:\n    class Inner:\n        async def go(self): ...\n        async def go(self): ...\n",
         "Outer.Inner.go", 4, 3),
        ("def _helper():\n    pass\n\n\ndef _helper():\n    pass\n", "_helper", 5, 1),
    ],
)
def test_a_duplicate_definition_fails_and_names_both_lines(tmp_path, source, name, line, first):
    res = _check(tmp_path, source)
    assert res.returncode == 1, res.stderr
    assert f"mod.py:{line}: {name!r} is defined again (first at line {first})" in res.stderr


def test_redefinitions_by_design_pass(tmp_path):
    res = _check(tmp_path, """
        import functools
        from typing import overload


        class C:
            @property
            def x(self):
                return self._x

            @x.setter
            def x(self, value):
                self._x = value

            @overload
            def f(self, a: int) -> int: ...
            @overload
            def f(self, a: str) -> str: ...
            def f(self, a):
                return a

            if True:
                def g(self):
                    return 1
            else:
                def g(self):
                    return 2


        @functools.singledispatch
        def show(x):
            return x


        @show.register
        def _(x: int):
            return x


        @show.register
        def _(x: str):
            return x
    """)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""


def test_a_missing_path_is_an_error_not_a_pass(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "nope.py")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode != 0 and "no such file" in res.stderr
