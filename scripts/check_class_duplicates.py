"""Fail when a class or module body defines the same name twice (the later one silently wins).

    python scripts/check_class_duplicates.py [PATH ...]    (default: compactrl tests benchmarks examples scripts)

Ruff's F811 (redefined-while-unused) does not catch this for private names: it skips every name that
matches ``dummy-variable-rgx``, whose default ``^(_+|(_+[a-zA-Z0-9_]*[a-zA-Z0-9]+?))$`` matches any
name with a leading underscore, so a second ``def _round`` in a class passes. Narrowing that regex
would instead flag every intentionally unused ``_name`` loop variable (B007), hence this check.

A definition is a ``def``, ``async def``, ``class`` or annotated field (``x: int = 0``) directly in
the body. Not duplicates: property accessors (``@x.setter``), ``@overload`` stubs, the conventional
``_`` (singledispatch ``register``), and definitions under ``if``/``try`` (alternatives).
Exit status 1 with one ``path:line`` line per duplicate, 0 when there is none.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

DEFAULT_PATHS = ("compactrl", "tests", "benchmarks", "examples", "scripts")


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(target)


def _is_redefinition_by_design(node: ast.stmt) -> bool:
    decorators = [_decorator_name(d) for d in getattr(node, "decorator_list", [])]
    return any(d.endswith((".setter", ".getter", ".deleter", "overload")) for d in decorators)


def _defined_name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def _duplicates_in_body(body: list[ast.stmt], scope: str) -> Iterator[tuple[int, str, int]]:
    """(line, qualified name, first line) for each name defined again in ``body``."""
    first: dict[str, int] = {}
    for node in body:
        name = _defined_name(node)
        if name is not None and name != "_" and not _is_redefinition_by_design(node):
            if name in first:
                yield node.lineno, f"{scope}{name}", first[name]
            else:
                first[name] = node.lineno
        if isinstance(node, ast.ClassDef):
            yield from _duplicates_in_body(node.body, f"{scope}{node.name}.")


def check_file(path: Path) -> list[str]:
    """One ``path:line: ...`` message per duplicate definition in the file at ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path}:{line}: {name!r} is defined again (first at line {first}); the earlier one is dead code"
            for line, name, first in _duplicates_in_body(tree.body, "")]


def _python_files(paths: list[str]) -> Iterator[Path]:
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(f for f in p.rglob("*.py") if ".venv" not in f.parts)
        elif p.exists():
            yield p
        else:
            raise SystemExit(f"check_class_duplicates: no such file or directory: {p}")


def main(argv: list[str]) -> int:
    messages = [m for f in _python_files(argv or list(DEFAULT_PATHS)) for m in check_file(f)]
    for m in messages:
        sys.stderr.write(m + "\n")
    return 1 if messages else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
