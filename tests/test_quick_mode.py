"""The quick test mode's list (tests/quick.txt) covers every test package and names only tests that exist."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "tests" / "quick.txt"


def _lines() -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in QUICK.read_text().splitlines())
    return [line for line in lines if line]


def quick_entries() -> list[str]:
    """The pytest paths and node ids the quick mode runs."""
    return [line for line in _lines() if not line.startswith("-")]


def left_out() -> dict[str, str]:
    """Test packages the quick mode leaves out on purpose (``- tests/PACKAGE: why``), with the reason."""
    out = {}
    for line in _lines():
        if line.startswith("-"):
            package, _, why = line[1:].partition(":")
            out[Path(package.strip()).name] = why.strip()
    return out


def test_every_test_package_has_quick_tests_or_a_reason():
    packages = {p.parent.name for p in (ROOT / "tests").glob("*/test_*.py")}
    listed = {Path(e.split("::")[0]).parent.name for e in quick_entries()}
    assert all(left_out().values()), "a package left out of the quick mode needs its reason"
    assert packages - listed - set(left_out()) == set(), f"test packages without a quick test in {QUICK.name}"
    assert "tests" in listed  # the top-level checks too


def test_every_entry_exists_and_is_listed_once():
    entries = quick_entries()
    assert len(entries) == len(set(entries))
    for entry in entries:
        path, _, name = entry.partition("::")
        assert (ROOT / path).is_file(), entry
        assert not name or f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), entry

