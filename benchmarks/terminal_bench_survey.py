"""Which published Terminal-Bench folders the local backend can grade, decided before any episode.

Loads every task folder under ``--tasks-root`` (``<root>/<repo>/tasks/<task>`` for the official 1.x
layout, ``<root>/<repo>/<task>`` for 2.x sets) with the local backend's loader, without preparing
anything, and counts the reasons the loader gives for the ones it flags ``not_gradable`` (the same
reasons ``compactrl tasks validate`` and ``compactrl eval`` report). Nothing is downloaded or run.

    python benchmarks/terminal_bench_survey.py --tasks-root /work/data/tb/src \
        --download-cache /work/data/tb/download-cache [--out survey.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig, load_task_dir  # noqa: E402

# the first of these a reason holds is its kind (the rest: the reason's first words)
KINDS = ("docker-compose", "git clone", "needs network", "apt packages", "pip install", "not loaded", "dotnet",
         "system files", "incomplete", "rename a file into /tmp", "wget", "curl")


def task_folders(root: str) -> list[str]:
    out = []
    for repo in sorted(os.listdir(root)):
        base = os.path.join(root, repo, "tasks") if os.path.isdir(os.path.join(root, repo, "tasks")) \
            else os.path.join(root, repo)
        for name in sorted(os.listdir(base)):
            folder = os.path.join(base, name)
            if any(os.path.isfile(os.path.join(folder, f)) for f in ("task.yaml", "task.toml")):
                out.append(folder)
    return out


def kind(reason: str) -> str:
    return next((k for k in KINDS if k in reason), reason[:60])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks-root", required=True)
    parser.add_argument("--download-cache", default=None, help="as for the benchmark: git mirrors, releases")
    parser.add_argument("--out", default="", help="write every folder's reason (or null) as JSON here")
    args = parser.parse_args(argv)
    config = TerminalBenchConfig(backend="local", download_cache=args.download_cache)
    rows = []
    for folder in task_folders(args.tasks_root):
        try:
            reason = load_task_dir(folder, config).grading.not_gradable
        except Exception as e:  # a folder the loader refuses is a row too
            reason = f"not loaded: {str(e)[:200]}"
        rows.append({"task": os.path.relpath(folder, args.tasks_root), "not_gradable": reason})
    flagged = [r["not_gradable"] for r in rows if r["not_gradable"]]
    print(f"{len(rows)} folders: {len(rows) - len(flagged)} pass every pre-episode check, {len(flagged)} flagged")
    for k, n in collections.Counter(map(kind, flagged)).most_common():
        print(f"{n:4d}  {k}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
