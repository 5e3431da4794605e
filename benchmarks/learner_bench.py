"""The sharded learner against one process: per-rank memory of parameters + gradients + optimiser state at
1, 2 and 4 ranks, and the update step's time at 1 vs 2 ranks, on one batch, side by side in one run.

Each configuration trains the main preset's policy and critic (tiny glm4_moe, PPO) on the same
synthetic trace batch (``--episodes`` episodes of 1-4 traces, 16-160 policy tokens each) for
``--steps`` updates of ``epochs x minibatches`` optimiser steps; 1 rank is the one-process learner
(:class:`~compactrl.training.learner.LocalLearner`), N ranks the FSDP2 learner on a local Ray (gloo).
The memory is what rank 0 holds after the steps (its shards; exactly 1/N of the one-process figure
when the parameters split evenly), the time the median update. Writes JSON and a Markdown table::

    python benchmarks/learner_bench.py --out benchmarks/results/learner_bench
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compactrl.provenance import machine_stamp  # noqa: E402
from compactrl.training.config import override, preset  # noqa: E402


def synthetic_batch(episodes: int, seed: int = 0):
    """``episodes`` episodes of 1-4 traces (16-160 policy tokens after a 24-token prompt), rewards 0/1."""
    from compactrl.collectors.batch import EpisodeMeta, stack_traces
    from compactrl.types import Trace

    g = torch.Generator().manual_seed(seed)
    out = []
    for e in range(episodes):
        n_traces = int(torch.randint(1, 5, (1,), generator=g))
        traces = []
        for t in range(n_traces):
            n = int(torch.randint(16, 161, (1,), generator=g))
            pm = [False] * 24 + [True] * n
            ids = torch.randint(5, 4000, (len(pm),), generator=g).tolist()
            rewards = {len(pm) - 1: float(e % 2)} if t == n_traces - 1 else {}
            traces.append(Trace(ids, pm, [False] * len(pm), [-3.0 if p else float("nan") for p in pm], rewards,
                                trace_index=t))
        out.append((EpisodeMeta(e, e // 4, True, False), traces))
    return stack_traces(out)


def measure(ranks: int, args) -> dict:
    from compactrl.tokenizer import shared_tokenizer
    from compactrl.training.ranks import make_learner
    from compactrl.training.rollouts import build_policy
    from compactrl.training.trainer import build_critic

    cfg = override(preset("main"), {"learner.ranks": ranks, "threads": args.threads,
                                    "rl.micro_batch_tokens": args.micro_batch_tokens})
    torch.set_num_threads(args.threads)
    policy, _ = build_policy(cfg, shared_tokenizer())
    learner = make_learner(cfg, policy, build_critic(cfg, policy) if ranks == 1 else None)
    try:
        times = []
        for step in range(args.steps + 1):
            batch = synthetic_batch(args.episodes, seed=step)
            t0 = time.perf_counter()
            learner.update(learner.advantages(batch))
            if step:  # the first step builds the optimiser state and warms the caches
                times.append(time.perf_counter() - t0)
        mem = learner.memory()
    finally:
        learner.close()
    return {"ranks": ranks, "update_s_median": statistics.median(times), "update_s": times,
            **mem, "total_mib": mem["params_mib"] + mem["grads_mib"] + mem["optimizer_mib"],
            "policy_tokens": int(synthetic_batch(args.episodes)["policy_mask"].sum())}


def table(rows: list[dict]) -> str:
    base = rows[0]
    lines = ["| ranks | params MiB | grads MiB | optimiser MiB | total MiB (rank 0) | x one process | update s (median) |"
             " x one process |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['ranks']} | {r['params_mib']:.2f} | {r['grads_mib']:.2f} | {r['optimizer_mib']:.2f} | "
                     f"{r['total_mib']:.2f} | {r['total_mib'] / base['total_mib']:.3f} | {r['update_s_median']:.2f} | "
                     f"{r['update_s_median'] / base['update_s_median']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2,4", help="rank counts to measure (the first is the reference)")
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--steps", type=int, default=3, help="timed updates (after one untimed)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the one-process learner and per rank")
    p.add_argument("--micro-batch-tokens", type=int, default=2048)
    p.add_argument("--out", default="benchmarks/results/learner_bench")
    args = p.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    load_before = os.getloadavg()
    rows = [measure(int(n), args) for n in args.ranks.split(",")]
    load_after = os.getloadavg()
    stamp = machine_stamp()
    cmd = "python benchmarks/learner_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {"rows": rows, "command": cmd.strip(), "load_before": load_before, "load_after": load_after,
              "machine": stamp, "args": vars(args)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str))
    md = (f"# The sharded learner against one process\n\n{table(rows)}\n\n"
          f"{rows[0]['policy_tokens']} policy tokens per batch, {args.episodes} episodes, main preset's model (PPO: policy "
          f"+ critic), {args.threads} torch thread(s) per process, epochs x minibatches = 2 x 2 optimiser steps per update.\n\n"
          f"Command: `{result['command']}`; CPU: {stamp['cpu'].get('model', '?')} "
          f"(AVX-512: {'yes' if 'avx512f' in stamp['cpu'].get('isa_flags', []) else 'no'}), {os.cpu_count()} cores; "
          f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after.\n")
    out.with_suffix(".md").write_text(md)
    print(md)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
