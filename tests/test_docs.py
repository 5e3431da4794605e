"""The README stays a front page, the docs index links every page, and relative links resolve."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # code blocks hold no links
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]  # relative ones only


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    for line in page.read_text().splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            found.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return found


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move detail into docs/"
    # the two commands a new user runs come first, unchanged
    assert lines[3].startswith("bash scripts/setup.sh && .venv/bin/compactrl train ")
    assert lines[4].startswith("bash scripts/test.sh ")
    text = "\n".join(lines)
    for target in ("docs/README.md", "docs/task_formats.md", "docs/policies.md", "docs/testing.md"):
        assert f"]({target})" in text, target
    assert "bash scripts/test.sh --quick" in text


def test_the_docs_index_links_every_page():
    linked = {Path(t.split("#")[0]).name for t in _links(DOCS / "README.md")}
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert pages - linked == set(), "pages missing from docs/README.md"


def test_relative_links_resolve():
    """Every relative link of the README and the docs names an existing file, and a heading where
    it names an anchor in a markdown page."""
    broken = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in _links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
