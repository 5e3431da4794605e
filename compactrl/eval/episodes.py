"""Evaluation on generated-task envs: a fixed task-seed stream through the training collector.

:func:`evaluate_policy` runs ``episodes`` episodes with a :class:`~compactrl.collectors.TraceCollector`
seeded with ``seed``, exactly as training collects them (same task-seed stream, same wrapper, same
batched ``act`` calls), and returns the aggregates of
:func:`~compactrl.collectors.summarize_episodes` plus the per-episode statistics. Two calls with the
same ``seed`` evaluate the same tasks (paired comparisons between checkpoints), and a training
collector seeded with ``seed`` would play the same episodes.

:func:`evaluate` is the same for an env id or constructor with keyword arguments. An env without a
:class:`~compactrl.wrappers.ContextBudget` (``context_budget=None``) runs inside one that never asks
for a summary (:func:`open_budget`), so that it still yields the traces and statistics the
collector reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
from tensordict import TensorDict

from compactrl.collectors import EpisodeStats, TraceCollector, summarize_episodes
from compactrl.wrappers import ContextBudget, ContextBudgetConfig

EnvFn = Callable[[], gym.Env]

UNBOUNDED_TOKENS = 1 << 40
"""The budget of an open context: no prompt of a real episode comes near it."""
LONGEST_RESPONSE = 1 << 24
"""The response cap of an open context for a policy without one (scripted policies write whole
files and patches; a ``str`` response is cut at ``max_new_tokens``)."""


def evaluate_policy(
    env_fns: Sequence[EnvFn],
    policy,
    *,
    episodes: int,
    seed: int,
    pad_id: int = 0,
    give_task_to_policy: bool = False,
    on_batch: Callable[[TensorDict], None] | None = None,
) -> tuple[dict[str, float], list[EpisodeStats]]:
    """Run ``episodes`` episodes of the task-seed stream ``seed``; returns (aggregates, per-episode stats).

    The envs are closed afterwards. ``give_task_to_policy``: scripted policies need the task;
    learned policies must not see it. ``on_batch`` receives the episodes' trace batch (the trainer
    scores its critic on the held-out traces with it).
    """
    if episodes < 1:
        raise ValueError(f"episodes: expected >= 1, got {episodes}")
    collector = TraceCollector(env_fns, policy, episodes_per_batch=episodes, seed=seed, pad_id=pad_id,
                               give_task_to_policy=give_task_to_policy)
    try:
        batch = collector.next()
        stats = collector.last_episode_stats
        if on_batch is not None:
            on_batch(batch)
    finally:
        collector.shutdown()
    return summarize_episodes(stats), stats


def evaluate(
    env: str | Callable[..., gym.Env],
    policy,
    *,
    episodes: int,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    num_envs: int = 1,
    give_task_to_policy: bool = True,
) -> tuple[dict[str, float], list[EpisodeStats]]:
    """:func:`evaluate_policy` on ``num_envs`` copies of ``env`` (a registered id or a constructor)."""
    if num_envs < 1:
        raise ValueError(f"num_envs: expected >= 1, got {num_envs}")
    make = env_fn(env, env_kwargs, policy)
    return evaluate_policy([make] * num_envs, policy, episodes=episodes, seed=seed,
                           pad_id=_pad_id(policy), give_task_to_policy=give_task_to_policy)


def env_fn(env: str | Callable[..., gym.Env], env_kwargs: dict[str, Any] | None, policy) -> EnvFn:
    """A constructor of ``env`` with ``env_kwargs``, inside an open budget when it has no ContextBudget.

    A registered id also gets the policy's tokenizer as ``tokenizer=`` (the wrapper must count in
    the ids the policy reads), unless ``env_kwargs`` names one or the policy has none (scripted).
    """
    kwargs = dict(env_kwargs or {})
    if isinstance(env, str):
        import compactrl  # noqa: F401  (registers the ids)

        if getattr(policy, "tokenizer", None) is not None:
            kwargs.setdefault("tokenizer", policy.tokenizer)

        def make() -> gym.Env:
            return with_budget(gym.make(env, **kwargs), policy)
    else:
        def make() -> gym.Env:
            return with_budget(env(**kwargs), policy)
    return make


def with_budget(env: gym.Env, policy, config: ContextBudgetConfig | None = None) -> gym.Env:
    """``env`` itself when a ContextBudget wraps it, else ``env`` inside ``config`` (default :func:`open_budget`)."""
    inner = env
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, ContextBudget):
            return env
        inner = inner.env
    return ContextBudget(env, config or open_budget(policy), tokenizer=getattr(policy, "tokenizer", None))


def open_budget(policy) -> ContextBudgetConfig:
    """A ContextBudget that never asks for a summary and keeps tool outputs whole.

    The budget is the policy's context window (``policy.context_length``, unbounded for scripted
    policies) and the reserve its response cap (``policy.max_new_tokens``), with no compactions:
    an episode that outgrows the window is truncated (``budget_exhausted``) instead of making the
    policy fail on a prompt it cannot read.
    """
    window = int(getattr(policy, "context_length", 0) or UNBOUNDED_TOKENS)
    reserve = min(int(getattr(policy, "max_new_tokens", 0) or LONGEST_RESPONSE), window - 1)
    return ContextBudgetConfig(budget=window, reserve=reserve, tool_output_cap=UNBOUNDED_TOKENS, max_compactions=0)


def _pad_id(policy) -> int:
    tokenizer = getattr(policy, "tokenizer", None)
    return int(getattr(tokenizer, "pad_token_id", None) or 0)
