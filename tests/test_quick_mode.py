"""The quick test mode's list (tests/quick.txt) covers every test package and names only tests that exist."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "tests" / "quick.txt"


def quick_entries() -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in QUICK.read_text().splitlines())
    return [line for line in lines if line]


def test_every_test_package_has_quick_tests():
    packages = {p.parent.name for p in (ROOT / "tests").glob("*/test_*.py")} - {"gpu"}  # no GPU in the quick mode
    listed = {Path(e.split("::")[0]).parent.name for e in quick_entries()}
    assert packages - listed == set(), f"test packages without a quick test in {QUICK.name}"
    assert "tests" in listed  # the top-level checks too


def test_every_entry_exists_and_is_listed_once():
    entries = quick_entries()
    assert len(entries) == len(set(entries))
    for entry in entries:
        path, _, name = entry.partition("::")
        assert (ROOT / path).is_file(), entry
        assert not name or f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), entry

