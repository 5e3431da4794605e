"""Padding share of packed micro-batches vs naive layouts, on realistic trace-length distributions.

    python benchmarks/packing_bench.py                      # oracle traces + synthetic distributions
    python benchmarks/packing_bench.py --no-oracle --budgets 16384 65536

Sources of trace lengths:

* ``oracle CompactCode-v0``: real traces of the sim code env behind the ContextBudget wrapper,
  collected with the scripted oracle policy (lossy summaries) through the TraceCollector.
* ``agentic``: synthetic episodes under a context budget ``C``: 1 + Poisson(2) traces, every trace
  but the last ends near the budget (U(0.8C, C): compaction triggers there), the last U(0.05C, C).
* ``single-turn``: one trace per episode, prompt + response lengths log-normal (median 1500,
  sigma 0.8), capped at ``C``: the usual RLHF batch.

Layouts: ``padded`` = one [N, L] tensor (the trace batch as stored); ``sequential`` = rows in
arrival order cut greedily under the micro-batch budget, each micro-batch padded to its longest
row; ``packed`` = :func:`compactrl.algos.packing.pack_rows` (sorted, first-fit decreasing).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from compactrl.algos.packing import padding_share, row_lengths


def agentic(rng: np.random.Generator, episodes: int, context: int) -> list[int]:
    out = []
    for _ in range(episodes):
        n = 1 + rng.poisson(2.0)
        out += [int(rng.uniform(0.8, 1.0) * context) for _ in range(n - 1)]
        out.append(int(rng.uniform(0.05, 1.0) * context))
    return out


def single_turn(rng: np.random.Generator, episodes: int, context: int) -> list[int]:
    return [int(min(context, x)) for x in rng.lognormal(np.log(1500), 0.8, size=episodes)]


def oracle(episodes: int, context: int, seed: int) -> list[int]:
    import gymnasium as gym

    import compactrl  # noqa: F401  (registers the env ids)
    from compactrl.collectors.trace_collector import TraceCollector
    from compactrl.policies.scripted.code import OraclePolicy

    fns = [lambda: gym.make("compactrl:CompactCode-v0", budget=context) for _ in range(4)]
    collector = TraceCollector(
        fns, OraclePolicy(summary_quality=0.7, seed=seed), episodes_per_batch=episodes, seed=seed
    )
    try:
        batch = collector.next()
    finally:
        collector.shutdown()
    return row_lengths(batch["attention_mask"]).tolist()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", type=int, nargs="+", default=[16384, 65536], help="micro-batch token budgets")
    p.add_argument("--episodes", type=int, default=256, help="episodes per synthetic source")
    p.add_argument("--oracle-episodes", type=int, default=64)
    p.add_argument("--no-oracle", action="store_true", help="skip collecting oracle traces")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    sources: dict[str, list[int]] = {}
    if not args.no_oracle:
        for context in (2048, 4096):
            print(f"collecting {args.oracle_episodes} oracle episodes, budget {context} ...", file=sys.stderr)
            sources[f"oracle CompactCode-v0, context {context}"] = oracle(
                args.oracle_episodes, context, args.seed
            )
    for context in (8192, 32768):
        sources[f"agentic synthetic, context {context}"] = agentic(rng, args.episodes, context)
    sources["single-turn synthetic, cap 8192"] = single_turn(rng, args.episodes, 8192)
    print("| source | traces | tokens | micro-batch budget | padded | sequential | packed | micro-batches |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, lengths in sources.items():
        for budget in args.budgets:
            if budget < max(lengths):
                continue
            r = padding_share(lengths, budget)
            print(
                f"| {name} | {len(lengths)} | {r.real_tokens} | {budget} | {r.padded_share:.1%} | "
                f"{r.sequential_share:.1%} | {r.packed_share:.1%} | {r.micro_batches} |"
            )
    print("\npadding share = 1 - real tokens / computed positions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
