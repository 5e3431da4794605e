"""The main job (``compactrl train`` on its embedded defaults) over several seeds: the README's figure.

Each seed is the exact command a user runs, ``compactrl train --seed N --out OUT/seed-N``, in a
process of its own, one after the other (each uses both cores). A finished seed (its ``report.md``
written) is never run again; an unfinished one is resumed from its last checkpoint, so the command
can be stopped and started again at any point. While a seed runs, the 1-minute load average is
sampled every 10 s, so the table says what else the machine was doing. The results name the machine
(CPU model, instruction-set flags, torch's kernel level, threads, library versions) from each run's
``environment.json``: absolute figures differ between CPUs whose float kernels differ (AVX-512 vs
AVX2), so compare only rows from one kind of CPU::

    python benchmarks/main_job_seeds.py --seeds 0,1,2,3 --out runs/main-seeds \\
        --results benchmarks/results/main_job_seeds            # writes .json and .md
    python benchmarks/main_job_seeds.py ... --table-only       # re-render from the run directories
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from compactrl.training.run_dir import RunDir


def run_seed(seed: int, out: Path, extra: list[str]) -> dict:
    """Run (or resume, or skip when finished) one seed; return its load samples of this call."""
    run_dir = out / f"seed-{seed}"
    if (run_dir / "report.md").exists():
        return {"seed": seed, "skipped": True}
    cmd = [sys.executable, "-m", "compactrl.cli", "train", "--seed", str(seed), "--out", str(run_dir),
           "--no-progress", *extra]
    if (run_dir / "config.json").exists():
        cmd = [sys.executable, "-m", "compactrl.cli", "train", "--resume", "--out", str(run_dir), "--no-progress"]
    loads: list[float] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            loads.append(os.getloadavg()[0])
            stop.wait(10)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.time()
    try:
        subprocess.run(cmd, check=True)
    finally:
        stop.set()
        sampler.join()
    record = {"seed": seed, "command": " ".join(cmd[2:]), "started_utc": _utc(t0), "ended_utc": _utc(time.time()),
              "load_min": min(loads), "load_max": max(loads), "load_mean": statistics.fmean(loads)}
    (run_dir / "seed_run.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def summarize(out: Path, seeds: list[int]) -> dict:
    """Per-seed held-out success after SFT and after RL, the gain, wall-clock, load and machine."""
    rows = []
    for seed in seeds:
        run = RunDir(out / f"seed-{seed}")
        if not (run.path / "report.md").exists():
            continue
        all_rows = run.rows()
        metrics = [r for r in all_rows if r.get("eval/success_rate") is not None]
        load = json.loads((run.path / "seed_run.json").read_text()) if (run.path / "seed_run.json").exists() else {}
        machines = run.machines()
        rows.append({"seed": seed, "sft": metrics[0]["eval/success_rate"], "final": metrics[-1]["eval/success_rate"],
                     "gain": metrics[-1]["eval/success_rate"] - metrics[0]["eval/success_rate"],
                     "curve": {str(r["iteration"]): r["eval/success_rate"] for r in metrics},
                     "wall_clock_min": all_rows[-1].get("time/wall_clock_s", float("nan")) / 60,
                     "load": {k: load.get(k) for k in ("load_min", "load_mean", "load_max", "started_utc", "ended_utc")},
                     "machine": machines[0] if machines else None,
                     "resumed": len(machines) > 1})
    agg = {}
    for key in ("sft", "final", "gain"):
        xs = [r[key] for r in rows]
        if xs:
            agg[key] = {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                        "min": min(xs), "max": max(xs)}
    return {"seeds": rows, "aggregate": agg}


def markdown(summary: dict, command: str) -> str:
    rows, agg = summary["seeds"], summary["aggregate"]
    machines = {json.dumps({k: r["machine"]["cpu"][k] for k in ("model", "isa_flags", "torch_capability")}, sort_keys=True)
                for r in rows if r["machine"]}
    lines = ["# The main job over seeds", "", f"Command: `{command}`", "",
             "| seed | after SFT | after RL | gain | wall-clock (min) | load 1-min (min / mean / max) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        ld = r["load"]
        load = (f"{ld['load_min']:.1f} / {ld['load_mean']:.1f} / {ld['load_max']:.1f}"
                if ld.get("load_min") is not None else "n/a")
        lines.append(f"| {r['seed']} | {r['sft']:.3f} | {r['final']:.3f} | {r['gain']:+.3f} | "
                     f"{r['wall_clock_min']:.1f}{' (resumed)' if r['resumed'] else ''} | {load} |")
    if agg:
        lines += ["", f"Over {len(rows)} seeds: after SFT {agg['sft']['mean']:.3f} (sd {agg['sft']['sd']:.3f}), "
                      f"after RL {agg['final']['mean']:.3f} (sd {agg['final']['sd']:.3f}), gain "
                      f"**{agg['gain']['mean']:+.3f}** (sd {agg['gain']['sd']:.3f}, range {agg['gain']['min']:+.3f} to "
                      f"{agg['gain']['max']:+.3f}).", ""]
    for m in sorted(machines):
        cpu = json.loads(m)
        lines.append(f"Machine: {cpu['model']}, torch kernels {cpu['torch_capability']}, flags "
                     f"{' '.join(cpu['isa_flags'])}.")
    if rows and rows[0]["machine"]:
        stamp = rows[0]["machine"]
        lines += ["", f"Commit `{stamp['commit']}`; " + ", ".join(f"{k} {v}" for k, v in stamp["libraries"].items()),
                  ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2,3", help="comma-separated seeds (default: 0,1,2,3)")
    p.add_argument("--out", required=True, help="folder of the runs (seed-N each)")
    p.add_argument("--results", default=None, help="write RESULTS.json and RESULTS.md")
    p.add_argument("--table-only", action="store_true", help="only re-render the results from the runs")
    args, extra = p.parse_known_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/main_job_seeds.py " + " ".join(argv if argv is not None else sys.argv[1:])
    for seed in seeds if not args.table_only else []:
        run_seed(seed, out, extra)
        _write(args.results, summarize(out, seeds), command)
    summary = summarize(out, seeds)
    _write(args.results, summary, command)
    print(markdown(summary, command))  # noqa: T201
    return 0


def _write(results: str | None, summary: dict, command: str) -> None:
    if results:
        Path(f"{results}.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
        Path(f"{results}.md").write_text(markdown(summary, command))


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


if __name__ == "__main__":
    sys.exit(main())
