"""Batched trace collection across many context-budget environments.

:class:`TraceCollector` steps a list of environments in lock-step *rounds*: every environment that
waits for an action contributes one :class:`~compactrl.types.PolicyRequest`, the policy answers
all of them in one ``act`` call (one batched generation), and each environment is stepped with its
response. Finished traces arrive in ``info["trace"]`` (the :class:`~compactrl.wrappers.ContextBudget`
contract) and are stacked into a trace batch (:func:`~compactrl.collectors.batch.stack_traces`).

Collection is synchronous and on-policy: a batch is a set of *whole* episodes that all started
after the previous batch was yielded, so every token of a batch was sampled by the same weights
(no episode straddles a weight update). The batch closes after ``episodes_per_batch`` finished
episodes, or once ``tokens_per_batch`` trace tokens have been collected (episodes still running
then are finished and included, so long episodes are not selectively dropped).

GRPO groups: ``group_size`` consecutive episodes reset with the same task seed and share a
``group_id``. A group is never split across batches.

Fixed lists: :meth:`TraceCollector.collect` runs exactly one episode per given set of reset
options (e.g. ``{"task": task}`` for each task of a task set) instead of drawing episodes from the
task-seed stream; evaluation of task sets uses it (``compactrl.eval``).

Infrastructure failures never stop collection: an episode that the env truncates with
``info["sandbox_error"]``, or whose ``reset``/``step`` raises (anything but ``ValueError`` /
``TypeError``, :data:`~compactrl.collectors.episodes.CONFIG_ERRORS`, which signal a bad
configuration or a policy bug and propagate), is ended as truncated (the traces it finished so far
are kept), the env is closed and rebuilt from its constructor, and the next episode starts.

Episodes move through the states of :mod:`compactrl.collectors.episodes` (plan, env slot, episode).
Per-episode statistics of the last batch are in :attr:`TraceCollector.last_episode_stats` (a list
of :class:`~compactrl.collectors.episodes.EpisodeStats`); see that class for the fields and how
generation time is attributed. Episodes of a round run together, so their wall-clock times overlap;
where the batch's time went is :attr:`TraceCollector.last_batch_time` (:data:`BATCH_TIME_KEYS`),
measured per round: the ``act`` call's time split between summaries and other responses by their
share of its generated tokens, and the time inside ``env.reset``/``env.step``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from tensordict import TensorDict

from compactrl.collectors.batch import EpisodeMeta, stack_traces
from compactrl.collectors.episodes import (
    CONFIG_ERRORS,
    EnvFn,
    EnvSlot,
    Episode,
    EpisodePlan,
    EpisodeStats,
    summarize_episodes,
)
from compactrl.types import Policy, PolicyRequest, TokenResponse

log = logging.getLogger(__name__)

BATCH_TIME_KEYS = ("generate_s", "summary_s", "env_s")
"""Keys of :attr:`TraceCollector.last_batch_time`: seconds of the batch's collection spent generating
responses that are not summaries, generating summaries, and inside ``env.reset``/``env.step``."""

_MAX_TRACELESS_EPISODES = 64
"""Episodes of one batch that may end without a finished trace before collection gives up."""


class TraceCollector:
    """Collects trace batches from many environments with one batched policy call per round.

    Args:
        env_fns: one constructor per environment (e.g. ``lambda: gym.make("CompactCode-v0")``);
            each must build an env that follows the ContextBudget contract.
        policy: anything with ``act(requests) -> list[str | TokenResponse]``.
        episodes_per_batch: close a batch after this many finished episodes.
        tokens_per_batch: close a batch once the finished traces hold this many tokens (running
            episodes are finished first). Exactly one of the two must be given.
        total_batches: stop iterating after this many batches (None: never stop).
        group_size: episodes per task seed (GRPO); ``episodes_per_batch`` must be a multiple.
        seed: seeds the task-seed stream (see :meth:`set_seed`).
        replay_buffer: when given, each batch is written with ``replay_buffer.extend`` and the
            iterator yields ``None`` (as TorchRL collectors do).
        pad_id: padding token id for the trace batch.
        give_task_to_policy: put the env's task into ``PolicyRequest.task`` (scripted policies
            need it; learned policies must not read it).
        reset_options: ``options`` passed to every ``env.reset``.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFn],
        policy: Policy,
        *,
        episodes_per_batch: int | None = None,
        tokens_per_batch: int | None = None,
        total_batches: int | None = None,
        group_size: int = 1,
        seed: int = 0,
        replay_buffer: Any = None,
        pad_id: int = 0,
        give_task_to_policy: bool = True,
        reset_options: dict | None = None,
    ) -> None:
        _validate(len(env_fns), episodes_per_batch, tokens_per_batch, total_batches, group_size)
        self.policy = policy
        self.episodes_per_batch = episodes_per_batch
        self.tokens_per_batch = tokens_per_batch
        self.total_batches = total_batches
        self.group_size = group_size
        self.replay_buffer = replay_buffer
        self.pad_id = pad_id
        self.give_task_to_policy = give_task_to_policy
        self.reset_options = reset_options
        self._slots = [EnvSlot(env_fn=fn) for fn in env_fns]
        self._next_episode_id = 0
        self._next_group_id = 0
        self._batches = 0
        self._fixed_plan = False
        self.set_seed(seed)
        self.last_episode_stats: list[EpisodeStats] = []
        """Per-episode statistics of the most recent batch, in episode-id order."""
        self.last_batch_stats: dict[str, float] = {}
        """Aggregates of the most recent batch (see :func:`summarize_episodes`)."""
        self.last_batch_time: dict[str, float] = dict.fromkeys(BATCH_TIME_KEYS, 0.0)
        """Where the most recent batch's collection time went (:data:`BATCH_TIME_KEYS`), measured once per
        round and reset, not once per episode: these never count a round twice, unlike the episodes'
        overlapping ``wall_clock_s``. What is left of the collection's wall-clock (building requests,
        stacking traces) is none of them."""
        self._time = dict.fromkeys(BATCH_TIME_KEYS, 0.0)

    # -- TorchRL-like surface -------------------------------------------------------------------

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the stream of task seeds; returns the next seed to use elsewhere (TorchRL style).

        ``static_seed`` is accepted for signature compatibility; task seeds always advance so that
        two batches never repeat the same tasks.
        """
        self._seed = int(seed)
        self._rng = np.random.default_rng(self._seed)
        return self._seed + 1

    def update_policy_weights_(self, policy_or_weights: Any = None, **kwargs: Any) -> None:
        """Push new weights to the inference engine.

        In-process Hugging Face policies share the trained module, so there is nothing to do. A
        policy that generates elsewhere (vLLM engine, remote server) exposes ``update_weights`` and
        is called with ``policy_or_weights`` (a module or a state dict).
        """
        hook = getattr(self.policy, "update_weights", None)
        if callable(hook):
            hook(policy_or_weights, **kwargs)

    def shutdown(self) -> None:
        """Close every environment. Idempotent."""
        for slot in self._slots:
            slot.close_env()

    def state_dict(self) -> dict[str, Any]:
        """Counters and the task-seed generator state (enough to resume a run's task stream)."""
        return {
            "seed": self._seed,
            "rng": self._rng.bit_generator.state,
            "next_episode_id": self._next_episode_id,
            "next_group_id": self._next_group_id,
            "batches": self._batches,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._seed = int(state["seed"])
        self._rng = np.random.default_rng(self._seed)
        self._rng.bit_generator.state = state["rng"]
        self._next_episode_id = int(state["next_episode_id"])
        self._next_group_id = int(state["next_group_id"])
        self._batches = int(state["batches"])

    def __iter__(self) -> Iterator[TensorDict | None]:
        while self.total_batches is None or self._batches < self.total_batches:
            batch = self.next()
            if self.replay_buffer is not None:
                self.replay_buffer.extend(batch)
                yield None
            else:
                yield batch

    def __len__(self) -> int:
        if self.total_batches is None:
            raise TypeError("an endless TraceCollector (total_batches=None) has no length")
        return self.total_batches

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    # -- collection --------------------------------------------------------------------------------

    def next(self) -> TensorDict:
        """Collect one batch of whole episodes and return its trace batch."""
        episodes = self._collect_episodes(deque(), fixed=False)
        self._batches += 1
        return self._batch(episodes)

    def collect(self, reset_options: Sequence[dict[str, Any] | None]) -> TensorDict | None:
        """Run exactly one episode per entry of ``reset_options``; returns their trace batch.

        Episode ``i`` resets with ``options=reset_options[i]`` (merged over the constructor's
        ``reset_options``) and the next seed of the task-seed stream; each is its own group. This
        is how a fixed list of tasks is run (``{"task": task}`` per entry): every entry runs once
        and is never replaced, and ``last_episode_stats`` holds one record per entry, in order.
        Unlike :meth:`next`, a ``ValueError``/``TypeError`` raised by ``env.reset`` or ``env.step``
        is recorded as that episode's failure (``sandbox_error``) rather than propagated: each
        entry is another task, and one that the backend cannot run or the budget cannot hold says
        nothing about the others. Errors from an env's constructor propagate as in :meth:`next`.
        Returns ``None`` when no episode finished a trace.
        """
        plan: deque[EpisodePlan] = deque()
        for options in reset_options:
            plan.append(EpisodePlan(self._next_group_id, self._draw_seed(), {**(self.reset_options or {}), **(options or {})}))
            self._next_group_id += 1
        episodes = self._collect_episodes(plan, fixed=True)
        return self._batch(episodes)

    def _batch(self, episodes: list[Episode]) -> TensorDict | None:
        self.last_batch_time = dict(self._time)
        self.last_episode_stats = [ep.stats for ep in episodes]
        self.last_batch_stats = summarize_episodes(self.last_episode_stats)
        if not any(ep.traces for ep in episodes):
            return None
        rows = [
            (EpisodeMeta(ep.stats.episode_id, ep.stats.group_id, ep.stats.terminated, ep.stats.truncated),
             ep.traces)
            for ep in episodes
            if ep.traces
        ]
        return stack_traces(rows, pad_id=self.pad_id)

    def _collect_episodes(self, pending: deque[EpisodePlan], *, fixed: bool) -> list[Episode]:
        """Run the episodes of ``pending``; unless ``fixed``, plan more from the task-seed stream."""
        self._fixed_plan = fixed
        self._time = dict.fromkeys(BATCH_TIME_KEYS, 0.0)
        planned = 0
        finished: list[Episode] = []
        while True:
            if not fixed and self._want_more(planned, finished, pending):
                self._extend_plan(pending)
                planned += self.group_size
                continue
            finished.extend(self._start_episodes(pending))
            busy = [s for s in self._slots if s.episode is not None]
            if busy:
                finished.extend(self._round(busy))
            elif not pending:
                if fixed or any(ep.traces for ep in finished):
                    break
                _check_not_all_failing(finished)
                self._extend_plan(pending)  # every episode failed before its first trace: go on
                planned += self.group_size
        finished.sort(key=lambda ep: ep.stats.episode_id)
        return finished

    def _want_more(self, planned: int, finished: list[Episode], pending: deque) -> bool:
        """Whether to queue another whole group of episodes for this batch."""
        if self.episodes_per_batch is not None:
            return planned < self.episodes_per_batch
        if pending or all(s.episode is not None for s in self._slots):
            return False  # plan lazily: only when an env is free to start it
        return sum(ep.stats.trace_tokens for ep in finished) < self.tokens_per_batch

    def _draw_seed(self) -> int:
        return int(self._rng.integers(0, 2**31 - 1))

    def _extend_plan(self, pending: deque[EpisodePlan]) -> None:
        group_id = self._next_group_id
        self._next_group_id += 1
        task_seed = self._draw_seed()
        pending.extend(EpisodePlan(group_id, task_seed, self.reset_options) for _ in range(self.group_size))

    def _start_episodes(self, pending: deque[EpisodePlan]) -> list[Episode]:
        """Reset idle envs with queued episodes; returns episodes whose reset failed."""
        failed = []
        for slot in self._slots:
            if not pending:
                break
            if slot.episode is None:
                episode = self._reset(slot, pending.popleft())
                if episode is not None:
                    failed.append(episode)
        return failed

    def _reset(self, slot: EnvSlot, plan: EpisodePlan) -> Episode | None:
        """Start an episode in ``slot``; returns it already ended when the reset failed."""
        stats = EpisodeStats(episode_id=self._next_episode_id, group_id=plan.group_id, task_seed=plan.task_seed)
        self._next_episode_id += 1
        episode = Episode(stats=stats)
        t0 = time.perf_counter()
        try:
            if slot.env is None:
                slot.env = slot.env_fn()
            slot.obs, slot.info = slot.env.reset(seed=plan.task_seed, options=plan.options)
        except Exception as exc:  # noqa: BLE001 - infrastructure failure: end episode, go on
            if not self._survivable(exc, built=slot.env is not None):
                raise
            log.warning("env.reset failed (episode %d): %r", stats.episode_id, exc)
            self._env_time(stats, t0)
            _fail(slot, episode, exc)
            stats.wall_clock_s = time.perf_counter() - episode.started
            return episode
        self._env_time(stats, t0)
        stats.task_id = _task_id(slot.env, slot.info)
        slot.episode = episode
        return None

    def _round(self, busy: list[EnvSlot]) -> list[Episode]:
        """One batched policy call for every waiting env, then one step each."""
        finished = []
        requests = [self._request(s) for s in busy]
        t0 = time.perf_counter()
        actions = self.policy.act(requests)
        gen_time = time.perf_counter() - t0
        if len(actions) != len(requests):
            raise ValueError(f"policy.act returned {len(actions)} responses for {len(requests)} requests")
        for slot, req, action, share in zip(busy, requests, actions, _time_shares(actions, gen_time)):
            stats = slot.episode.stats
            if req.compaction_required:
                stats.summary_gen_time_s += share
                stats.summary_latencies_s.append(gen_time)  # the agent waits for the whole round
                self._time["summary_s"] += share
            else:
                stats.other_gen_time_s += share
                self._time["generate_s"] += share
            if self._step(slot, action):
                finished.append(slot.finish())
        return finished

    def _env_time(self, stats: EpisodeStats, t0: float) -> None:
        """Count the time since ``t0`` (an env call's start) for the episode and for the batch."""
        dt = time.perf_counter() - t0
        stats.env_time_s += dt
        self._time["env_s"] += dt

    def _survivable(self, exc: Exception, *, built: bool) -> bool:
        """Whether an env's exception ends only its episode (see :meth:`collect` for a fixed plan)."""
        if not isinstance(exc, CONFIG_ERRORS):
            return True
        return self._fixed_plan and built  # a constructor's config error always propagates

    def _request(self, slot: EnvSlot) -> PolicyRequest:
        info = slot.info
        task = _task(slot.env, info) if self.give_task_to_policy else None
        return PolicyRequest(
            messages=slot.obs,
            prompt_token_ids=info.get("prompt_token_ids"),
            max_new_tokens=info.get("max_new_tokens"),
            compaction_required=bool(info.get("compaction_required", False)),
            task=task,
        )

    def _step(self, slot: EnvSlot, action: str) -> bool:
        """Step one env; returns True when its episode ended."""
        stats = slot.episode.stats
        t0 = time.perf_counter()
        try:
            obs, reward, terminated, truncated, info = slot.env.step(action)
        except Exception as exc:  # noqa: BLE001 - infrastructure failure: end episode, go on
            if not self._survivable(exc, built=True):
                raise
            self._env_time(stats, t0)
            log.warning("env.step failed (episode %d): %r", stats.episode_id, exc)
            _fail(slot, slot.episode, exc)
            return True
        self._env_time(stats, t0)
        stats.steps += 1
        stats.reward += float(reward)
        slot.episode.take_trace(info)
        slot.obs, slot.info = obs, info
        if terminated or truncated:
            slot.episode.end(info, terminated, truncated)
            if info.get("sandbox_error"):
                log.warning("sandbox failure ended episode %d: %s", stats.episode_id, stats.sandbox_error)
                slot.close_env()  # a failed sandbox is not reused
            return True
        return False


def _validate(num_envs: int, episodes: int | None, tokens: int | None, batches: int | None, group: int) -> None:
    if num_envs < 1:
        raise ValueError(f"env_fns: expected at least one env constructor, got {num_envs}")
    if (episodes is None) == (tokens is None):
        raise ValueError(
            f"give exactly one of episodes_per_batch and tokens_per_batch, got {episodes!r} and {tokens!r}"
        )
    if episodes is not None and episodes < 1:
        raise ValueError(f"episodes_per_batch: expected >= 1, got {episodes}")
    if tokens is not None and tokens < 1:
        raise ValueError(f"tokens_per_batch: expected >= 1, got {tokens}")
    if batches is not None and batches < 1:
        raise ValueError(f"total_batches: expected >= 1 or None, got {batches}")
    if group < 1:
        raise ValueError(f"group_size: expected >= 1, got {group}")
    if episodes is not None and episodes % group:
        raise ValueError(f"episodes_per_batch: expected a multiple of group_size={group}, got {episodes}")


def _fail(slot: EnvSlot, episode: Episode, exc: BaseException) -> None:
    """End ``episode`` as failed by ``exc`` (an infrastructure failure) and close the slot's env."""
    episode.end_failed(f"{type(exc).__name__}: {exc}")
    slot.close_env()


def _check_not_all_failing(finished: list[Episode]) -> None:
    if len(finished) >= _MAX_TRACELESS_EPISODES:
        raise RuntimeError(
            f"{len(finished)} episodes in a row ended without a finished trace; "
            "the environments are failing (see the logged sandbox errors)"
        )


def _time_shares(actions: Sequence[str], total: float) -> list[float]:
    counts = [len(a.token_ids) if isinstance(a, TokenResponse) else 0 for a in actions]
    n = sum(counts)
    if n == 0:
        return [total / len(actions)] * len(actions)
    return [total * c / n for c in counts]


def _task(env: Any, info: dict) -> Any:
    if info.get("task") is not None:
        return info["task"]
    return getattr(getattr(env, "unwrapped", env), "task", None)


def _task_id(env: Any, info: dict) -> str:
    if info.get("task_id"):
        return str(info["task_id"])
    task = _task(env, info)
    return str(getattr(task, "id", "")) if task is not None else ""
