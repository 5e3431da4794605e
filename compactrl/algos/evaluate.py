"""Held-out evaluation of a policy through the same collector and wrapper as training.

:func:`evaluate_policy` runs a fixed set of episodes (a fixed task-seed stream, so every call sees
the same tasks) and returns the aggregates of :func:`~compactrl.collectors.summarize_episodes`
plus the per-episode statistics. Nothing is trained; the trace batch is discarded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from compactrl.collectors.trace_collector import EpisodeStats, TraceCollector, summarize_episodes


def evaluate_policy(
    env_fns: Sequence[Callable[[], Any]],
    policy,
    *,
    episodes: int,
    seed: int,
    pad_id: int = 0,
    give_task_to_policy: bool = False,
) -> tuple[dict[str, float], list[EpisodeStats]]:
    """Run ``episodes`` held-out episodes; returns (aggregates, per-episode stats).

    The task seeds come from ``seed`` alone, so two calls with the same arguments evaluate on
    the same tasks (paired comparisons between checkpoints). The envs are closed afterwards.
    """
    if episodes < 1:
        raise ValueError(f"episodes: expected >= 1, got {episodes}")
    collector = TraceCollector(env_fns, policy, episodes_per_batch=episodes, seed=seed, pad_id=pad_id,
                               give_task_to_policy=give_task_to_policy)
    try:
        collector.next()
        stats = collector.last_episode_stats
    finally:
        collector.shutdown()
    return summarize_episodes(stats), stats
