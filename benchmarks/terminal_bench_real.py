"""Real Terminal-Bench task folders (1.x and 2.x): gold must succeed and noop must fail, on the
docker backend (each task in its own image, built from its Dockerfile) and on the local backend.

    python benchmarks/terminal_bench_real.py --tasks-root /work/data/tb/src [--backends docker,local]
        [--only NAME,...] [--out benchmarks/results/terminal_bench_real]

The folders are not vendored (benchmark data with a canary); TASKS says where each comes from.
``docker`` needs an engine (``DOCKER_HOST``; ``scripts/ci_docker.sh`` starts Podman's). Base images
the engine lacks (no registry is reachable here but Debian's and Ubuntu's mirrors, PyPI, npm and the
Go module proxy) are replaced by their family substitutes (``compactrl.tasksets.terminal_bench.base_images``,
built on first use, cached); the table names each base's substitute and how it differs, or why a
base has none. ``--tasks-file`` reads the task list from a JSON list of ``{"path", "format",
"source_repo", "commit"}`` (``benchmarks/data/terminal_bench_real.tasks.json``) instead of TASKS.
Writes ``OUT.md`` (the table) and ``OUT.json`` (every record); each finished row goes to ``OUT.jsonl`` at
once, and ``--resume`` runs only the rows it lacks. A folder the loader refuses (not valid as published, e.g. a
2.x task without ``tests/test.sh``, which Harbor refuses too; or a multi-step task) is a row with the loader's error.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from compactrl.eval import run_task
from compactrl.eval.records import record_output
from compactrl.eval.validate import not_gradable
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig, load_task_dir
from compactrl.tasksets.terminal_bench.spec import TerminalBenchError

# (folder under --tasks-root, where it was published)
TASKS = [
    *[(f"evoeval/{n}", "rese1f/terminal-bench-datasets datasets/evoeval (1.x)") for n in (0, 1, 2, 3, 6)],
    *[(f"purple29th/{n}", "purple29th/purple29th-tbench-2 (2.x)") for n in (
        "mobile-config-exposure-imbalance", "android-wakelock-imbalance", "android-battery-swell-pressure",
        "aero-composite-delam-subvoxel-area", "android-sensor-deadtime-flux", "seismic-p-wave-onset-pick",
        "android-license-keygen", "event-loop-scheduler")],
]
def _base(task) -> str:
    """Each base and the family substitute the docker backend builds for it (base_images.py)."""
    from compactrl.sandbox.docker import dockerfile_bases
    from compactrl.tasksets.terminal_bench import base_images

    build = task.runtime.image_build
    if not build:
        return "-"
    with open(build.dockerfile) as fh:
        bases = [b for _, b in dockerfile_bases(fh.read())]
    out = []
    for b in bases:
        try:
            recipe = base_images.recipe_for(b)
            out.append(f"{b} -> {recipe.family} substitute" + "".join(f" ({n})" for n in recipe.notes))
        except base_images.NoSubstitute as e:
            out.append(f"{b} (no substitute: {e})")
    return ", ".join(out)


def _episode(task, policy, backend: str, kwargs: dict) -> dict:
    started = time.monotonic()
    rec = run_task(task, policy, backend, sandbox_kwargs=kwargs)
    info = rec.get("info") or {}
    return {"success": bool(rec["success"]), "seconds": round(time.monotonic() - started, 1),
            "sandbox_error": rec.get("sandbox_error"), "summary": info.get("test_summary", "")[:600],
            "exit_code": info.get("test_exit_code"), "timed_out": bool(info.get("test_timed_out")),
            "log_tail": "\n".join(info.get("test_log_tail", "").splitlines()[-6:])}


def run_docker(task, client, network: str = "none") -> dict:
    from compactrl.sandbox.base import SandboxError
    from compactrl.sandbox.docker import DockerSandboxConfig
    from compactrl.tasksets.terminal_bench.image_build import build_task_image, task_build

    # bases the engine lacks: their family substitutes (base_families=True)
    kwargs: dict = {} if network == "none" else {"network": network}
    out: dict = {"base": _base(task)}
    started = time.monotonic()
    try:
        out["image"] = build_task_image(client, task.id, task_build(task), DockerSandboxConfig(**kwargs))
    except SandboxError as e:
        out.update(build_s=round(time.monotonic() - started, 1), error=str(e).splitlines()[0][:400])
        return out
    out["build_s"] = round(time.monotonic() - started, 1)
    out["grading"] = task.grading.mode
    out["gold"] = _episode(task, GoldPolicy(), "docker", kwargs)
    out["noop"] = _episode(task, NoopPolicy(), "docker", kwargs)
    return out


def run_local(folder: str) -> dict:
    """Load with the local backend's view (the Dockerfile replayed and cached, what cannot be replayed
    flagged before any episode), then gold and noop with each verdict's evidence."""
    started = time.monotonic()
    task = load_task_dir(folder, TerminalBenchConfig(backend="local", prepare=True))
    out: dict = {"grading": task.grading.mode, "check": task.check.kind, "prepare_s": round(time.monotonic() - started, 1),
                 "notes": [*task.grading.local_notes, *filter(None, [task.grading.note])]}
    if reason := not_gradable(task):
        out["not_gradable"] = reason
        return out
    for name, policy in (("gold", GoldPolicy()), ("noop", NoopPolicy())):
        out[name] = _local_episode(task, policy)
    return out


def _local_episode(task, policy) -> dict:
    from compactrl.sandbox.tb_verdict import reward_blocks

    started = time.monotonic()
    rec = run_task(task, policy, "local")
    info = rec.get("info") or {}
    output = record_output(info) or ""  # the whole log, however the record stores it (plain or gzip)
    ep = {"success": bool(rec["success"]), "seconds": round(time.monotonic() - started, 1),
          "sandbox_error": rec.get("sandbox_error"), "exit_code": info.get("test_exit_code"),
          "timed_out": bool(info.get("test_timed_out")), "limit_hit": info.get("test_limit_hit"),
          "summary": info.get("test_summary", "")[:600], "log_tail": "\n".join(info.get("test_log_tail", "").splitlines()[-6:])}
    if task.check.kind == "tbench":  # what the official grader is given, for the parity column
        ep["oracle_case"] = {"kind": "tbench", "output": output, "timed_out": ep["timed_out"]}
    elif task.check.kind == "harbor":
        ep["oracle_case"] = {"kind": "harbor", "files": reward_blocks(output), "timed_out": ep["timed_out"]}
    return ep


def official_verdicts(rows: list[dict], python: str) -> None:
    """Each local episode's verdict from the official grader (terminal-bench / Harbor) on the same output."""
    import subprocess

    cases = []
    for r in rows:
        for name in ("gold", "noop"):
            ep = (r.get("local") or {}).get(name) or {}
            if "oracle_case" in ep:
                cases.append({"id": f"{len(cases)}", **ep["oracle_case"]})
                ep["_oracle_id"] = cases[-1]["id"]
    if not cases or not python:
        return
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "terminal_bench_oracle.py")
    res = subprocess.run([python, script], input="".join(json.dumps(c) + "\n" for c in cases), capture_output=True,
                         text=True, timeout=1800)
    if res.returncode != 0:
        print(f"official graders unavailable: {res.stderr.strip()[-500:]}", flush=True)
        return
    got = {v["id"]: v for v in map(json.loads, res.stdout.splitlines())}
    for r in rows:
        for name in ("gold", "noop"):
            ep = (r.get("local") or {}).get(name) or {}
            if "_oracle_id" in ep:
                ep["official"] = got[ep.pop("_oracle_id")]
                ep["official_agrees"] = ep["official"]["resolved"] == ep["success"]


def _local_cell(loc: dict | None, key: str) -> str:
    if not loc:
        return "-"
    if loc.get("not_gradable"):
        return "not gradable"
    ep = loc[key]
    mark = "pass" if ep["success"] else ("error" if ep["sandbox_error"] else "fail")
    extra = [f"exit {ep['exit_code']}"] if ep.get("exit_code") not in (None, 0) else []
    extra += ["timed out"] if ep.get("timed_out") else []
    extra += [f"limit: {ep['limit_hit']}"] if ep.get("limit_hit") else []
    return f"{mark} ({ep['seconds']} s{', ' + ', '.join(extra) if extra else ''})"


def _parity(loc: dict | None) -> str:
    if not loc or loc.get("not_gradable"):
        return "-"
    marks = [("same" if loc[k]["official_agrees"] else "DIFFERENT") if "official_agrees" in loc[k] else "n/a"
             for k in ("gold", "noop")]
    return " / ".join(marks)


def local_table(rows: list[dict]) -> str:
    """The local backend's table: the counts first (all, 1.x, 2.x; median noop time), then verdicts, the
    official graders' verdicts on the same outputs, and each exception with its reason."""
    local = [r for r in rows if r.get("local")]

    def right(r: dict) -> bool:
        loc = r["local"]
        return not loc.get("not_gradable") and loc["gold"]["success"] and not loc["noop"]["success"]

    def count(subset: list[dict]) -> str:
        flagged = sum(1 for r in subset if r["local"].get("not_gradable"))
        return f"{sum(map(right, subset))} of {len(subset)} ({flagged} not gradable, {len(subset) - flagged - sum(map(right, subset))} wrong)"

    noop_s = sorted(r["local"]["noop"]["seconds"] for r in local if not r["local"].get("not_gradable"))
    agree = [ep.get("official_agrees") for r in local for ep in (r["local"].get("gold"), r["local"].get("noop"))
             if ep and "official_agrees" in ep]
    by_format = {f: [r for r in local if r["format"] == f] for f in sorted({r["format"] for r in local})}
    lines = [f"**Gold passes and noop fails on {count(local)}**; "
             + "; ".join(f"{f}: {count(sub)}" for f, sub in by_format.items())
             + f". Not-gradable tasks are flagged before any episode, with the reason below. Median noop "
               f"{noop_s[len(noop_s) // 2] if noop_s else '-'} s; the official graders agree on {sum(agree)} of "
               f"{len(agree)} verdicts.", "",
             "| task | format | grading | prepare s | local gold | local noop | official grader (gold / noop) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in local:
        loc = r["local"]
        lines.append(f"| {r['task']} | {r['format']} | {loc['check']} ({loc['grading']}) | {loc['prepare_s']} | "
                     f"{_local_cell(loc, 'gold')} | {_local_cell(loc, 'noop')} | {_parity(loc)} |")
    lines += ["", "Exceptions and their reasons:", ""]
    for r in local:
        loc = r["local"]
        if loc.get("not_gradable"):
            lines.append(f"* {r['task']}: not gradable: {loc['not_gradable']}")
        elif not loc["gold"]["success"] or loc["noop"]["success"]:
            bad = loc["gold"] if not loc["gold"]["success"] else loc["noop"]
            which = "gold failed" if not loc["gold"]["success"] else "noop passed"
            why = bad.get("sandbox_error") or bad.get("limit_hit") or bad["log_tail"].replace("\n", " | ")[-300:]
            lines.append(f"* {r['task']}: {which}: {why}")
    return "\n".join(lines) + "\n"


def _cell(res: dict | None, key: str) -> str:
    if not res:
        return "-"
    if "error" in res:
        return "not built"
    ep = res[key]
    mark = "pass" if ep["success"] else ("error" if ep["sandbox_error"] else "fail")
    return f"{mark} ({ep['seconds']} s)"


def table(rows: list[dict]) -> str:
    lines = ["| task | format | base image -> substitute | build s | docker gold | docker noop | local gold | local noop"
             " | grading (docker / local) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        d, loc = r.get("docker"), r.get("local")
        lines.append(f"| {r['task']} | {r['format']} | {d['base'] if d else '-'} | "
                     f"{d.get('build_s', '-') if d else '-'} | {_cell(d, 'gold')} | {_cell(d, 'noop')} | "
                     f"{_local_cell(loc, 'gold')} | {_local_cell(loc, 'noop')} | "
                     f"{(d or {}).get('grading', '-')} / {(loc or {}).get('grading', '-')} |")
    docker_rows = [r for r in rows if r.get("docker")]
    built = [r for r in docker_rows if "error" not in r["docker"]]
    right = [r for r in built if r["docker"]["gold"]["success"] and not r["docker"]["noop"]["success"]]
    both = [r for r in built if r.get("local") and not r["local"].get("not_gradable")]
    same = [r for r in both if all(r["docker"][k]["success"] == r["local"][k]["success"] for k in ("gold", "noop"))]
    lines += ["", f"Docker: {len(built)} of {len(docker_rows)} tasks built in their own images on family substitutes;"
              f" gold passes and noop fails on {len(right)};"
              + (f" the same gold and noop verdicts as the local backend on {len(same)} of the {len(both)} tasks both graded."
                 if both else ""), ""]
    notes = [f"* {r['task']}: docker: not built: {r['docker']['error']}" for r in docker_rows if "error" in r["docker"]]
    for r in built:
        d = r["docker"]
        if not d["gold"]["success"] or d["noop"]["success"]:
            bad, which = (d["gold"], "gold failed") if not d["gold"]["success"] else (d["noop"], "noop passed")
            why = bad.get("sandbox_error") or (bad.get("log_tail") or bad["summary"]).replace("\n", " | ")[-300:]
            notes.append(f"* {r['task']}: docker: {which}: {why}")
    for r in both:
        if r not in same:
            notes.append(f"* {r['task']}: docker and local verdicts differ (gold {d_l(r, 'gold')}, noop {d_l(r, 'noop')})")
    return "\n".join(lines + notes) + "\n"


def d_l(r: dict, key: str) -> str:
    """``docker/local`` verdicts of one policy."""
    return "/".join("pass" if r[b][key]["success"] else "fail" for b in ("docker", "local"))


def _keep(out: str, row: dict) -> None:
    """One finished row, appended to ``OUT.jsonl`` at once (``--resume`` reuses it) and printed."""
    with open(out + ".jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks-root", required=True, help="folder holding the TASKS folders")
    parser.add_argument("--backends", default="docker,local")
    parser.add_argument("--only", default="", help="comma-separated task folders (default: all of TASKS)")
    parser.add_argument("--tasks-file", default="", help="JSON list of {path, format, source_repo, commit} "
                        "(benchmarks/data/terminal_bench_real.tasks.json) instead of TASKS")
    parser.add_argument("--out", default="benchmarks/results/terminal_bench_real")
    parser.add_argument("--compare-local", default="", help="OUT.json of an earlier --backends local run: its local "
                        "records fill the local columns, so a docker-only run is compared with them")
    parser.add_argument("--oracle-python", default=os.environ.get("COMPACTRL_TB_ORACLE_PYTHON", ""),
                        help="interpreter with terminal-bench and harbor installed: the official graders' verdicts "
                             "on the local outputs (benchmarks/terminal_bench_oracle.py)")
    parser.add_argument("--download-cache", default=os.environ.get("COMPACTRL_DOWNLOAD_CACHE", ""),
                        help="things fetched ahead for the local backend's prepare: DIR/git/<host>/<owner>/<name>.git "
                             "bare mirrors of the repositories Dockerfile steps clone (TerminalBenchConfig.download_cache)")
    parser.add_argument("--docker-network", default="none", help="network mode of the docker episodes "
                        "(DockerSandboxConfig.network): 'none' (default) or e.g. 'bridge', as the harness runs them")
    parser.add_argument("--resume", action="store_true", help="keep the rows an earlier run of the same --out "
                        "finished (OUT.jsonl, written row by row) and run only the others")
    args = parser.parse_args()
    if args.download_cache:
        os.environ["COMPACTRL_DOWNLOAD_CACHE"] = os.path.abspath(args.download_cache)
    load_before = os.getloadavg()
    started = time.monotonic()
    backends = args.backends.split(",")
    client = None
    if "docker" in backends:
        import docker

        client = docker.from_env(timeout=1800)
    tasks = TASKS
    if args.tasks_file:
        with open(args.tasks_file) as fh:
            tasks = [(e["path"], f"{e['source_repo']}@{e['commit'][:8]} ({e['format']})") for e in json.load(fh)]
    done: dict[str, dict] = {}
    if args.resume and os.path.exists(args.out + ".jsonl"):  # rows finished by an earlier, stopped run
        with open(args.out + ".jsonl") as fh:
            done = {r["task"]: r for r in map(json.loads, filter(str.strip, fh))}
    elif os.path.exists(args.out + ".jsonl"):
        os.remove(args.out + ".jsonl")
    earlier = {}
    if args.compare_local:
        with open(args.compare_local) as fh:
            earlier = {r["task"]: r["local"] for r in json.load(fh) if r.get("local")}
    rows = []
    for rel, source in tasks:
        if args.only and rel not in args.only.split(","):
            continue
        if rel in done:
            rows.append(done[rel])
            continue
        folder = os.path.join(args.tasks_root, rel)
        try:
            # grading auto also with --docker-network: the scripts' installers (astral.sh's uv) are not reachable
            # from every machine that reaches PyPI and Debian's mirror
            task = load_task_dir(folder)
        except TerminalBenchError as e:  # not valid as published, or a form the loader does not take (said in e)
            row = {"task": rel, "format": source.rsplit("(", 1)[-1].rstrip(")") if "(" in source else "?",
                   "source": source, "invalid": str(e)}
            if "local" in backends:  # listed with the exceptions, its reason the loader's error
                row["local"] = {"grading": "-", "check": "-", "prepare_s": 0.0, "notes": [],
                                "not_gradable": f"not loaded: {e}"}
            rows.append(row)
            _keep(args.out, row)
            continue
        row = {"task": rel, "format": f"{task.origin['terminal_bench']['version']}.x", "source": source}
        if client is not None:
            row["docker"] = run_docker(task, client, args.docker_network)
        if "local" in backends:
            row["local"] = run_local(folder)
        elif earlier.get(rel):
            row["local"] = earlier[rel]
        rows.append(row)
        _keep(args.out, row)
    official_verdicts(rows, args.oracle_python)
    for r in rows:  # the outputs went to the graders; the records keep the verdicts
        for ep in ((r.get("local") or {}).get("gold"), (r.get("local") or {}).get("noop")):
            if ep:
                ep.pop("oracle_case", None)
    import sys

    header = (f"Command: `python benchmarks/terminal_bench_real.py {' '.join(sys.argv[1:])}`; "
              f"{os.cpu_count()} CPUs, load average {load_before[0]:.1f} at the start and {os.getloadavg()[0]:.1f} at "
              f"the end; {time.monotonic() - started:.0f} s in all.\n\n")
    text = header + (table(rows) + "\n" if client is not None else "") + local_table(rows)
    with open(args.out + ".json", "w") as fh:
        json.dump(rows, fh, indent=1)
    with open(args.out + ".md", "w") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    main()
