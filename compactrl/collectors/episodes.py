"""Episodes as the collectors run them: planned, running in an env slot, finished with their statistics.

Both collectors (:class:`~compactrl.collectors.trace_collector.TraceCollector` in one process, the Ray
collector's workers in :mod:`compactrl.distributed.collector`) move an episode through the same states:

1. an :class:`EpisodePlan` says what its ``env.reset`` receives (group, task seed, reset options);
   collectors draw plans from their task-seed stream or take a given list;
2. an :class:`EnvSlot` holds one environment and the :class:`Episode` it runs (none when idle); the
   episode gathers the finished traces the env hands over in ``info["trace"]``
   (:meth:`Episode.take_trace`) and its :class:`EpisodeStats`;
3. the episode ends by the env (terminated or truncated), or as failed (:meth:`Episode.end_failed`:
   truncated, with ``sandbox_error`` saying why), and :meth:`EnvSlot.finish` frees the slot.

:data:`CONFIG_ERRORS` separates the errors that stop a collection from the infrastructure failures it
survives; :func:`summarize_episodes` gives a batch's aggregates.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from compactrl.types import Trace

log = logging.getLogger(__name__)

EnvFn = Callable[[], Any]
"""Builds one environment (one that follows the ContextBudget ``info`` contract)."""

CONFIG_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError)
"""Raised for a bad configuration or a policy bug (e.g. token ids outside the vocabulary): these
propagate. Every other exception from an env is an infrastructure failure the collection survives."""

NOT_FINAL_INFO = frozenset({
    "trace", "prompt_token_ids", "max_new_tokens", "compaction_required", "compacted", "trace_index",
    "context_tokens", "clipped_tokens", "tool", "task", "task_id", "success", "sandbox_error", "num_traces",
    "num_compactions", "summary_tokens",
})
"""Keys of a final ``info`` that :attr:`EpisodeStats.info` leaves out: per-step bookkeeping of the
wrapper, and figures that :class:`EpisodeStats` has a field for (one name per figure)."""


@dataclass
class EpisodeStats:
    """What one episode cost and earned.

    Generation time is measured per ``policy.act`` call (one round) and shared between the requests
    of that round in proportion to the tokens each generated (equal shares when a policy returns
    plain strings), so the per-episode times of a batch add up to the batch's generation time
    (:func:`episode_time_totals`). Not so ``wall_clock_s``: the episodes of a round run together, so
    their wall-clock times overlap and their sum counts a round once per episode.
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
    summary_latencies_s: list[float] = field(default_factory=list)
    """How long each summary call kept the episode waiting: the wall-clock of the batched ``policy.act``
    round that wrote it (the compaction latency the agent sees, not its token share of the round)."""
    wall_clock_s: float = 0.0
    """From reset to the end of the episode (includes waiting for other envs of a round; overlaps the
    other episodes' times, so never sum it over a batch)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Scalar entries (numbers, strings) of the env's last ``info``, e.g. ``format_errors``,
    ``tests_passed``, ``context_tokens_max``, ``test_summary``; without the wrapper's per-step
    bookkeeping and without what a field above already holds (see :data:`NOT_FINAL_INFO`)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class EpisodePlan:
    """An episode not started yet: what its ``env.reset`` receives.

    ``group_id`` and ``task_seed`` become the episode's (a GRPO group is the plans that share both);
    ``options`` is passed as ``env.reset(seed=task_seed, options=options)``.
    """

    group_id: int
    task_seed: int
    options: dict[str, Any] | None


@dataclass
class Episode:
    """A running (or just ended) episode: its statistics and the traces it finished, in order.

    ``started`` is the ``time.perf_counter()`` at creation, from which :meth:`EnvSlot.finish`
    measures :attr:`EpisodeStats.wall_clock_s`.
    """

    stats: EpisodeStats
    traces: list[Trace] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def take_trace(self, info: dict) -> None:
        """Keep ``info["trace"]`` when a step finished one, and count it in the statistics."""
        tr = info.get("trace")
        if tr is not None:
            self.traces.append(tr)
            st = self.stats
            st.num_traces += 1
            st.compactions += int(bool(tr.ends_with_summary))
            st.generated_tokens += sum(tr.policy_mask)
            st.summary_tokens += sum(tr.summary_mask)
            st.trace_tokens += len(tr)

    def end_failed(self, reason: str) -> None:
        """End the episode as truncated and unsuccessful, ``reason`` its ``sandbox_error``; the
        traces it finished so far are kept."""
        st = self.stats
        st.truncated, st.terminated, st.success = True, False, False
        st.sandbox_error = reason

    def end(self, info: dict, terminated: bool, truncated: bool) -> None:
        """Record how the env ended the episode, from its final step's ``info``.

        ``success`` is ``info["success"]`` when given, else ``reward > 0``; an ``info["sandbox_error"]``
        makes the end a truncation whatever the env said.
        """
        stats = self.stats
        stats.info = final_info(info)
        stats.terminated, stats.truncated = bool(terminated), bool(truncated) and not terminated
        stats.success = bool(info.get("success", stats.reward > 0))
        if info.get("sandbox_error"):
            stats.sandbox_error = str(info["sandbox_error"])
            stats.truncated, stats.terminated = True, False


@dataclass
class EnvSlot:
    """One environment and the episode it runs (``episode`` None when idle).

    ``env`` is built by ``env_fn`` when an episode starts and the slot has none (first use, or after
    :meth:`close_env`); ``obs`` and ``info`` are the env's last observation and ``info``.
    """

    env_fn: EnvFn
    env: Any = None
    obs: Any = None
    info: dict = field(default_factory=dict)
    episode: Episode | None = None

    def finish(self) -> Episode:
        """Free the slot and return its episode, its wall-clock time measured now."""
        episode = self.episode
        episode.stats.wall_clock_s = time.perf_counter() - episode.started
        self.episode, self.obs, self.info = None, None, {}
        return episode

    def close_env(self) -> None:
        """Close the env (a failed one is never reused); the next episode builds a new one. Idempotent,
        and a failure to close is logged, never raised."""
        env, self.env = self.env, None
        if env is not None:
            try:
                env.close()
            except Exception as exc:  # noqa: BLE001 - closing a broken env may fail too
                log.warning("closing a failed env raised %r", exc)


def final_info(info: dict) -> dict[str, Any]:
    """The entries of a final ``info`` that :attr:`EpisodeStats.info` keeps: finite scalars, without
    :data:`NOT_FINAL_INFO`."""
    out = {}
    for key, value in info.items():
        if key in NOT_FINAL_INFO or not isinstance(value, (bool, int, float, str)):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        out[key] = value
    return out


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
        **latency_quantiles([x for s in stats for x in s.summary_latencies_s]),
    }
    out.update((k, v) for k, v in _info_means(stats).items() if k not in out)  # a field's name wins
    return out


def latency_quantiles(latencies: Sequence[float]) -> dict[str, float]:
    """``summary_latency_{p50,p90,max}_s`` of the summary calls' latencies (nearest-rank quantiles), and
    how many there were (``summary_calls``); {} when there were none."""
    if not latencies:
        return {}
    xs = sorted(latencies)

    def rank(q: float) -> float:
        return xs[max(0, math.ceil(q * len(xs)) - 1)]

    return {"summary_calls": float(len(xs)), "summary_latency_p50_s": rank(0.5), "summary_latency_p90_s": rank(0.9),
            "summary_latency_max_s": xs[-1]}


def episode_time_totals(stats: Sequence[EpisodeStats]) -> dict[str, float]:
    """The episodes' generation and env times summed: ``generate_s`` (responses that are not summaries),
    ``summary_s`` and ``env_s``, the keys of
    :data:`~compactrl.collectors.trace_collector.BATCH_TIME_KEYS`.

    For the episodes of one collector in one process these add up to its batch's time in those phases;
    episodes collected by several processes at once (Ray rollout workers) give the workers' time
    together, which can exceed the wall-clock the batch took.
    """
    return {"generate_s": sum(s.other_gen_time_s for s in stats),
            "summary_s": sum(s.summary_gen_time_s for s in stats),
            "env_s": sum(s.env_time_s for s in stats)}


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


__all__ = ["CONFIG_ERRORS", "NOT_FINAL_INFO", "EnvFn", "Episode", "EpisodePlan", "EpisodeStats", "EnvSlot",
           "episode_time_totals", "final_info", "summarize_episodes"]
