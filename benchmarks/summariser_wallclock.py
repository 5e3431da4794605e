"""Learned compaction against a frozen summariser, in wall-clock: per solved task, the summary calls'
latency distribution and the summaries' share of generation time, at equal training budget.

    python benchmarks/summariser_wallclock.py --out benchmarks/results/summariser_wallclock --seeds 4 --resume

Two arms of the boundary experiment on its ``default`` regime (full budget: 4 policy iterations x 16
episodes from the committed SFT model): ``learned`` (critic PPO, bootstrap, summaries trained) and
``frozen`` (the same, summaries written by a frozen copy of the SFT model and masked out of the loss).
Each final model plays the 64 held-out tasks greedily (the frozen arm with its frozen summariser, as in
training), one process, 2 torch threads. A summary call's latency is the wall-clock of the batched
generation round that wrote it (the time the agent waits); with a frozen summariser a round that holds
summary and action requests runs the two models one after the other.
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import boundary_experiment as be  # noqa: E402  (one cell runner, one set of statistics)

REGIME = "default"
ARMS = {"learned": be.ARMS["ppo_bootstrap"], "frozen": be.ARMS["frozen_summarizer"]}
SFT_OUT = Path(__file__).resolve().parent / "results" / "boundary_experiment"


def quantile(xs: list[float], q: float) -> float:
    """Nearest-rank quantile of ``xs`` (nan for none)."""
    xs = sorted(xs)
    return xs[max(0, math.ceil(q * len(xs)) - 1)] if xs else float("nan")


def cell_figures(cell: dict) -> dict[str, float]:
    """One cell's figures: held-out success, held-out wall-clock per solved task (the final evaluation's
    seconds over its successes; inf with none), summary latency median / p90 over the held-out calls and
    calls per episode, the summaries' share of training generation time, the training iteration's seconds."""
    eps = cell["episodes"]
    solved = sum(e[1] for e in eps)
    lat = [x for e in eps for x in (e[3] if len(e) > 3 else [])]
    t = cell.get("timing", {})
    return {"success": solved / len(eps), "eval_s_per_solved": cell["final_eval_s"] / solved if solved else math.inf,
            "summary_latency_p50_s": quantile(lat, 0.5), "summary_latency_p90_s": quantile(lat, 0.9),
            "summary_calls_per_episode": len(lat) / len(eps),
            "summary_time_share": cell.get("train_summary_time_share", float("nan")),
            "iteration_s": t.get("time/iteration_s", float("nan"))}


def summarize(cells: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm in ARMS:
        mine = be.arm_seeds(cells, arm)
        if not mine:
            continue
        figs = [cell_figures(c) for c in mine]
        lat = [x for c in mine for e in c["episodes"] for x in (e[3] if len(e) > 3 else [])]
        out[arm] = {"seeds": [c["seed"] for c in mine], "per_seed": figs,
                    **{k: be.interval([f[k] for f in figs]) for k in figs[0] if all(math.isfinite(f[k]) for f in figs)},
                    "latency_pooled": {"calls": len(lat), "p50": quantile(lat, 0.5), "p90": quantile(lat, 0.9),
                                       "p99": quantile(lat, 0.99), "max": max(lat, default=float("nan"))}}
    if "learned" in out and "frozen" in out:
        out["paired"] = {}
        for k in ("success", "eval_s_per_solved", "summary_latency_p50_s", "summary_time_share"):
            per_seed = {a: {s: f[k] for s, f in zip(out[a]["seeds"], out[a]["per_seed"])} for a in ARMS}
            finite = all(math.isfinite(x) for a in ARMS for x in per_seed[a].values())
            if finite and (d := be.paired_by_seed(per_seed["learned"], per_seed["frozen"])):
                out["paired"][k] = d
    return out


def train_share(cell_rows: list[dict]) -> float:
    """The summaries' share of the policy iterations' generation time (summed seconds)."""
    iters = [r for r in cell_rows if r.get("iteration", 0) > 0]
    summ = sum(r.get("time/summary_s", 0.0) for r in iters)
    gen = summ + sum(r.get("time/generate_s", 0.0) for r in iters)
    return summ / gen if gen else float("nan")


def markdown(results: dict[str, Any]) -> str:
    f = be.fmt_interval
    lines = [f"Learned vs frozen summariser: {results['config_summary']}.", "",
             "| arm | seeds | held-out success | held-out s per solved task | summary latency p50 s | p90 s "
             "| summary calls / episode | summaries' share of training generation time | training iteration s "
             "| pooled latency p50 / p90 / p99 / max s (calls) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        if arm not in results["arms"]:
            continue
        r, p = results["arms"][arm], results["arms"][arm]["latency_pooled"]
        lines.append(f"| {arm} | {len(r['seeds'])} | {f(r.get('success'))} | {f(r.get('eval_s_per_solved'), '{:.2f}')} | "
                     f"{f(r.get('summary_latency_p50_s'), '{:.3f}')} | {f(r.get('summary_latency_p90_s'), '{:.3f}')} | "
                     f"{f(r.get('summary_calls_per_episode'), '{:.2f}')} | {f(r.get('summary_time_share'))} | "
                     f"{f(r.get('iteration_s'), '{:.1f}')} | {p['p50']:.3f} / {p['p90']:.3f} / {p['p99']:.3f} / "
                     f"{p['max']:.3f} ({p['calls']}) |")
    lines += ["", *be.paired_lines(results["arms"].get("paired", {}), "learned - frozen"), "",
              be.provenance_line(results)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import logging

    from compactrl.provenance import cpu_model
    from compactrl.training.run_dir import RunDir

    p = be.arms_parser(__doc__.splitlines()[0], "runs/summariser_wallclock")
    p.add_argument("--jobs", type=int, default=1, help="cells run in parallel, one torch thread each")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out, t0 = be.start_arms(args)
    threads = 1 if args.jobs > 1 else 2
    base = be.regime_config("full", REGIME, threads, be.parse_sets(args.set))
    cells = be.arm_cells(out, REGIME, base, ARMS, args.seeds, be.sft_model_of(REGIME, SFT_OUT),
                         final_episodes=args.final_episodes, jobs=args.jobs, threads=threads)
    for c in cells:  # the summaries' share of training generation time, from the run's rows (kept on disk)
        run_dir = out / c["arm"] / f"seed{c['seed']}"
        if "train_summary_time_share" not in c and (run_dir / "metrics.jsonl").exists():
            c["train_summary_time_share"] = train_share(RunDir(run_dir).rows())
            be.write_json(out / "cells" / f"{c['arm']}__seed{c['seed']}.json", c)
    results = {
        "command": " ".join(["python benchmarks/summariser_wallclock.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": f"{cpu_model()}, {os.cpu_count()} CPUs, {args.jobs} jobs, {platform.machine()}",
        "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "config_summary": (f"{REGIME}, {base.rl.iterations} policy iterations x {base.rl.episodes_per_iter} episodes, "
                           f"{args.final_episodes} held-out tasks at the end, {args.seeds} seeds"),
        "cell_machines": be.cell_machines(cells), "arms": summarize(cells), "wall_clock_s": time.perf_counter() - t0,
    }
    return be.write_results(out, results, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
