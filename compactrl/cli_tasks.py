"""``compactrl tasks prepare``: Python environments and work trees for SWE-bench rows.

Per (repository, version) of the rows a venv built from the harness's specs, per row a work tree
at ``base_commit`` with the install step run; then ``specs.json`` for ``compactrl eval
--swebench-specs`` and ``manifest.json`` (see :mod:`compactrl.envs.loaders.swebench_prepare`).
"""

from __future__ import annotations

import argparse
import os


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("prepare", help="build SWE-bench rows' environments (venvs) and work trees",
                       description="build SWE-bench rows' environments (venvs) and work trees")
    p.add_argument("rows", help="SWE-bench rows (.json/.jsonl)")
    p.add_argument("--repos-root", required=True, help="folder of git repositories named <owner>__<name> (full history)")
    p.add_argument("--envs-root", required=True, help="folder for the venvs, work trees, specs.json and manifest.json")
    p.add_argument("--instance-ids", default=None, help="comma-separated instance ids (default: every row)")
    p.add_argument("--harness-python", default=None,
                   help="an interpreter with swebench<5 to read the harness specs from (default: this one)")
    p.add_argument("--harness-specs", default=None, help="JSON dump of the harness specs (wins over --harness-python)")
    p.add_argument("--strict-python", action="store_true",
                   help="fail when the pinned Python is missing (default: use the nearest available, recorded)")
    p.add_argument("--pip-arg", action="append", default=[], help="extra pip install argument (repeatable)")
    p.add_argument("--workdir", default="/workspace", help="the repository's path inside the sandbox (default: /workspace)")


def run(args: argparse.Namespace) -> int:
    from compactrl.envs.loaders.swebench_prepare import PrepareConfig, prepare

    ids = tuple(i for i in (args.instance_ids or "").split(",") if i) or None
    config = PrepareConfig(repos_root=args.repos_root, envs_root=args.envs_root, harness_python=args.harness_python,
                           harness_specs=args.harness_specs, strict_python=args.strict_python,
                           pip_args=tuple(args.pip_arg), workdir=args.workdir, instance_ids=ids)
    try:
        report = prepare(args.rows, config)
    except OSError as exc:
        raise ValueError(f"{args.rows}: {exc}") from None
    for iid, rec in report.prepared.items():
        fallback = f" (pinned {rec['python_requested']}: not available)" if rec["python_fallback"] else ""
        reused = "reused" if rec["reused"] else f"installed in {rec['install_s']} s"
        print(f"ok   {iid}  {rec['env']}  python {rec['python_version']}{fallback}  {reused}")
    for iid, why in report.failed.items():
        print(f"FAIL {iid}  {why}")
    print(f"specs: {report.specs_path}\nmanifest: {report.manifest_path}")
    if report.prepared:
        print(f"next: compactrl eval --tasks {args.rows} --repos-root {args.repos_root} "
              f"--swebench-specs {os.path.abspath(report.specs_path)} --backend local --policy gold")
    return 1 if report.failed else 0
