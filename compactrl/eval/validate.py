"""``compactrl tasks validate``: is a task set graded right? ``gold`` must succeed and ``noop`` fail on every task.

Generic over whatever :func:`compactrl.tasksets.load_tasks` loads (SWE-bench rows, Terminal-Bench
folders, Task records): per task it runs the ``gold`` policy (the task's reference solution) and the
``noop`` policy (submits at once) through the evaluation machinery of ``compactrl eval``
(:func:`~compactrl.eval.tasks.run_task`) on the chosen backend, and keeps both verdicts with their
evidence (exit code, timeout, resource limit, the test log's tail). A task whose loader flagged it
(``Task.grading.not_gradable``: an image-only step, network at test time...) is reported with that
reason and never run. The kind-specific part is only :func:`prepared_of` (what "prepared" means for
a kind); everything else reads the episode records every kind produces.

One table line per task, a JSON report (``--json-out``), and exit status 1 when any task is wrong
(gold not resolved, noop resolved, or not gradable), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from compactrl.cli_options import Applies, refuse_ignored, track_given
from compactrl.eval.records import KEYS as RECORD_KEYS
from compactrl.task import Task

VERDICT_KEYS = ("test_exit_code", "test_timed_out", "test_limit_hit", "test_log_tail")


def prepared_of(task: Task) -> bool:
    """Whether the task's environment was prepared (SWE-bench: a work tree and environment built by
    ``compactrl tasks prepare``, or its image; other kinds: always)."""
    if task.source == "swebench":
        return bool(task.runtime.work_tree or task.docker_image or task.grading.prepared)
    return True


def not_gradable(task: Task) -> str | None:
    """The loader's reason why ``task`` cannot be graded faithfully on this machine, or why it cannot be
    validated (a Terminal-Bench task published without a reference solution: no gold to run), or None."""
    reason = task.grading.not_gradable
    if reason:
        return str(reason)
    if task.source == "terminal-bench":
        steps = [(s.name, s.solution_sh) for s in task.steps] or [(None, task.reference.solution_sh)]
        for name, solution in steps:
            script = solution or ""
            where = f" for step {name}" if name else ""
            if not script:
                return (f"no reference solution as published{where} (no solution.sh, solution.yaml or "
                        "solution/solve.sh): gold cannot be run")
            if not any(line.strip() and not line.lstrip().startswith("#") for line in script.splitlines()):
                return f"no reference solution as published{where}: its script has no command (comments only)"
    return None


def verdict(record: dict[str, Any]) -> dict[str, Any]:
    """An episode record's verdict: resolved, the exit code, timeout, resource limit, log tail, and a
    sandbox error when the infrastructure failed."""
    info = record.get("info") or {}
    return {"resolved": bool(record.get("success")), "exit_code": info.get("test_exit_code"),
            "timed_out": bool(info.get("test_timed_out", False)), "limit_hit": info.get("test_limit_hit"),
            "log_tail": info.get("test_log_tail", ""), "summary": info.get("test_summary", ""),
            "sandbox_error": record.get("sandbox_error"),
            # the whole test log as the record holds it (compactrl.eval.records: plain, or gzip+base64 when large)
            **{k: info[k] for k in (*RECORD_KEYS, "test_output_complete") if k in info}}


def first_reason(gold: dict[str, Any] | None, noop: dict[str, Any] | None) -> str:
    """The first thing wrong, in a line ('' when gold is resolved and noop is not)."""
    if gold is not None and not gold["resolved"]:
        return "gold not resolved: " + _why(gold)
    if noop is not None and noop["resolved"]:
        return "noop resolved: the check passes with no change (it cannot tell a fix from nothing)"
    return ""


def _why(v: dict[str, Any]) -> str:
    if v.get("sandbox_error"):
        return f"sandbox error: {v['sandbox_error'].splitlines()[0][:200]}"
    if v.get("timed_out"):
        return "the test run timed out"
    if v.get("limit_hit"):
        return f"a sandbox limit was hit: {v['limit_hit']}"
    lines = (v.get("log_tail") or "").splitlines()
    for prefix in ("failing: ", "missing: ", "ERROR ", "FAILED "):
        hit = next((line for line in lines if line.startswith(prefix)), None)
        if hit:
            return hit[:200]
    return (v.get("summary") or "").splitlines()[0][:200] if v.get("summary") else f"exit code {v.get('exit_code')}"


def validate_tasks(tasks: Sequence[Task], backend: str, *, sandbox_kwargs: dict[str, Any] | None = None,
                   max_turns: int | None = None,
                   on_result: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """One record per task (in order): ``task_id``, ``kind``, ``source``, ``prepared``, ``gradable``,
    ``not_gradable`` (the reason), ``gold``/``noop`` verdicts (:func:`verdict`), ``gold_resolved``,
    ``noop_resolved``, ``ok``, ``seconds``, ``reason`` (:func:`first_reason`). ``on_result`` gets
    each record as soon as it is done (the CLI prints its line)."""
    from compactrl.eval.tasks import run_task
    from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy

    out = []
    for task in tasks:
        start = time.monotonic()
        rec: dict[str, Any] = {"task_id": task.id, "kind": task.kind, "source": task.source,
                               "prepared": prepared_of(task), "not_gradable": not_gradable(task)}
        rec["gradable"] = rec["not_gradable"] is None
        gold = noop = None
        if rec["gradable"]:
            runs = {}
            for name, policy in (("gold", GoldPolicy()), ("noop", NoopPolicy())):
                t0 = time.monotonic()
                record = run_task(task, policy, backend, sandbox_kwargs=dict(sandbox_kwargs or {}),
                                  max_turns=max_turns, give_task_to_policy=True)
                runs[name] = {**verdict(record), "seconds": round(time.monotonic() - t0, 2)}
            gold, noop = runs["gold"], runs["noop"]
        rec.update(gold=gold, noop=noop, gold_resolved=gold["resolved"] if gold else None,
                   noop_resolved=noop["resolved"] if noop else None)
        rec["ok"] = bool(gold and gold["resolved"] and noop and not noop["resolved"])
        rec["reason"] = first_reason(gold, noop) if rec["gradable"] else f"not gradable: {rec['not_gradable']}"
        rec["seconds"] = round(time.monotonic() - start, 2)
        out.append(rec)
        if on_result is not None:
            on_result(rec)
    return out


def format_line(rec: dict[str, Any]) -> str:
    """``ok|WRONG|SKIP  id  kind  prepared  gold  noop  seconds  reason``."""
    def yn(value, yes, no):
        return "-" if value is None else (yes if value else no)

    status = "ok   " if rec["ok"] else ("SKIP " if not rec["gradable"] else "WRONG")
    return (f"{status} {rec['task_id']}  {rec['kind']}  {'prepared' if rec['prepared'] else 'unprepared'}"
            f"  gold={yn(rec['gold_resolved'], 'resolved', 'NOT-resolved')}"
            f"  noop={yn(rec['noop_resolved'], 'RESOLVED', 'not-resolved')}  {rec['seconds']:.1f}s"
            + (f"  {rec['reason']}" if rec["reason"] else ""))


def add_arguments(p: argparse.ArgumentParser) -> None:
    from compactrl.eval.tasks import BACKENDS

    p.add_argument("source", help="SWE-bench rows (.json/.jsonl), Task records, or Terminal-Bench task folder(s)")
    p.add_argument("--backend", default="local", choices=BACKENDS, help="sandbox (default: local)")
    p.add_argument("--repos-root", default=None, help="SWE-bench: folder of git repositories named <owner>__<name>")
    p.add_argument("--swebench-specs", default=None,
                   help="SWE-bench: the specs file `compactrl tasks prepare` wrote (its specs.json)")
    p.add_argument("--swebench-images", action="store_true", help="SWE-bench: use the sweb.eval.* instance images")
    p.add_argument("--image-namespace", default="swebench", help="SWE-bench image namespace ('' for local builds)")
    p.add_argument("--instance-ids", default=None, help="comma-separated task ids (default: every task)")
    p.add_argument("--python", default=None, help="interpreter that runs the tests inside the sandbox")
    p.add_argument("--setup", action="append", default=[], help="setup command run before the policy (repeatable)")
    p.add_argument("--image", default=None, help="Terminal-Bench/docker: image for every task")
    p.add_argument("--tb-grading", default="auto", choices=("auto", "script", "pytest"),
                   help="Terminal-Bench: how to grade (as `compactrl eval --tb-grading`)")
    p.add_argument("--sandbox-kwargs", default="{}", help="JSON options of the sandbox backend")
    p.add_argument("--max-turns", type=int, default=None, help="turn limit (default: each task's)")
    p.add_argument("--json-out", default=None, metavar="FILE", help="write the JSON report (every task's record) to FILE")
    p.add_argument("--download-cache", default=None, metavar="DIR",
                   help="Terminal-Bench (local): things fetched ahead for prepare: DIR/git/<host>/<owner>/<name>.git "
                        "bare mirrors of the repositories Dockerfile steps `git clone` (sets COMPACTRL_DOWNLOAD_CACHE)")
    p.add_argument("--install-system-packages", action="store_true",
                   help="Terminal-Bench: first apt-get install the packages the tasks' Dockerfiles (or reference "
                        "solutions) install and this machine lacks (needs root; each command printed and recorded in "
                        "~/.cache/compactrl/system-packages.jsonl), then load the tasks again")
    track_given(p)


def validate_options() -> dict:
    """Where each option of ``compactrl tasks validate`` applies (the task-set options as ``eval``'s)."""
    from compactrl.eval.cli import TASK_OPTIONS, TERMINAL_BENCH, _holds, _on

    local = dict(when="to Terminal-Bench tasks on --backend local", more=lambda c: c.backend == "local",
                 got=lambda c: f"{_holds(c)}, --backend {c.backend}")
    return {**{dest: Applies("always") for dest in ("backend", "sandbox_kwargs", "max_turns", "json_out")},
            **TASK_OPTIONS,
            "download_cache": _on("terminal-bench", **local),
            "install_system_packages": _on("terminal-bench", when=TERMINAL_BENCH)}


def validate_context(args: argparse.Namespace):
    from compactrl.eval.cli import Context
    from compactrl.tasksets import task_kind

    return Context(tasks=args.source, kind=task_kind(args.source), backend=args.backend, images=args.swebench_images)


def run(args: argparse.Namespace) -> int:
    from compactrl.eval.cli import _json_object, _load_tasks

    refuse_ignored(args, validate_options(), validate_context(args))
    sandbox_kwargs = _json_object("--sandbox-kwargs", args.sandbox_kwargs)
    if getattr(args, "download_cache", None):  # read by TerminalBenchConfig when the tasks load
        if not os.path.isdir(args.download_cache):
            raise ValueError(f"--download-cache: {args.download_cache!r} is not a folder")
        os.environ["COMPACTRL_DOWNLOAD_CACHE"] = os.path.abspath(args.download_cache)
    args.tasks = args.source
    tasks = _load_tasks(args)
    if getattr(args, "install_system_packages", False):
        from compactrl.tasksets.system_packages import install_for_tasks

        if install_for_tasks(tasks):
            tasks = _load_tasks(args)
    if not tasks:
        raise ValueError(f"{args.source}: no tasks to validate")
    started = time.monotonic()
    records = validate_tasks(tasks, args.backend, sandbox_kwargs=sandbox_kwargs, max_turns=args.max_turns,
                             on_result=lambda r: print(format_line(r), flush=True))
    ok = sum(r["ok"] for r in records)
    skipped = sum(not r["gradable"] for r in records)
    print(f"{ok}/{len(records)} tasks right (gold resolved, noop not resolved); {skipped} not gradable; "
          f"{time.monotonic() - started:.0f} s")
    for r in records:
        if r["gradable"] and not r["ok"]:
            bad = r["gold"] if not r["gold_resolved"] else r["noop"]
            print(f"--- {r['task_id']}: {r['reason']}\n{bad.get('sandbox_error') or bad.get('log_tail') or ''}",
                  file=sys.stderr)
    if args.json_out:
        report = {"source": args.source, "backend": args.backend, "tasks": records, "ok": ok, "total": len(records),
                  "not_gradable": skipped}
        tmp = args.json_out + ".tmp"
        os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1, sort_keys=True)
        os.replace(tmp, args.json_out)
    return 0 if ok == len(records) else 1
