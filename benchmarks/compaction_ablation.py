"""Does learned compaction work? Five (or six) ways to train from the same SFT checkpoint.

From one SFT checkpoint and the same RL budget (iterations x episodes per iteration), train:

=====================  =========================================================================
arm                    what changes
=====================  =========================================================================
ppo_bootstrap          critic PPO, GAE runs across trace boundaries (a summary's last token is
                       valued by the next trace's first token)
ppo_cut                critic PPO, GAE restarts at every trace; each trace ends with the
                       rollout's reward (what other frameworks do)
grpo                   group-normalised outcome advantage on every policy token (4 rollouts/task)
ppo_frozen_summarizer  summaries are written by a frozen copy of the SFT model (separate weights)
                       and masked out of the loss: the summariser cannot improve
ppo_masked_summaries   (full run only) summary tokens masked out of the loss but written by the
                       shared, trained weights: masking is not freezing
ppo_no_budget          trained with a budget so large that no compaction happens, evaluated with
                       the serving budget (train-serve skew)
=====================  =========================================================================

Every arm is evaluated on the same held-out tasks (``split="test"``, fixed task seeds, greedy
decoding) with the serving ContextBudget wrapper. Reported per arm: held-out success (mean over
seeds with a 95% t-interval, and pooled over all episodes with a Wilson interval), summary tokens
per episode, the share of generated tokens spent on summaries, generation time spent on
summaries per episode, and wall-clock per episode.

Run (one command, from an existing SFT model on a 2-core CPU: ``--preset main`` -- the main job's
RL budget, 6 iterations x 32 episodes, the critic alone for the first 2 -- took 45 min for all six
arms; ``--quick`` -- 7 iterations x 16 episodes, the critic alone for the first -- 48 min for five
arms on a slower machine; the default ``ablation`` preset -- 12 iterations x 32 episodes,
evaluations at 6 and 12 -- 48 min for two arms, so ~2.5 h for all six)::

    python benchmarks/compaction_ablation.py --preset main --sft-model runs/main/sft_model --out runs/ablation-main
    python benchmarks/compaction_ablation.py --out runs/ablation
    python benchmarks/compaction_ablation.py --quick --out runs/ablation-quick
    python benchmarks/compaction_ablation.py --sft-model runs/main/sft_model   # reuse an SFT checkpoint
    python benchmarks/compaction_ablation.py --arms ppo_bootstrap,ppo_cut --sft-model runs/main/sft_model

Writes ``results.json`` (every run's final evaluation and learning curve) and ``results.md`` (the
table) into ``--out``; each arm's run directory (metrics, plots, report) is kept under it. Runs that
finished are not redone: the same command again resumes an interrupted experiment, or re-renders
the table. The controls (frozen summariser, masked summaries, no budget) use ``bootstrap`` GAE.

On Ray (docs/distributed.md), the arm x seed runs are Ray tasks, at most ``--jobs`` at once, each
reserving the preset's ``threads`` CPUs; a run that finished (its ``report.md`` exists) is never
started again, and one interrupted resumes from its last checkpoint. The SFT checkpoint is made
first, in this process. On a cluster ``--out`` (and ``--sft-model``) must be on a filesystem every
node sees at the same path::

    python benchmarks/compaction_ablation.py --ray --jobs 2 --out runs/ablation            # a local Ray
    python benchmarks/compaction_ablation.py --ray-address auto --jobs 48 --seeds 8 --out /shared/ablation
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("compaction_ablation")

ARMS: dict[str, dict[str, Any]] = {
    "ppo_bootstrap": {"rl.algo": "ppo", "rl.boundary": "bootstrap"},
    "ppo_cut": {"rl.algo": "ppo", "rl.boundary": "cut"},
    "grpo": {"rl.algo": "grpo"},  # group size: 4 rollouts per task (fewer if the batch is smaller)
    # the controls use bootstrap GAE, as when they were first measured (the main preset now uses cut)
    "ppo_frozen_summarizer": {"rl.algo": "ppo", "rl.boundary": "bootstrap", "rl.frozen_summarizer": True,
                              "rl.ppo.train_summaries": False},
    "ppo_masked_summaries": {"rl.algo": "ppo", "rl.boundary": "bootstrap", "rl.ppo.train_summaries": False},
    "ppo_no_budget": {"rl.algo": "ppo", "rl.boundary": "bootstrap", "env.context_budget.budget": 4096},
}
QUICK_ARMS = ("ppo_bootstrap", "ppo_cut", "grpo", "ppo_frozen_summarizer", "ppo_no_budget")

_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval of ``xs`` (the spread between seeds)."""
    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = _T975.get(n - 1, 1.96) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion (pooled episodes)."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def base_config(quick: bool, serving_budget: int | None, preset_name: str = "ablation"):
    from compactrl.training.config import override, preset

    cfg = preset(preset_name)
    changes: dict[str, Any] = {}
    if quick:
        changes.update({"rl.iterations": 7, "rl.episodes_per_iter": 16, "rl.critic_pretrain_steps": 4,
                        "eval.episodes": 64, "eval.every": 7})
    if serving_budget:
        changes["env.context_budget.budget"] = serving_budget
    return override(cfg, changes) if changes else cfg


def arm_config(base, arm: str, seed: int, sft_model: str):
    from compactrl.training.config import override

    changes = dict(ARMS[arm])
    changes.update({"seed": seed, "model.pretrained": sft_model, "sft.enabled": False, "eval.initial": False})
    if "env.context_budget.budget" in changes:  # trained without compaction, evaluated with the serving budget
        changes["eval.context_budget"] = base.env.context_budget.budget
    if changes.get("rl.algo") == "grpo":
        changes["rl.group_size"] = min(4, base.rl.episodes_per_iter)
    return override(base, changes)


def make_sft_checkpoint(base, out: Path, existing: str | None) -> tuple[str, dict[str, float]]:
    """Run the SFT warm start once (or load ``existing``), with no RL iterations, and evaluate it.

    Returns the SFT model directory and the evaluation row (iteration 0).
    """
    from compactrl.training.config import override
    from compactrl.training.run_dir import RunDir
    from compactrl.training.trainer import train

    run_dir = out / "sft"
    changes: dict[str, Any] = {"rl.iterations": 0}
    if existing:
        changes.update({"model.pretrained": existing, "sft.enabled": False})
    if not (run_dir / "report.md").exists():
        train(override(base, changes), run_dir, resume=(run_dir / "checkpoint.pt").exists())
    row0 = RunDir(run_dir).rows()[0]
    return existing or str(run_dir / "sft_model"), row0


def run_cell(spec: dict[str, Any]) -> str:
    """Train (or resume) one arm x seed run; its ``report.md`` marks it finished. Returns the run dir."""
    from compactrl.training.config import TrainConfig
    from compactrl.training.trainer import train

    run_dir = Path(spec["run_dir"])
    train(TrainConfig.from_dict(json.loads(spec["config"])), run_dir, resume=(run_dir / "checkpoint.pt").exists())
    return spec["run_dir"]


def cell_finished(spec: dict[str, Any]) -> bool:
    return (Path(spec["run_dir"]) / "report.md").exists()


def run_cells(specs: list[dict[str, Any]], *, ray_address: str | None, jobs: int, num_cpus: float) -> list[str]:
    """Run every unfinished cell, in this process (``ray_address`` None) or as Ray tasks ("" = a local Ray).

    Returns the run dirs this call trained (finished cells are skipped).
    """
    if ray_address is None:
        todo = [spec for spec in specs if not cell_finished(spec)]
        return [run_cell(spec) for spec in todo]
    import sys

    import ray.cloudpickle

    from compactrl.distributed import ray_for_run, run_on_ray

    if __name__ != "__main__":  # imported (tests): the workers cannot import this script by name
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with ray_for_run(ray_address):
        ran = run_on_ray(run_cell, specs, max_concurrency=jobs, done=cell_finished, num_cpus=num_cpus)
    return [r for r in ran if r is not None]


def summarize_run(run_dir: Path) -> dict[str, Any]:
    from compactrl.training.run_dir import RunDir

    rows = RunDir(run_dir).rows()
    final = next(r for r in reversed(rows) if "eval/success_rate" in r)
    curve = [(r["iteration"], r["eval/success_rate"]) for r in rows if "eval/success_rate" in r]
    train_curve = [(r["iteration"], r.get("train/success_rate")) for r in rows if r["iteration"] > 0]
    keys = ("success_rate", "episodes", "summary_tokens_per_episode", "summary_token_share",
            "summary_gen_time_per_episode_s", "summary_time_share", "wall_clock_per_episode_s",
            "traces_per_episode", "generated_tokens_per_episode", "truncated_rate")
    return {
        "final": {k: final.get(f"eval/{k}") for k in keys},
        "eval_curve": curve,
        "train_success_curve": train_curve,
        "train_compactions_per_episode": sum(r.get("train/compactions_per_episode", 0.0) for r in rows[1:])
        / max(1, len(rows) - 1),
        "wall_clock_s": rows[-1].get("time/wall_clock_s"),
    }


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    succ = [r["final"]["success_rate"] for r in runs]
    mean, lo, hi = t_interval(succ)
    n_eps = [int(r["final"]["episodes"]) for r in runs]
    k = sum(round(s * n) for s, n in zip(succ, n_eps))
    pooled_lo, pooled_hi = wilson(k, sum(n_eps))

    def avg(key):
        vals = [r["final"][key] for r in runs if r["final"].get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    by_iteration: dict[int, list[float]] = {}
    for r in runs:
        for it, rate in r["eval_curve"]:
            by_iteration.setdefault(int(it), []).append(rate)
    return {
        "seeds": len(runs), "success_mean": mean, "success_ci95": [lo, hi], "success_per_seed": succ,
        "success_by_iteration": {it: sum(v) / len(v) for it, v in sorted(by_iteration.items()) if len(v) == len(runs)},
        "pooled_success_ci95": [pooled_lo, pooled_hi], "episodes_total": sum(n_eps),
        "summary_tokens_per_episode": avg("summary_tokens_per_episode"),
        "summary_token_share": avg("summary_token_share"),
        "summary_gen_time_per_episode_s": avg("summary_gen_time_per_episode_s"),
        "summary_time_share": avg("summary_time_share"),
        "wall_clock_per_episode_s": avg("wall_clock_per_episode_s"),
        "traces_per_episode": avg("traces_per_episode"),
        "train_compactions_per_episode": sum(r["train_compactions_per_episode"] for r in runs) / len(runs),
        "run_wall_clock_s": sum(r["wall_clock_s"] or 0 for r in runs) / len(runs),
    }


def markdown_table(results: dict[str, Any]) -> str:
    sft = results["sft"]
    lines = [
        f"Held-out success (test split, {results['eval_episodes']} tasks, greedy) after "
        f"{results['rl_iterations']} RL iterations x {results['episodes_per_iter']} episodes, from one SFT "
        f"checkpoint (held-out success after SFT: {sft['success_rate']:.3f}); {results['seeds']} seeds per arm.",
        "",
        "| arm | success (mean over seeds) | 95% CI (seeds, t) | 95% CI (pooled, Wilson) | per seed | "
        "summary tok/ep | summary share of gen. tokens | summary gen. time/ep (s) | wall-clock/ep (s) | "
        "compactions/ep in training | mean success at earlier evaluations |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, a in results["arms"].items():
        earlier = [(int(it), v) for it, v in a.get("success_by_iteration", {}).items()
                   if int(it) != results["rl_iterations"]]
        lines.append(
            f"| {arm} | {a['success_mean']:.3f} | [{a['success_ci95'][0]:.3f}, {a['success_ci95'][1]:.3f}] | "
            f"[{a['pooled_success_ci95'][0]:.3f}, {a['pooled_success_ci95'][1]:.3f}] | "
            f"{', '.join(f'{s:.2f}' for s in a['success_per_seed'])} | {a['summary_tokens_per_episode']:.1f} | "
            f"{a['summary_token_share']:.3f} | {a['summary_gen_time_per_episode_s']:.3f} | "
            f"{a['wall_clock_per_episode_s']:.2f} | {a['train_compactions_per_episode']:.2f} | "
            f"{', '.join(f'it. {it}: {v:.3f}' for it, v in earlier) or '-'} |"
        )
    runs_s = sum(r.get("wall_clock_s") or 0.0 for rs in results["runs"].values() for r in rs)
    lines += ["", f"Command: `{results['command']}`; wall-clock of this invocation {results['wall_clock_s'] / 60:.1f} "
              f"min, of the arms' runs {runs_s / 60:.1f} min in all ({results['machine']})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import os
    import platform
    import sys

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/ablation", help="output directory (results.json, results.md, runs)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm")
    p.add_argument("--quick", action="store_true", help="shorter RL phase and fewer evaluation episodes")
    p.add_argument("--arms", default=None, help="comma-separated subset of arms (default: all; --quick: five)")
    p.add_argument("--sft-model", default=None, help="an existing SFT model directory to start every arm from")
    p.add_argument("--budget", type=int, default=None, help="serving context budget (default: the preset's)")
    p.add_argument("--preset", default="ablation", help="training preset every arm starts from (smoke: CI)")
    p.add_argument("--ray", action="store_true", help="run the arm x seed cells as tasks on a local Ray")
    p.add_argument("--ray-address", default=None, help="run the cells on this Ray cluster (host:port or auto)")
    p.add_argument("--jobs", type=int, default=2, help="with Ray: cells run at once")
    args = p.parse_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"--jobs: expected >= 1, got {args.jobs}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    t0 = time.perf_counter()
    out = Path(args.out).resolve()  # Ray workers may run elsewhere: every path they get is absolute
    out.mkdir(parents=True, exist_ok=True)
    base = base_config(args.quick, args.budget, args.preset)
    arms = args.arms.split(",") if args.arms else list(QUICK_ARMS if args.quick else ARMS)
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown {unknown}; expected some of {sorted(ARMS)}")
    sft_model, sft_row = make_sft_checkpoint(base, out, args.sft_model and str(Path(args.sft_model).resolve()))
    specs = [{"run_dir": str(out / arm / f"seed{seed}"), "config": arm_config(base, arm, seed, sft_model).to_json()}
             for arm in arms for seed in range(args.seeds)]
    ray_address = args.ray_address if args.ray_address is not None else ("" if args.ray else None)
    ran = run_cells(specs, ray_address=ray_address, jobs=args.jobs, num_cpus=base.threads)
    runs: dict[str, list[dict[str, Any]]] = {}
    for arm in arms:
        for seed in range(args.seeds):
            runs.setdefault(arm, []).append(summarize_run(out / arm / f"seed{seed}"))
            log.info("%s seed %d: held-out success %.3f", arm, seed, runs[arm][-1]["final"]["success_rate"])
    results = {
        "command": " ".join(["python benchmarks/compaction_ablation.py", *(argv or sys.argv[1:])]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "config": dataclasses.asdict(base),
        "sft_model": sft_model,
        "sft": {"success_rate": sft_row.get("eval/success_rate", float("nan")), "row": sft_row},
        "rl_iterations": base.rl.iterations, "episodes_per_iter": base.rl.episodes_per_iter,
        "eval_episodes": base.eval.episodes, "seeds": args.seeds,
        "arms": {arm: aggregate(r) for arm, r in runs.items()},
        "runs": runs,
        "cells_run": [str(Path(r).relative_to(out)) for r in ran],  # this invocation's; the rest were finished
        "wall_clock_s": time.perf_counter() - t0,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "results.md").write_text(markdown_table(results))
    print(markdown_table(results))  # noqa: T201 - benchmark output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
