"""``compactrl tasks prepare | validate``.

``prepare``: Python environments and work trees for SWE-bench rows: per (repository, version) of
the rows a venv built from the harness's specs, per row a work tree at ``base_commit`` with the
harness's pre_install and install steps run; then ``specs.json`` for ``compactrl eval
--swebench-specs`` and ``manifest.json`` (see :mod:`compactrl.tasksets.swebench.prepare`).

``validate``: gold must succeed and noop fail on every task of a set (see :mod:`compactrl.eval.validate`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from compactrl.cli_options import Applies, refuse_ignored, track_given

PREPARE_OPTIONS = {
    **{dest: Applies("always") for dest in ("repos_root", "envs_root", "instance_ids", "harness_specs",
                                            "strict_python", "pip_arg", "resolver", "step_timeout",
                                            "download_cache", "workdir", "install_system_packages")},
    "harness_python": Applies("without --harness-specs (a dump of the specs wins)",
                              lambda a: a.harness_specs is None, lambda a: f"got --harness-specs {a.harness_specs}"),
    "exclude_newer": Applies("when uv installs (--resolver uv or auto)", lambda a: a.resolver != "pip",
                             lambda a: "got --resolver pip"),
}
"""Where each option of ``compactrl tasks prepare`` applies (the context is the parsed options)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("prepare", help="build SWE-bench rows' environments (venvs) and work trees",
                       description="build SWE-bench rows' environments (venvs) and work trees")
    p.add_argument("rows", help="SWE-bench rows (.json/.jsonl)")
    p.add_argument("--repos-root", required=True, help="folder of git repositories named <owner>__<name> (full history)")
    p.add_argument("--envs-root", required=True, help="folder for the venvs, work trees, logs, specs.json and manifest.json")
    p.add_argument("--instance-ids", default=None, help="comma-separated instance ids (default: every row)")
    p.add_argument("--harness-python", default=None,
                   help="an interpreter with swebench<5 to read the harness specs from (default: this one)")
    p.add_argument("--harness-specs", default=None, help="JSON dump of the harness specs (wins over --harness-python)")
    p.add_argument("--strict-python", action="store_true",
                   help="fail when the pinned Python is missing (default: use the nearest available, recorded)")
    p.add_argument("--pip-arg", action="append", default=[], help="extra pip install argument (repeatable)")
    p.add_argument("--resolver", default="auto", choices=("auto", "uv", "pip"),
                   help="who installs packages: uv (Python >= 3.8), the venv's pip upgraded to the newest for its "
                        "Python, or auto (uv when installed, else pip; default)")
    p.add_argument("--exclude-newer", default="2024-08-13", metavar="YYYY-MM-DD",
                   help="install no package released after this date (uv; default 2024-08-13, SWE-bench Verified's "
                        "release: open requirements resolve as when the rows were validated); 'none' for no bound")
    p.add_argument("--step-timeout", type=float, default=3600.0,
                   help="time limit of one step (venv, one install command, a row's install script), seconds "
                        "(default: 3600)")
    p.add_argument("--download-cache", default=None, metavar="DIR",
                   help="files fetched ahead, found by content: <sha256> files a build step downloads (with "
                        "'<sha256> <url>' lines in DIR/urls.txt), <git blob id> files a checkout lacks")
    p.add_argument("--workdir", default="/workspace", help="the repository's path inside the sandbox (default: /workspace)")
    p.add_argument("--install-system-packages", action="store_true",
                   help="first apt-get install the packages the rows' harness images install (their pre_install's "
                        "apt-get lines) and this machine lacks (needs root; each command printed and recorded in "
                        "~/.cache/compactrl/system-packages.jsonl and manifest.json); without it those rows are "
                        "flagged not gradable")
    track_given(p)
    v = sub.add_parser("validate", help="run gold and noop on every task: gold must succeed, noop fail",
                       description="run the gold and noop policies on every task of a set (SWE-bench rows, "
                                   "Terminal-Bench folders, Task records); one line per task, a JSON report, "
                                   "exit 1 when any task is wrong")
    from compactrl.eval.validate import add_arguments as add_validate

    add_validate(v)


def run(args: argparse.Namespace) -> int:
    if args.action == "validate":
        from compactrl.eval.validate import run as run_validate

        return run_validate(args)
    return _prepare(args)


def _progress(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


def _prepare(args: argparse.Namespace) -> int:
    from compactrl.tasksets.swebench.prepare import PrepareConfig, prepare

    refuse_ignored(args, PREPARE_OPTIONS, args)
    ids = tuple(i for i in (args.instance_ids or "").split(",") if i) or None
    config = PrepareConfig(repos_root=args.repos_root, envs_root=args.envs_root, harness_python=args.harness_python,
                           harness_specs=args.harness_specs, strict_python=args.strict_python,
                           pip_args=tuple(args.pip_arg), workdir=args.workdir, instance_ids=ids,
                           resolver=args.resolver, command_timeout_s=args.step_timeout,
                           download_cache=args.download_cache, install_system_packages=args.install_system_packages,
                           exclude_newer=None if args.exclude_newer.lower() == "none" else args.exclude_newer)
    import signal

    # SIGTERM as Ctrl-C: the running step's process group is killed, the manifest keeps what finished
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        report = prepare(args.rows, config, progress=_progress)
    except OSError as exc:
        raise ValueError(f"{args.rows}: {exc}") from None
    for iid, rec in report.prepared.items():
        fallback = f" (pinned {rec['python_requested']}: not available)" if rec["python_fallback"] else ""
        reused = "reused" if rec["reused"] else f"installed in {rec['install_s']} s"
        flag = f"  NOT GRADABLE: {rec['not_gradable']}" if rec.get("not_gradable") else ""
        print(f"ok   {iid}  {rec['env']}  python {rec['python_version']}{fallback}  {reused}{flag}")
    for iid, why in report.failed.items():
        print(f"FAIL {iid}  {why}")
    print(f"specs: {report.specs_path}\nmanifest: {report.manifest_path}\nlogs: {os.path.join(args.envs_root, 'logs')}")
    if report.prepared:
        for line in next_commands(args.rows, args.repos_root, report.specs_path):
            print(f"next: {line}")
    return 1 if report.failed else 0


SANDBOX_KWARGS = '{"pytest_plugin_autoload": true}'
"""The local sandbox option a prepared row's agent shell needs to run pytest as the harness does
(every plugin installed in the environment loads; the graded run turns it on itself)."""


def next_commands(rows: str, repos_root: str, specs_path: str) -> list[str]:
    """The commands that use what ``prepare`` built: validate the rows, then evaluate a policy."""
    common = (f"--repos-root {shlex.quote(os.path.abspath(repos_root))} "
              f"--swebench-specs {shlex.quote(os.path.abspath(specs_path))} --backend local "
              f"--sandbox-kwargs {shlex.quote(SANDBOX_KWARGS)}")
    return [f"compactrl tasks validate {shlex.quote(rows)} {common}",
            f"compactrl eval --tasks {shlex.quote(rows)} {common} --policy gold --expect success"]
