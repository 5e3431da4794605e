"""Real SWE-bench rows from every Lite repository (and Verified), graded as the official harness grades them.

For every row of ``--rows`` (default ``benchmarks/data/swebench_real.jsonl``: Lite and Verified rows
not in ``swebench_lite_local.jsonl``), ``compactrl tasks prepare`` builds (or reuses) the environment
of its (repository, version) and its work tree, then the row runs twice on the local sandbox: the
``gold`` policy must resolve it and ``noop`` must not. Each of the two test logs is also graded by the
``swebench`` package itself (``swebench.harness.grading``, :mod:`compactrl.tasksets.swebench.parity`):
the parity columns say whether its verdict equals ours. Rows the loader flags ``not_gradable`` are
listed with the reason and not run. Writes a Markdown table (``--out``) with the times per
environment and per row and the machine's load, a JSON file beside it, and each run's test log under
``--logs-dir``.

    nice -n 10 python benchmarks/swebench_real.py --repos-root /work/data/swebench/repos \\
        --envs-root /work/data/swebench/prepared/real --harness-python /work/data/swebench/harness-venv-4.1/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time

from compactrl.eval import run_task
from compactrl.eval.records import record_output
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.tasksets.swebench.parity import oracle, ours, split_graded_output
from compactrl.tasksets.swebench.prepare import PrepareConfig, prepare
from compactrl.tasksets.swebench.rows import SWEBenchConfig, load_swebench, read_rows

HERE = os.path.dirname(os.path.abspath(__file__))
ROWS = os.path.join(HERE, "data", "swebench_real.jsonl")
OUT = os.path.join(HERE, "results", "swebench_real.md")
SANDBOX = {"pytest_plugin_autoload": True, "output_limit_bytes": 64 << 20, "test_output_limit_bytes": 64 << 20,
           "memory_bytes": 8 << 30}
"""As the harness runs the tests (every plugin of the environment loads); the whole log kept for parity."""
HARNESS_TIMEOUT_S = 1800.0
"""The harness's default limit of one instance's evaluation (``run_evaluation --timeout``), also the
loader's default: sympy-13437's ``test_bell`` alone takes 830 s here with the gold patch."""


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default=ROWS)
    p.add_argument("--repos-root", required=True)
    p.add_argument("--envs-root", required=True)
    p.add_argument("--harness-python", default=None)
    p.add_argument("--harness-specs", default=None)
    p.add_argument("--download-cache", default=None, help="prepare's download cache (files found by content)")
    p.add_argument("--lite-rows", default=None, help="the Lite dataset (.jsonl), to label each row Lite or Verified")
    p.add_argument("--instance-ids", default=None, help="comma-separated (default: every row)")
    p.add_argument("--skip-prepare", action="store_true", help="use the envs root's specs.json as it is")
    p.add_argument("--logs-dir", default=None, help="where each run's test log goes (default: ENVS_ROOT/run-logs)")
    p.add_argument("--resume", action="store_true",
                   help="keep the rows already in OUT's JSON and run only the others (e.g. as preparation goes on)")
    p.add_argument("--export-logs", default=None, metavar="DIR",
                   help="copy the gold and no-op logs under --export-max-bytes of the rows done to DIR, with "
                        "cases.json (the parity test's fixtures: tests/fixtures/swebench/real_logs)")
    p.add_argument("--export-max-bytes", type=int, default=40_000)
    p.add_argument("--redo", default=None, help="comma-separated rows to run again even with --resume")
    p.add_argument("--table-only", action="store_true", help="with --resume: write the table from the JSON, run nothing")
    p.add_argument("--draw-validate", action="append", default=[], metavar="FILE",
                   help="the JSON report of `compactrl tasks validate` on a random draw of unseen rows: written as a "
                        "separate section (with prepare's reason for rows it could not prepare, from ENVS_ROOT); "
                        "repeatable, one section per draw")
    p.add_argument("--draw-command", action="append", default=[],
                   help="the commands that made the n-th --draw-validate, for its section (repeatable, in order)")
    p.add_argument("--draw-note", action="append", default=[], help="a line under the first draw's table (repeatable)")
    p.add_argument("--draw2-note", action="append", default=[], help="a line under the second draw's table (repeatable)")
    p.add_argument("--out", default=OUT)
    return p.parse_args()


EXIT = re.compile(r"^test command exit status: (-?\d+)$", re.MULTILINE)


def _run(task, policy, logs_dir: str, name: str) -> dict:
    start = time.monotonic()
    record = run_task(task, policy, "local", sandbox_kwargs=dict(SANDBOX), give_task_to_policy=True)
    seconds = time.monotonic() - start
    info = record.get("info") or {}
    output = record_output(info) or ""
    log = split_graded_output(output)
    found = EXIT.search(output)
    exit_code = int(found.group(1)) if found else None
    meta = task.origin
    path = os.path.join(logs_dir, f"{task.id}.{name}.log")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(log)
    ref = oracle(meta["repo"], log, meta["FAIL_TO_PASS"], meta["PASS_TO_PASS"], exit_code, task.id,
                 meta.get("version") or "")
    mine = ours(meta["repo"], log, meta["FAIL_TO_PASS"], meta["PASS_TO_PASS"], exit_code)
    return {"resolved": bool(record["success"]), "seconds": round(seconds, 1), "exit_code": exit_code,
            "sandbox_error": record.get("sandbox_error"), "oracle": ref["resolved"], "oracle_status": ref["status"],
            "ours_on_log": mine, "parity": mine == ref["resolved"] == bool(record["success"]), "log": path,
            "tail": _reason(info, record)}


def export_logs(folder: str, results: list[dict], rows_by_id: dict, max_bytes: int) -> None:
    """Small real logs and what both graders must say of them, for tests/tasksets/test_swebench_parity.py."""
    os.makedirs(folder, exist_ok=True)
    cases = []
    for r in results:
        if "gold" not in r or not r["ok"] or not (r["gold"]["parity"] and r["noop"]["parity"]):
            continue
        runs = {name: r[name] for name in ("gold", "noop")}
        if any(os.path.getsize(v["log"]) > max_bytes for v in runs.values()):
            continue
        row = rows_by_id[r["id"]]
        for name, run in runs.items():
            with open(run["log"], encoding="utf-8") as fh:
                log = fh.read().replace("\ufffd[", "\x1b[")
            target = f"{r['id']}.{name}.log"
            with open(os.path.join(folder, target), "w", encoding="utf-8") as fh:
                fh.write(log)
            cases.append({"instance_id": r["id"], "repo": row["repo"], "run": name, "log": target,
                          "exit_code": run["exit_code"],
                          **{k: json.loads(row[k]) if isinstance(row[k], str) else row[k]
                             for k in ("FAIL_TO_PASS", "PASS_TO_PASS")}})
    with open(os.path.join(folder, "cases.json"), "w", encoding="utf-8") as fh:
        json.dump(cases, fh, indent=1)


def _parity(run: dict, row: dict) -> None:
    """Both graders' verdicts on a run's saved log, into ``run``."""
    with open(run["log"], encoding="utf-8") as fh:
        log = fh.read().replace("\ufffd[", "\x1b[")
    f2p, p2p = (json.loads(row[k]) if isinstance(row[k], str) else row[k] for k in ("FAIL_TO_PASS", "PASS_TO_PASS"))
    ref = oracle(row["repo"], log, f2p, p2p, run["exit_code"], row["instance_id"], row.get("version") or "")
    run["oracle"], run["oracle_status"] = ref["resolved"], ref["status"]
    run["ours_on_log"] = ours(row["repo"], log, f2p, p2p, run["exit_code"])
    run["parity"] = run["ours_on_log"] == run["oracle"] == run["resolved"]


def _reason(info: dict, record: dict) -> str:
    if record.get("sandbox_error"):
        return record["sandbox_error"].splitlines()[0][:200]
    tail = info.get("test_log_tail", "").splitlines()
    picked = [line for line in tail if line.startswith(("failing: ", "missing: ", "invalid run"))][:2]
    return "; ".join(picked)[:240]


def main() -> int:
    args = _parse()
    rows = read_rows(args.rows)
    ids = [i for i in (args.instance_ids or "").split(",") if i] or [r["instance_id"] for r in rows]
    lite = set()
    if args.lite_rows:
        lite = {r["instance_id"] for r in read_rows(args.lite_rows)}
    logs_dir = args.logs_dir or os.path.join(args.envs_root, "run-logs")
    os.makedirs(logs_dir, exist_ok=True)
    load_before = os.getloadavg()
    start = time.monotonic()
    if args.skip_prepare:
        manifest = json.load(open(os.path.join(args.envs_root, "manifest.json")))
        prepared, failed = manifest["instances"], manifest["failed"]
        specs_path = os.path.join(args.envs_root, "specs.json")
        failed = {i: why for i, why in failed.items() if i in ids}
    else:
        report = prepare(args.rows, PrepareConfig(repos_root=args.repos_root, envs_root=args.envs_root,
                                                  harness_python=args.harness_python, harness_specs=args.harness_specs,
                                                  instance_ids=tuple(ids), download_cache=args.download_cache))
        prepared, failed, specs_path = report.prepared, report.failed, report.specs_path
    prepare_s = time.monotonic() - start
    if args.skip_prepare:  # the preparation ran before: its time is what the manifest recorded
        chosen = [prepared[i] for i in ids if i in prepared]
        prepare_s = sum({r["env"]: r.get("env_build_s") or 0 for r in chosen}.values()) + sum(
            r.get("install_s") or 0 for r in chosen)
    results, flagged = [], {}
    json_path = os.path.splitext(args.out)[0] + ".json"
    if args.resume and os.path.exists(json_path):
        with open(json_path, encoding="utf-8") as fh:
            earlier = json.load(fh)
        redo = set((args.redo or "").split(","))
        results = [r for r in earlier["results"] if r["id"] in ids and r["id"] not in redo]
        load_before = tuple(earlier.get("load_before") or load_before)
    rows_by_id = {r["instance_id"]: r for r in rows}
    for r in results:  # parity again from the saved logs (the graders may have changed since)
        for name in ("gold", "noop"):
            if name in r:
                _parity(r[name], rows_by_id[r["id"]])
    if args.export_logs:
        export_logs(args.export_logs, results, rows_by_id, args.export_max_bytes)
        return 0
    done = {r["id"] for r in results}
    ready = [] if args.table_only else [i for i in ids if i in prepared and i not in done]
    tasks = load_swebench(args.rows, SWEBenchConfig(repos_root=args.repos_root, specs=specs_path,
                                                    test_timeout_s=HARNESS_TIMEOUT_S),
                          instance_ids=ready) if ready else []
    tasks.sort(key=lambda t: ids.index(t.id))  # in --instance-ids order (e.g. one row per repository first)
    for task in tasks:
        rec = prepared[task.id]
        base = {"id": task.id, "set": ("Lite" if task.id in lite else "Verified") if lite else "?",
                **{k: rec.get(k) for k in ("env", "python_requested", "python_version", "env_build_s", "install_s")}}
        if task.grading.not_gradable:
            flagged[task.id] = task.grading.not_gradable
            results.append({**base, "not_gradable": task.grading.not_gradable})
            print(f"{task.id}: not gradable: {task.grading.not_gradable}", flush=True)
            continue
        gold, noop = _run(task, GoldPolicy(), logs_dir, "gold"), _run(task, NoopPolicy(), logs_dir, "noop")
        results.append({**base, "gold": gold, "noop": noop, "ok": gold["resolved"] and not noop["resolved"],
                        "run_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})
        print(f"{task.id}: gold {gold['resolved']} ({gold['seconds']} s, oracle {gold['oracle']}), "
              f"noop {noop['resolved']} ({noop['seconds']} s, oracle {noop['oracle']})", flush=True)
        _write(args, results, failed, prepare_s, load_before, os.getloadavg(), partial=True)
    _write(args, results, failed, prepare_s, load_before, os.getloadavg(), partial=False)
    ok = sum(r.get("ok", False) for r in results)
    return 0 if ok >= 0.95 * len(ids) else 1


def _write(args, results, failed, prepare_s, load_before, load_after, partial: bool) -> None:
    ids = [i for i in (args.instance_ids or "").split(",") if i] or [r["instance_id"] for r in read_rows(args.rows)]
    not_run = [i for i in ids if i not in {r["id"] for r in results} and i not in failed]
    markdown = _markdown(args, results, failed, prepare_s, load_before, load_after, partial, not_run)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(markdown)
    os.replace(args.out + ".tmp", args.out)
    with open(os.path.splitext(args.out)[0] + ".json.tmp", "w", encoding="utf-8") as fh:
        json.dump({"results": results, "failed": failed, "prepare_s": prepare_s, "load_before": list(load_before)},
                  fh, indent=1)
    os.replace(os.path.splitext(args.out)[0] + ".json.tmp", os.path.splitext(args.out)[0] + ".json")


def _reuse_note(run: list[dict]) -> str:
    """Which rows ran in this table's last invocations and which were kept from earlier ones."""
    dated = sorted({r["run_at"][:10] for r in run if r.get("run_at")})
    kept = [r["id"] for r in run if not r.get("run_at")]
    text = (f"{len(run) - len(kept)} rows ran with `run_at` recorded in the JSON ({', '.join(dated) or '-'}); "
            if len(kept) < len(run) else "")
    if kept:
        text += (f"{len(kept)} rows were kept from an earlier run of this script through `--resume` (their JSON "
                 "records and saved logs; parity recomputed from the logs on every write), not run again.")
    return text


def _yn(v: dict, key: str = "resolved") -> str:
    return "resolved" if v[key] else "not resolved"


def _markdown(args, results, failed, prepare_s, load_before, load_after, partial: bool,
              not_run: list[str] = ()) -> str:
    run = [r for r in results if "gold" in r]
    good = sum(r["ok"] for r in run)
    parity = sum(r["gold"]["parity"] and r["noop"]["parity"] for r in run)
    total = len({r["id"] for r in results} | set(failed) | set(not_run))
    repos = sorted({r["env"].split("@")[0] for r in results if r.get("env")})
    envs: dict[str, float] = {}
    for r in results:
        if r.get("env") and r.get("env_build_s") is not None:
            envs[r["env"]] = r["env_build_s"]
    lines = [
        "# Real SWE-bench rows graded as the official harness grades them (gold must resolve, no-op must not)", "",
        ("**Partial (still running).** " if partial else "")
        + f"Rows: `{os.path.relpath(args.rows, os.path.dirname(HERE))}`; {total} rows from {len(repos)} repositories; "
        f"**{good}/{total}** with gold resolved and no-op not resolved; {len(failed)} not prepared; "
        f"{sum('not_gradable' in r for r in results)} flagged not gradable; parity with the `swebench` package's "
        f"grading on both logs: **{parity}/{len(run)}** rows.", "",
        f"Machine: {os.cpu_count()} cores, shared with other jobs; load average (1 min) {load_before[0]:.2f} when the "
        f"run started, {load_after[0]:.2f} at this write; Python {platform.python_version()}. "
        f"Preparation (from an empty envs folder unless reused): {prepare_s:.0f} s.", "",
        _reuse_note(run), "",
        f"Command: `nice -n {os.nice(0)} python benchmarks/swebench_real.py {' '.join(sys.argv[1:])}`", "",
        "Parity: the test log of each run graded by `swebench.harness.grading` (5.x: `get_logs_eval`, "
        "`get_eval_tests_report`, `get_resolution_status`, the repository's parser from `MAP_REPO_TO_PARSER_PY`) "
        "equals compactrl's verdict (`=`), else `DIFF`.", "",
        "| instance | set | env (repo@version) | python pinned -> used | env build s | install s | gold | no-op "
        "| gold s | no-op s | parity gold / no-op |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        head = (f"| {r['id']} | {r['set']} | {r['env']} | {r['python_requested']} -> {r['python_version']} | "
                f"{r['env_build_s']} | {r['install_s']} | ")
        if "gold" not in r:
            lines.append(head + "not gradable | - | - | - | - |")
            continue
        g, n = r["gold"], r["noop"]
        lines.append(head + f"{_yn(g) if g['resolved'] else '**NOT resolved**'} | "
                     f"{'**RESOLVED**' if n['resolved'] else 'not resolved'} | {g['seconds']} | {n['seconds']} | "
                     f"{'=' if g['parity'] else 'DIFF'} / {'=' if n['parity'] else 'DIFF'} |")
    lines += ["", "Environments (built once per repository@version, each row's install step on its own copy):", "",
              "| env | build s |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in sorted(envs.items())]
    wrong = [r for r in run if not r["ok"]]
    if wrong or failed or any("not_gradable" in r for r in results):
        lines += ["", "Exceptions and their reasons:", ""]
        for r in wrong:
            bad = r["gold"] if not r["gold"]["resolved"] else r["noop"]
            what = "gold not resolved" if not r["gold"]["resolved"] else "no-op resolved"
            lines.append(f"- `{r['id']}`: {what}: {bad['tail'] or bad.get('sandbox_error') or 'see its log'}")
        for r in results:
            if "not_gradable" in r:
                lines.append(f"- `{r['id']}`: not gradable here: {r['not_gradable']}")
        for i, why in failed.items():
            text = why.strip().splitlines()
            if len(text) == 1:
                lines.append(f"- `{i}`: not prepared: {text[0][:420]}")
                continue
            key = next((x for x in text[1:] if re.search(r"unable|error:|cannot|Errors?\.", x)), text[-1])
            lines.append(f"- `{i}`: not prepared: {text[0][:160]} ... {key.strip()[:220]}")
    if not_run:
        lines += ["", "Prepared but not run (the run was stopped for time before them): "
                  + ", ".join(f"`{i}`" for i in not_run)]
    notes = [getattr(args, "draw_note", []), getattr(args, "draw2_note", [])]
    for number, report in enumerate(getattr(args, "draw_validate", None) or []):
        commands = getattr(args, "draw_command", None) or []
        lines += draw_section(report, args.envs_root, commands[number] if number < len(commands) else None,
                              "Random draw: rows nobody had looked at" if number == 0
                              else "A larger random draw: rows nobody had looked at")
        lines += [""] + [f"- {note}" for note in (notes[number] if number < len(notes) else [])]
    return "\n".join(lines) + "\n"


def draw_section(report_path: str, envs_root: str, command: str | None,
                 title: str = "Random draw: rows nobody had looked at") -> list[str]:
    """The random draw's section: one line per row of ``compactrl tasks validate``'s JSON report,
    prepare's failure reason (from the envs root's manifest) for a row it could not prepare."""
    with open(report_path, encoding="utf-8") as fh:
        report = json.load(fh)
    manifest_path = os.path.join(envs_root, "manifest.json")
    failed = json.load(open(manifest_path)).get("failed", {}) if os.path.exists(manifest_path) else {}
    tasks = report["tasks"]
    right = sum(t["ok"] for t in tasks)
    lines = ["", f"## {title}", "",
             f"`{report['source']}` (how it was drawn: `benchmarks/data/swebench_real.SOURCES.md`), checked as an "
             f"acceptance check would: prepared, then `compactrl tasks validate` on the `{report['backend']}` backend, "
             f"nothing changed for these rows before. **{right}/{len(tasks)}** right (gold resolved, no-op not).", ""]
    if command:
        lines += [f"Commands: `{command}`", ""]
    lines += ["| instance | prepared | gold | no-op | gold s | no-op s | reason when wrong |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for t in tasks:
        g, n = t.get("gold") or {}, t.get("noop") or {}
        why = t.get("reason") or ""
        if not t["prepared"] and t["task_id"] in failed:
            text = failed[t["task_id"]].strip().splitlines()
            key = next((x for x in text[1:] if re.search(r"unable|error:|cannot|Errors?\.|Failed", x)), text[-1])
            why = f"not prepared: {key.strip()[:200]}"
        lines.append(f"| {t['task_id']} | {'yes' if t['prepared'] else 'no'} | "
                     f"{'-' if t['gold_resolved'] is None else ('resolved' if t['gold_resolved'] else '**NOT resolved**')} | "
                     f"{'-' if t['noop_resolved'] is None else ('**RESOLVED**' if t['noop_resolved'] else 'not resolved')} | "
                     f"{g.get('seconds', '-')} | {n.get('seconds', '-')} | {why.replace('|', '/')[:240]} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
