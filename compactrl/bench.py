"""``compactrl bench NAME [ARGS...]``: run one of the repository's ``benchmarks/*.py`` scripts.

Benchmarks live in the source tree (they are not installed with the package), so this subcommand
looks for ``benchmarks/`` next to the installed package (an editable install) or in the current
directory.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path


def _benchmark_dir() -> Path:
    for root in (Path(__file__).resolve().parent.parent, Path.cwd()):
        if (root / "benchmarks").is_dir():
            return root / "benchmarks"
    # a ValueError: the CLI reports it as one line (run from a checkout that has benchmarks/)
    raise ValueError("name: no benchmarks/ directory next to the package or in the current directory")


def available() -> list[str]:
    return sorted(p.stem for p in _benchmark_dir().glob("*.py") if not p.name.startswith("_"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="benchmark script name (without .py); 'list' lists them")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")


def run(args: argparse.Namespace) -> int:
    if args.name == "list":
        sys.stdout.write("\n".join(available()) + "\n")
        return 0
    path = _benchmark_dir() / f"{args.name}.py"
    if not path.exists():
        raise ValueError(f"name: expected one of {available()}, got {args.name!r}")
    sys.argv = [str(path), *args.args]
    runpy.run_path(str(path), run_name="__main__")
    return 0
