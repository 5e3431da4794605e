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
``TypeError``, which signal a bad configuration or a policy bug and propagate), is ended as
truncated (the traces it finished so far are kept), the env is closed and rebuilt from its
constructor, and the next episode starts.

Per-episode statistics of the last batch are in :attr:`TraceCollector.last_episode_stats` (a list
of :class:`EpisodeStats`); see that class for the fields and how generation time is attributed.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np
from tensordict import TensorDict

from compactrl.collectors.batch import EpisodeMeta, stack_traces
from compactrl.types import Policy, PolicyRequest, TokenResponse, Trace

log = logging.getLogger(__name__)

EnvFn = Callable[[], Any]

_CONFIG_ERRORS = (ValueError, TypeError)
"""Raised for a bad configuration or a policy bug (e.g. token ids outside the vocabulary): these
propagate. Every other exception from an env is an infrastructure failure the collection survives."""

_NOT_FINAL_INFO = frozenset({
    "trace", "prompt_token_ids", "max_new_tokens", "compaction_required", "compacted", "trace_index",
    "context_tokens", "clipped_tokens", "tool", "task", "task_id", "success", "sandbox_error", "num_traces",
    "num_compactions", "summary_tokens",
})
"""Keys of a final ``info`` that :attr:`EpisodeStats.info` leaves out: per-step bookkeeping of the
wrapper, and figures that :class:`EpisodeStats` has a field for (one name per figure)."""

_MAX_TRACELESS_EPISODES = 64
"""Episodes of one batch that may end without a finished trace before collection gives up."""


@dataclass
class EpisodeStats:
    """What one episode cost and earned.

    Generation time is measured per ``policy.act`` call (one round) and shared between the requests
    of that round in proportion to the tokens each generated (equal shares when a policy returns
    plain strings), so the per-episode times of a batch add up to the batch's generation time.
    """

    episode_id: int
    """Unique id within the collector (matches ``episode_id`` in the trace batch)."""
    group_id: int
    """Episodes reset with the same task seed share it (GRPO groups)."""
    task_seed: int
    """Seed passed to ``env.reset``; it selects the task."""
    task_id: str = ""
    """The task's id, when the env exposes it."""
    num_traces: int = 0
    """Finished traces (rows of the trace batch)."""
    compactions: int = 0
    """Summaries written (traces that end with a summary)."""
    generated_tokens: int = 0
    """Policy tokens over all traces, summaries included."""
    summary_tokens: int = 0
    """Policy tokens that belong to summaries."""
    trace_tokens: int = 0
    """All tokens of all traces (prompts, tool outputs and policy tokens)."""
    steps: int = 0
    """Env steps (policy responses) taken."""
    reward: float = 0.0
    """Sum of the env rewards."""
    success: bool = False
    """``info["success"]`` at the end when the env reports it, else ``reward > 0``."""
    terminated: bool = False
    """Ended by the task (submit / success)."""
    truncated: bool = False
    """Cut short (turn, token or time limits, budget exhausted, sandbox failure)."""
    sandbox_error: str | None = None
    """Why the infrastructure failed, when it did."""
    summary_gen_time_s: float = 0.0
    """Share of generation time spent writing summaries."""
    other_gen_time_s: float = 0.0
    """Share of generation time spent on every other response."""
    env_time_s: float = 0.0
    """Time spent inside ``env.reset``/``env.step``."""
    wall_clock_s: float = 0.0
    """From reset to the end of the episode (includes waiting for other envs of a round)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Scalar entries (numbers, strings) of the env's last ``info``, e.g. ``format_errors``,
    ``tests_passed``, ``context_tokens_max``, ``test_summary``; without the wrapper's per-step
    bookkeeping and without what a field above already holds (see :data:`_NOT_FINAL_INFO`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Episode:
    stats: EpisodeStats
    traces: list[Trace] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)


class _Planned(NamedTuple):
    """An episode not started yet: what its ``reset`` receives."""

    group_id: int
    task_seed: int
    options: dict[str, Any] | None


@dataclass
class _Slot:
    """One environment and the episode it is running (``episode`` None when idle)."""

    env_fn: EnvFn
    env: Any = None
    obs: Any = None
    info: dict = field(default_factory=dict)
    episode: _Episode | None = None


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
        self._slots = [_Slot(env_fn=fn) for fn in env_fns]
        self._next_episode_id = 0
        self._next_group_id = 0
        self._batches = 0
        self._fixed_plan = False
        self.set_seed(seed)
        self.last_episode_stats: list[EpisodeStats] = []
        """Per-episode statistics of the most recent batch, in episode-id order."""
        self.last_batch_stats: dict[str, float] = {}
        """Aggregates of the most recent batch (see :func:`summarize_episodes`)."""

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
            self._close_env(slot)

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
        plan: deque[_Planned] = deque()
        for options in reset_options:
            plan.append(_Planned(self._next_group_id, self._draw_seed(), {**(self.reset_options or {}), **(options or {})}))
            self._next_group_id += 1
        episodes = self._collect_episodes(plan, fixed=True)
        return self._batch(episodes)

    def _batch(self, episodes: list[_Episode]) -> TensorDict | None:
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

    def _collect_episodes(self, pending: deque[_Planned], *, fixed: bool) -> list[_Episode]:
        """Run the episodes of ``pending``; unless ``fixed``, plan more from the task-seed stream."""
        self._fixed_plan = fixed
        planned = 0
        finished: list[_Episode] = []
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

    def _want_more(self, planned: int, finished: list[_Episode], pending: deque) -> bool:
        """Whether to queue another whole group of episodes for this batch."""
        if self.episodes_per_batch is not None:
            return planned < self.episodes_per_batch
        if pending or all(s.episode is not None for s in self._slots):
            return False  # plan lazily: only when an env is free to start it
        return sum(ep.stats.trace_tokens for ep in finished) < self.tokens_per_batch

    def _draw_seed(self) -> int:
        return int(self._rng.integers(0, 2**31 - 1))

    def _extend_plan(self, pending: deque[_Planned]) -> None:
        group_id = self._next_group_id
        self._next_group_id += 1
        task_seed = self._draw_seed()
        pending.extend(_Planned(group_id, task_seed, self.reset_options) for _ in range(self.group_size))

    def _start_episodes(self, pending: deque[_Planned]) -> list[_Episode]:
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

    def _reset(self, slot: _Slot, plan: _Planned) -> _Episode | None:
        """Start an episode in ``slot``; returns it already ended when the reset failed."""
        stats = EpisodeStats(episode_id=self._next_episode_id, group_id=plan.group_id, task_seed=plan.task_seed)
        self._next_episode_id += 1
        episode = _Episode(stats=stats)
        t0 = time.perf_counter()
        try:
            if slot.env is None:
                slot.env = slot.env_fn()
            slot.obs, slot.info = slot.env.reset(seed=plan.task_seed, options=plan.options)
        except Exception as exc:  # noqa: BLE001 - infrastructure failure: end episode, go on
            if not self._survivable(exc, built=slot.env is not None):
                raise
            log.warning("env.reset failed (episode %d): %r", stats.episode_id, exc)
            stats.env_time_s += time.perf_counter() - t0
            self._fail(slot, episode, exc)
            stats.wall_clock_s = time.perf_counter() - episode.started
            return episode
        stats.env_time_s += time.perf_counter() - t0
        stats.task_id = _task_id(slot.env, slot.info)
        slot.episode = episode
        return None

    def _round(self, busy: list[_Slot]) -> list[_Episode]:
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
            else:
                stats.other_gen_time_s += share
            if self._step(slot, action):
                finished.append(self._finish(slot))
        return finished

    def _survivable(self, exc: Exception, *, built: bool) -> bool:
        """Whether an env's exception ends only its episode (see :meth:`collect` for a fixed plan)."""
        if not isinstance(exc, _CONFIG_ERRORS):
            return True
        return self._fixed_plan and built  # a constructor's config error always propagates

    def _request(self, slot: _Slot) -> PolicyRequest:
        info = slot.info
        task = _task(slot.env, info) if self.give_task_to_policy else None
        return PolicyRequest(
            messages=slot.obs,
            prompt_token_ids=info.get("prompt_token_ids"),
            max_new_tokens=info.get("max_new_tokens"),
            compaction_required=bool(info.get("compaction_required", False)),
            task=task,
        )

    def _step(self, slot: _Slot, action: str) -> bool:
        """Step one env; returns True when its episode ended."""
        stats = slot.episode.stats
        t0 = time.perf_counter()
        try:
            obs, reward, terminated, truncated, info = slot.env.step(action)
        except Exception as exc:  # noqa: BLE001 - infrastructure failure: end episode, go on
            if not self._survivable(exc, built=True):
                raise
            stats.env_time_s += time.perf_counter() - t0
            log.warning("env.step failed (episode %d): %r", stats.episode_id, exc)
            self._fail(slot, slot.episode, exc)
            return True
        stats.env_time_s += time.perf_counter() - t0
        stats.steps += 1
        stats.reward += float(reward)
        self._take_traces(slot.episode, info)
        slot.obs, slot.info = obs, info
        if terminated or truncated:
            stats.info = _final_info(info)
            stats.terminated, stats.truncated = bool(terminated), bool(truncated) and not terminated
            stats.success = bool(info.get("success", stats.reward > 0))
            if info.get("sandbox_error"):
                stats.sandbox_error = str(info["sandbox_error"])
                stats.truncated, stats.terminated = True, False
                log.warning("sandbox failure ended episode %d: %s", stats.episode_id, stats.sandbox_error)
                self._close_env(slot)  # a failed sandbox is not reused
            return True
        return False

    def _take_traces(self, episode: _Episode, info: dict) -> None:
        tr = info.get("trace")
        if tr is not None:
            episode.traces.append(tr)
            st = episode.stats
            st.num_traces += 1
            st.compactions += int(bool(tr.ends_with_summary))
            st.generated_tokens += sum(tr.policy_mask)
            st.summary_tokens += sum(tr.summary_mask)
            st.trace_tokens += len(tr)

    def _fail(self, slot: _Slot, episode: _Episode, exc: BaseException) -> None:
        st = episode.stats
        st.truncated, st.terminated, st.success = True, False, False
        st.sandbox_error = f"{type(exc).__name__}: {exc}"
        self._close_env(slot)

    def _finish(self, slot: _Slot) -> _Episode:
        episode = slot.episode
        episode.stats.wall_clock_s = time.perf_counter() - episode.started
        slot.episode, slot.obs, slot.info = None, None, {}
        return episode

    @staticmethod
    def _close_env(slot: _Slot) -> None:
        env, slot.env = slot.env, None
        if env is not None:
            try:
                env.close()
            except Exception as exc:  # noqa: BLE001 - closing a broken env may fail too
                log.warning("closing a failed env raised %r", exc)


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


def _check_not_all_failing(finished: list[_Episode]) -> None:
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


def _final_info(info: dict) -> dict[str, Any]:
    out = {}
    for key, value in info.items():
        if key in _NOT_FINAL_INFO or not isinstance(value, (bool, int, float, str)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        out[key] = value
    return out


def _task(env: Any, info: dict) -> Any:
    if info.get("task") is not None:
        return info["task"]
    return getattr(getattr(env, "unwrapped", env), "task", None)


def _task_id(env: Any, info: dict) -> str:
    if info.get("task_id"):
        return str(info["task_id"])
    task = _task(env, info)
    return str(getattr(task, "id", "")) if task is not None else ""


def summarize_episodes(stats: Sequence[EpisodeStats]) -> dict[str, float]:
    """Batch aggregates: means per episode, the summary share of generated tokens and time.

    Every numeric entry ``k`` of :attr:`EpisodeStats.info` is averaged over the episodes that
    report it as ``k_per_episode`` (unless that names a figure above) (``format_errors_per_episode``, ``tests_passed_per_episode``...),
    so the figures an env adds to its ``info`` are reported without naming them here.
    """
    n = len(stats)
    if n == 0:
        return {}
    gen = sum(s.generated_tokens for s in stats)
    summ = sum(s.summary_tokens for s in stats)
    t_sum = sum(s.summary_gen_time_s for s in stats)
    t_all = t_sum + sum(s.other_gen_time_s for s in stats)
    out = {
        "episodes": float(n),
        "success_rate": sum(s.success for s in stats) / n,
        "reward_mean": sum(s.reward for s in stats) / n,
        "traces_per_episode": sum(s.num_traces for s in stats) / n,
        "compactions_per_episode": sum(s.compactions for s in stats) / n,
        "summary_tokens_per_episode": summ / n,
        "generated_tokens_per_episode": gen / n,
        "summary_token_share": summ / gen if gen else 0.0,
        "summary_time_share": t_sum / t_all if t_all else 0.0,
        "summary_gen_time_per_episode_s": t_sum / n,
        "wall_clock_per_episode_s": sum(s.wall_clock_s for s in stats) / n,
        "truncated_rate": sum(s.truncated for s in stats) / n,
        "sandbox_errors": float(sum(s.sandbox_error is not None for s in stats)),
        "steps_per_episode": sum(s.steps for s in stats) / n,
        "trace_tokens": float(sum(s.trace_tokens for s in stats)),
        "success_stderr": _stderr([float(s.success) for s in stats]),
    }
    out.update((k, v) for k, v in _info_means(stats).items() if k not in out)  # a field's name wins
    return out


def _info_means(stats: Sequence[EpisodeStats]) -> dict[str, float]:
    values: dict[str, list[float]] = {}
    for s in stats:
        for key, value in s.info.items():
            if not isinstance(value, str):
                values.setdefault(f"{key}_per_episode", []).append(float(value))
    return {key: sum(v) / len(v) for key, v in sorted(values.items())}


def _stderr(xs: Sequence[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    m = sum(xs) / n
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n)
