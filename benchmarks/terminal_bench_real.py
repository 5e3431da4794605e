"""Real Terminal-Bench task folders (1.x and 2.x): gold must succeed and noop must fail, on the
docker backend (each task in its own image, built from its Dockerfile) and on the local backend.

    python benchmarks/terminal_bench_real.py --tasks-root /work/data/tb/src [--backends docker,local]
        [--only NAME,...] [--out benchmarks/results/terminal_bench_real]

The folders are not vendored (benchmark data with a canary); TASKS says where each comes from.
``docker`` needs an engine (``DOCKER_HOST``; ``scripts/ci_docker.sh`` starts Podman's). Base images
the engine lacks (no registry is reachable here but Debian's and Ubuntu's mirrors, PyPI, npm and the
Go module proxy) are replaced by their family substitutes (``compactrl.envs.sandbox.base_images``,
built on first use, cached); the table names each base's substitute and how it differs, or why a
base has none. ``--tasks-file`` reads the task list from a JSON list of ``{"path", "format",
"source_repo", "commit"}`` (``benchmarks/data/terminal_bench_real.tasks.json``) instead of TASKS.
Writes ``OUT.md`` (the table) and ``OUT.json`` (every record).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from compactrl.envs.loaders.terminal_bench import TerminalBenchConfig, load_task_dir
from compactrl.eval import run_task
from compactrl.policies.scripted_gold import GoldPolicy, NoopPolicy

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
    from compactrl.envs.sandbox import base_images
    from compactrl.envs.sandbox.docker import dockerfile_bases

    build = task.metadata.get("image_build")
    if not build:
        return "-"
    with open(build["dockerfile"]) as fh:
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
    return {"success": bool(rec["success"]), "seconds": round(time.monotonic() - started, 1),
            "sandbox_error": rec.get("sandbox_error"), "summary": (rec.get("info") or {}).get("test_summary", "")[:600]}


def run_docker(task, client) -> dict:
    from compactrl.envs.sandbox.base import SandboxError
    from compactrl.envs.sandbox.docker import DockerSandboxConfig, build_task_image

    kwargs: dict = {}  # bases the engine lacks: their family substitutes (base_families=True)
    out: dict = {"base": _base(task)}
    started = time.monotonic()
    try:
        out["image"] = build_task_image(client, task.id, task.metadata["image_build"], DockerSandboxConfig(**kwargs))
    except SandboxError as e:
        out.update(build_s=round(time.monotonic() - started, 1), error=str(e).splitlines()[0][:400])
        return out
    out["build_s"] = round(time.monotonic() - started, 1)
    out["grading"] = task.metadata["grading"]
    out["gold"] = _episode(task, GoldPolicy(), "docker", kwargs)
    out["noop"] = _episode(task, NoopPolicy(), "docker", kwargs)
    return out


def run_local(folder: str) -> dict:
    # the local python has no pytest plugins the images install (e.g. pytest-json-ctrf for --ctrf):
    # 2.x tasks are graded there with pytest on tests/, which is what their test.sh runs
    task = load_task_dir(folder)
    grading = "pytest" if task.metadata["terminal_bench"]["version"] == 2 else "auto"
    task = load_task_dir(folder, TerminalBenchConfig(grading=grading))
    return {"grading": task.metadata["grading"], "gold": _episode(task, GoldPolicy(), "local", {}),
            "noop": _episode(task, NoopPolicy(), "local", {})}


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
                     f"{_cell(loc, 'gold')} | {_cell(loc, 'noop')} | "
                     f"{(d or {}).get('grading', '-')} / {(loc or {}).get('grading', '-')} |")
    notes = [f"* {r['task']}: docker: {r['docker']['error']}" for r in rows if "error" in (r.get("docker") or {})]
    notes += [f"* {r['task']}: local gold failed: {r['local']['gold']['summary'].splitlines()[-1]}"
              for r in rows if r.get("local") and not r["local"]["gold"]["success"]]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks-root", required=True, help="folder holding the TASKS folders")
    parser.add_argument("--backends", default="docker,local")
    parser.add_argument("--only", default="", help="comma-separated task folders (default: all of TASKS)")
    parser.add_argument("--tasks-file", default="", help="JSON list of {path, format, source_repo, commit} "
                        "(benchmarks/data/terminal_bench_real.tasks.json) instead of TASKS")
    parser.add_argument("--out", default="benchmarks/results/terminal_bench_real")
    args = parser.parse_args()
    backends = args.backends.split(",")
    client = None
    if "docker" in backends:
        import docker

        client = docker.from_env(timeout=1800)
    tasks = TASKS
    if args.tasks_file:
        with open(args.tasks_file) as fh:
            tasks = [(e["path"], f"{e['source_repo']}@{e['commit'][:8]} ({e['format']})") for e in json.load(fh)]
    rows = []
    for rel, source in tasks:
        if args.only and rel not in args.only.split(","):
            continue
        folder = os.path.join(args.tasks_root, rel)
        task = load_task_dir(folder)
        row = {"task": rel, "format": f"{task.metadata['terminal_bench']['version']}.x", "source": source}
        if client is not None:
            row["docker"] = run_docker(task, client)
        if "local" in backends:
            row["local"] = run_local(folder)
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out + ".json", "w") as fh:
        json.dump(rows, fh, indent=1)
    with open(args.out + ".md", "w") as fh:
        fh.write(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
