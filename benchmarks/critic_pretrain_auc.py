"""Does the critic predict success after pre-training? Held-out AUC by pre-training steps.

From a regime's SFT model (the boundary experiment's, ``benchmarks/boundary_experiment.py``), per
seed: the trainer's own setup builds the critic from the SFT policy (as the recipe does), the
held-out episodes (``--episodes`` of the trainer's evaluation stream, greedy) are played once, and
the critic is then pre-trained batch by batch by the trainer's own ``critic_pretrain_batches``
(fresh rollouts of the SFT policy, ``epochs x minibatches x critic_updates`` critic steps per
batch, no policy update), in the ``--variants`` of ``VARIANTS`` (config changes: the pre-training
batches, or the critic's learning rate). After each batch it is scored on the same held-out
episodes: the value at the first policy token of every trace k >= 1 against the episode's outcome
(``critic/trace_start_auc``) and the explained variance against the reward to go (the outcome at
gamma 1 without per-trace rewards).
The critic, targets and env are the experiment's (reference recipe, the regime's env and budget).

One JSON per variant and seed under ``--out`` (a finished one is never run again) and
``results.md`` with a table per variant::

    python benchmarks/critic_pretrain_auc.py --out benchmarks/results/critic_pretrain_auc \\
        --sft benchmarks/results/boundary_experiment/default/sft/sft_model --max-steps 64 --seeds 2 \\
        --variants latest,replay,latest_lr3e-4,replay_lr3e-4
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from boundary_experiment import regime_config, write_json  # noqa: E402  (the experiment's configs)

KEYS = ("critic/trace_start_auc", "critic/trace_start_ev", "critic/trace_starts")


def run_seed(sft: str, regime: str, max_steps: int, seed: int, episodes: int, run_dir: Path, *,
             changes: dict) -> dict:
    """Pre-train a critic batch by batch up to ``max_steps`` steps; its held-out figures after each batch."""
    from compactrl.eval.episodes import evaluate_policy
    from compactrl.training.config import override
    from compactrl.training.rollouts import make_env_fns
    from compactrl.training.run_dir import RunDir
    from compactrl.training.trainer import critic_pretrain_batches, setup, start_rollouts

    t0, cpu0 = time.perf_counter(), time.process_time()
    cfg = override(regime_config("full", regime, threads=2), {
        "model.pretrained": sft, "sft.enabled": False, "seed": seed, "rl.algo": "ppo", "rl.iterations": 0,
        "rl.critic_pretrain_steps": max_steps, "eval.episodes": episodes, **changes})
    shutil.rmtree(run_dir, ignore_errors=True)  # an interrupted seed starts over (it has no checkpoint)
    run = RunDir(run_dir)
    run.create(cfg.to_json(), resume=False)
    r = setup(cfg, run, None, t0)
    start_rollouts(r)
    held = []
    e = cfg.eval
    success, _ = evaluate_policy(make_env_fns(cfg.env, split=e.split, count=cfg.env.num_envs), r.eval_policy,
                                 episodes=episodes, seed=e.seed, pad_id=r.pad_id, on_batch=held.append)
    scores, done = [{"steps": 0, **_figures(r, held[0])}], 0
    for steps, row in critic_pretrain_batches(r, max_steps):  # the trainer's own phase, batch by batch
        done += steps
        scores.append({"steps": done, "batch_success": r.rollouts.last_batch_stats.get("success_rate"),
                       "pool_episodes": row["pool_episodes"], **_figures(r, held[0])})
    r.rollouts.close()
    return {"seed": seed, "regime": regime, "sft": sft, "episodes": episodes, "changes": changes,
            "held_out_success": success["success_rate"], "scores": scores,
            "wall_clock_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0}


def _figures(r, batch) -> dict:
    row = r.score_critic(batch.clone())
    return {k: row.get(f"eval/{k}") for k in KEYS}


def table(cells: list[dict]) -> str:
    """Markdown: per step count, the AUC (mean over seeds, per seed) and the EV against the outcome."""
    def mean(xs):
        xs = [x for x in xs if x is not None and not math.isnan(x)]
        return f"{np.mean(xs):.2f}" if xs else "-"

    def one(x):
        return "-" if x is None or math.isnan(x) else f"{x:.2f}"

    cells = sorted(cells, key=lambda c: c["seed"])
    lines = ["| pre-training steps | AUC (mean over seeds) | AUC per seed | EV vs outcome (mean) | "
             "success rate of the batch just trained on (per seed) |", "|---|---|---|---|---|"]
    for steps in sorted({s["steps"] for c in cells for s in c["scores"]}):
        rows = [next((s for s in c["scores"] if s["steps"] == steps), None) for c in cells]
        auc = [row["critic/trace_start_auc"] if row else None for row in rows]
        lines.append(f"| {steps} | {mean(auc)} | {', '.join(one(a) for a in auc)} | "
                     f"{mean([row['critic/trace_start_ev'] if row else None for row in rows])} | "
                     f"{', '.join(one(row.get('batch_success')) if row else '-' for row in rows)} |")
    held = ", ".join(f"{c['held_out_success']:.2f}" for c in cells)
    return "\n".join(lines) + f"\n\nHeld-out success of the SFT policy on the scored episodes, per seed: {held}.\n"


VARIANTS: dict[str, dict] = {
    "latest": {"rl.critic_pretrain_replay": False, "rl.critic_lr": 1e-3},
    "replay": {"rl.critic_pretrain_replay": True, "rl.critic_lr": 1e-3},
    "latest_lr3e-4": {"rl.critic_pretrain_replay": False, "rl.critic_lr": 3e-4},
    "replay_lr3e-4": {"rl.critic_pretrain_replay": True, "rl.critic_lr": 3e-4},
}
"""``latest``: each batch's steps train on that batch alone; ``replay``: on every
batch collected so far (``rl.critic_pretrain_replay``); ``*_lr3e-4``: the same at a critic
learning rate of 3e-4 instead of 1e-3."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output directory (one JSON per seed and variant, results.md)")
    p.add_argument("--sft", required=True, help="the regime's SFT model directory")
    p.add_argument("--regime", default="default", help="the boundary experiment's regime the SFT model is of")
    p.add_argument("--max-steps", type=int, default=96, help="critic pre-training steps in all")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--episodes", type=int, default=64, help="held-out episodes the critic is scored on")
    p.add_argument("--variants", default="latest,replay",
                   help=f"comma-separated, of {', '.join(VARIANTS)}")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if unknown := [v for v in variants if v not in VARIANTS]:
        raise SystemExit(f"--variants: expected names from {sorted(VARIANTS)}, got {unknown}")
    out, sections = Path(args.out), []
    for variant in variants:
        cells = []
        for seed in range(args.seeds):
            name = f"{args.regime}__{variant}__seed{seed}"
            path = out / "cells" / f"{name}.json"
            if not path.exists():
                write_json(path, run_seed(args.sft, args.regime, args.max_steps, seed, args.episodes,
                                          out / "runs" / name, changes=VARIANTS[variant]))
            cells.append(json.loads(path.read_text()))
        sections.append(f"### `{variant}`\n\n" + table(cells))
    text = (f"Critic trace-start AUC by pre-training steps, {args.regime} regime, from `{args.sft}`, "
            f"{args.episodes} held-out episodes (the same ones after every batch)\n\n" + "\n".join(sections))
    (out / "results.md").write_text(text)
    print(text)  # noqa: T201 - benchmark output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
