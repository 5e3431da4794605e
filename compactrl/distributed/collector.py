"""Trace collection on Ray: rollout workers as actors, behind :class:`TraceCollector`'s API.

Each rollout worker is a Ray actor that owns ``envs_per_worker`` environments (any backend: their
sandboxes live on the worker's node) and a policy of its own, built there by ``policy_fn(index)``
(generation in the worker: CPU, small models), or, with ``num_engines > 0``, a client of a shared
engine actor that generates for several workers (:mod:`compactrl.distributed.engines`). It steps its
envs in lock-step rounds with a :class:`TraceCollector` of its own, exactly as the single-process
collector does.

Task seeds: the driver draws the batch's plan (group ids and task seeds) from the same seeded stream
as :class:`TraceCollector` (same ``seed`` -> same seeds, groups and episode ids), then hands whole
groups to workers round-robin: group ``g`` of a batch runs on worker ``g mod num_workers``. A GRPO
group is therefore never split, and an episode does not depend on which worker ran it: for a
policy that is a function of its context (scripted, greedy decoding) the batch equals the
single-process one row for row. Sampled episodes match in distribution only: each worker draws from
its own random stream (``policy_fn`` receives the worker index to seed it). With ``tokens_per_batch``
the groups are handed out as workers free up instead (see :meth:`RayCollector._run_by_tokens`).

Weights: :meth:`RayCollector.update_policy_weights_` puts one state dict in the object store and
every worker (or engine) loads it before its next episodes; each trace row records the
``policy_version`` it was sampled with (0 for the weights given at construction, +1 per update).

Faults: a worker that dies (process killed, node lost) while running its share of a batch is
replaced by a new actor (same index, current weights), and its share is *re-run* from the start with
the same task seeds and episode ids. None of the dead worker's traces ever reached the driver, so no
trace is counted twice and the batch keeps its whole, on-policy episodes. A share that fails
``max_retries`` times ends its episodes as truncated with ``sandbox_error`` saying so. Starting a
worker waits at most ``start_timeout_s``; when none can start, a ``RuntimeError`` says why. An
engine that dies is another matter (the workers live on): see :mod:`compactrl.distributed.engines`.

Asynchronous collection (``max_staleness > 0``, see :meth:`RayCollector._next_async`) lives in
:class:`_ShareDriver`, which :class:`ThreadCollector` shares: the same loop over one :class:`RolloutWorker`
run on a thread of the trainer's process (docs/distributed.md#asynchronous-rollouts).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
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
from compactrl.collectors.trace_collector import TraceCollector
from compactrl.distributed.cluster import wait_one
from compactrl.distributed.engines import EngineClient, EngineFn, EngineLost, InferenceEngine, engine_client
from compactrl.types import Policy, Trace

log = logging.getLogger(__name__)

PolicyFn = Callable[[int], Policy]

_MAX_TRACELESS_ROUNDS = 8
"""Batches in a row whose every episode ended without a trace before collection gives up."""

_MAX_TRACELESS_EPISODES = 64
"""Episodes of a token-count batch that may end without a trace before it stops handing out more."""


class _PlanCollector(TraceCollector):
    """A worker's collector: runs a given plan of (group, task seed) episodes, as ``next`` would.

    With an :class:`EngineClient` policy it also ends the episodes of a round whose engine died as
    truncated. It notes per trace the oldest policy version its responses were sampled with (the
    engine's answer, else the worker's ``version``), and calls ``before_round`` before each round
    (where a worker applies weights that arrived mid-plan: an episode goes on with the new weights).
    """

    version = 0
    before_round: Callable[[], None] | None = None
    lost_errors: tuple[type[Exception], ...] = (EngineLost,)
    """Errors of a round's ``act`` that end the round's episodes as truncated (configuration errors propagate)."""

    def run_plan(self, plans: Sequence[EpisodePlan], version: int) -> list[tuple[EpisodeStats, list[Trace], list[int]]]:
        """The plan's episodes: (stats, traces, the policy version of each trace)."""
        self.version = version
        self._versions: dict[tuple[int, int], int] = {}
        episodes = self._collect_episodes(deque(plans), fixed=True)
        return [(ep.stats, ep.traces, [self._versions.get((ep.stats.episode_id, k), version)
                                       for k in range(len(ep.traces))]) for ep in episodes]

    def _round(self, busy: list[EnvSlot]) -> list[Episode]:
        if self.before_round is not None:
            self.before_round()
        # a response belongs to the trace in progress: index = traces the episode has finished so far
        keys = [(s.episode.stats.episode_id, len(s.episode.traces)) for s in busy]
        try:
            finished = super()._round(busy)
        except self.lost_errors as exc:  # raised by act, before any env of the round was stepped
            if isinstance(exc, CONFIG_ERRORS):
                raise
            log.warning("the policy failed (%r); the round's %d episodes end as truncated", exc, len(busy))
            return [self._lost_to_engine(slot, exc) for slot in busy]
        served = getattr(self.policy, "last_version", None)
        served = self.version if served is None else served
        for key in keys:
            self._versions[key] = min(self._versions.get(key, served), served)
        return finished

    @staticmethod
    def _lost_to_engine(slot: EnvSlot, exc: Exception) -> Episode:
        slot.episode.end_failed(str(exc))
        return slot.finish()  # the env is sound: its next reset starts the next episode

    def _survivable(self, exc: Exception, *, built: bool) -> bool:
        return not isinstance(exc, CONFIG_ERRORS)  # as in next(): a config or policy bug propagates


class RolloutWorker:
    """A worker's body: a Ray actor's (wrapped by ``ray.remote`` in :class:`RayCollector`), or run on a thread of
    the trainer's process (:class:`ThreadCollector`; ``threads=None`` leaves the process's torch threads alone)."""

    def __init__(self, env_fns: Sequence[EnvFn], policy_fn: PolicyFn, index: int, *, pad_id: int,
                 give_task_to_policy: bool, threads: int | None,
                 lost_errors: tuple[type[Exception], ...] | None = None) -> None:
        if threads is not None:
            torch.set_num_threads(threads)
        self.policy = policy_fn(index)
        self.collector = _PlanCollector(env_fns, self.policy, episodes_per_batch=1, pad_id=pad_id,
                                        give_task_to_policy=give_task_to_policy)
        if lost_errors is not None:
            self.collector.lost_errors = lost_errors
        self.collector.before_round = self.apply_pending
        self.version = 0
        self.stopping = False
        """Set from another thread: the running plan stops before its next round (:class:`_Stopped`)."""
        self._pending: tuple[list, int] | None = None
        self._lock = threading.Lock()

    def ready(self) -> int:
        return os.getpid()

    def set_weights(self, weights: list, version: int) -> None:
        """``weights``: [object ref, state dict or None] (boxed, so an engine client can pass a ref on unfetched)."""
        if isinstance(self.policy, EngineClient):
            self.policy.follow(weights, version)
        elif weights[0] is not None:
            self.policy.load_state_dict(_fetch(weights[0]))
        self.version = self.collector.version = version

    def offer_weights(self, weights: list, version: int) -> None:
        """Weights published while a plan runs (asynchronous collection; the actor is threaded): kept until
        the plan's next round, which loads them (:meth:`apply_pending`), so no forward sees half of them."""
        with self._lock:
            if self._pending is None or self._pending[1] < version:
                self._pending = (weights, version)

    def apply_pending(self) -> None:
        if self.stopping:
            raise _Stopped("the collector is shutting down")
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None and pending[1] > self.version:
            self.set_weights(*pending)

    def run(self, plans: list[EpisodePlan]) -> tuple[list[tuple[EpisodeStats, list[Trace], list[int]]], list[int]]:
        """The plan's episodes (stats, traces, each trace's policy version) and the pids of the engines that
        answered."""
        self.apply_pending()
        episodes = self.collector.run_plan(plans, self.version)
        return episodes, sorted(getattr(self.policy, "engine_pids", ()))

    def shutdown(self) -> None:
        self.collector.shutdown()


class _Stopped(Exception):
    """A thread worker's plan was stopped by :meth:`ThreadCollector.shutdown`."""


class _WorkerLost(Exception):
    """A worker died while running a share (its cause: the Ray or thread error)."""


def _fetch(weights: Any) -> dict[str, Any]:
    if isinstance(weights, dict):  # a thread worker's: the state dict itself
        return weights
    import ray

    return ray.get(weights)


Result = tuple[EpisodeStats, list[Trace], list[int]]
"""A finished episode: its stats, its traces and the policy version of each trace."""


class _ShareDriver:
    """The driver's side of collection by *shares* (whole groups that one worker runs), shared by
    :class:`RayCollector` and :class:`ThreadCollector`: the task stream (drawn as :class:`TraceCollector` draws
    it), the asynchronous loop (shares in flight, finished episodes waiting for a batch, bounded staleness and
    its ``wait_s``/``staleness_*``/``stale_dropped``/``episodes_in_flight`` stats), the trace batch with each
    trace's ``policy_version``, and the counters a checkpoint keeps.

    A subclass runs the shares on its workers: ``_ensure_workers(indices)`` starts the missing ones and gives
    them the current weights, ``_call(w, plans)`` starts worker ``w`` on a share and returns a handle,
    ``_wait_done(handles, timeout)`` is the first of ``handles`` to finish (None after ``timeout`` seconds),
    ``_result(handle)`` its episodes and the
    pids of the engines that answered (raising :class:`_WorkerLost` when the worker died), ``_drop_worker(w)``
    forgets a dead worker (the next ``_ensure_workers`` replaces it).
    """

    def __init__(self, *, num_workers: int, envs_per_worker: int, episodes_per_batch: int | None,
                 tokens_per_batch: int | None, total_batches: int | None, group_size: int, seed: int, pad_id: int,
                 give_task_to_policy: bool, reset_options: dict | None, max_staleness: int, max_retries: int) -> None:
        if max_staleness < 0 or (max_staleness and tokens_per_batch is not None):
            raise ValueError(f"max_staleness: expected >= 0 (and 0 with tokens_per_batch), got {max_staleness}")
        self.num_workers, self.envs_per_worker = num_workers, envs_per_worker
        self.episodes_per_batch, self.total_batches, self.group_size = episodes_per_batch, total_batches, group_size
        self.tokens_per_batch = tokens_per_batch
        self.pad_id, self.give_task_to_policy, self.reset_options = pad_id, give_task_to_policy, reset_options
        self.max_staleness, self.max_retries = max_staleness, max_retries
        self._inflight: dict[Any, tuple[int, list[tuple[int, EpisodePlan]], int]] = {}
        """Asynchronous collection: the share each busy worker runs, by its call's handle."""
        self._ready: list[Result] = []
        """Asynchronous collection: finished episodes not yet in a batch, in the order they finished."""
        self.stale_dropped = 0
        """Asynchronous collection: episodes dropped for being more than ``max_staleness`` versions old."""
        self._workers: list[Any] = [None] * num_workers
        self._loaded = [-1] * num_workers  # the policy version each worker holds
        self.policy_version = 0
        self.restarts = 0
        """Workers replaced after dying."""
        self._next_episode_id = self._next_group_id = self._batches = 0
        self._taken_since_sync = 0
        """Asynchronous collection: batches handed out since the last publication of weights."""
        self._cond = threading.Condition()  # (an RLock) the driver's state, shared with the pump thread
        self._pump: threading.Thread | None = None
        self._pump_stop = threading.Event()
        self._pump_error: BaseException | None = None
        self.set_seed(seed)
        self.last_episode_stats: list[EpisodeStats] = []
        self.last_batch_stats: dict[str, float] = {}

    # -- TraceCollector's surface -------------------------------------------------------------------

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        self._seed = int(seed)
        self._rng = np.random.default_rng(self._seed)
        return self._seed + 1

    def state_dict(self) -> dict[str, Any]:
        """The task stream's counters, which have counted the shares in flight too: a collector resumed from it
        starts new episodes with new ids (those in flight, and those finished but in no batch, are dropped)."""
        with self._cond:
            return {"seed": self._seed, "rng": self._rng.bit_generator.state,
                    "next_episode_id": self._next_episode_id, "next_group_id": self._next_group_id,
                    "batches": self._batches, "policy_version": self.policy_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._cond:
            self.set_seed(state["seed"])
            self._rng.bit_generator.state = state["rng"]
            self._next_episode_id, self._next_group_id = int(state["next_episode_id"]), int(state["next_group_id"])
            self._batches = int(state["batches"])
            self.policy_version = int(state.get("policy_version", self.policy_version))
            self._ready, self._taken_since_sync = [], 0  # finished under the old counters: never handed out

    def __iter__(self):
        while self.total_batches is None or self._batches < self.total_batches:
            yield self.next()

    def __len__(self) -> int:
        if self.total_batches is None:
            raise TypeError(f"an endless {type(self).__name__} (total_batches=None) has no length")
        return self.total_batches

    def _plan(self, groups: int | None = None) -> list[tuple[int, EpisodePlan]]:
        """(episode id, plan) of ``groups`` whole groups (default: one batch), drawn as TraceCollector draws them."""
        plans = []
        for _ in range(self.episodes_per_batch // self.group_size if groups is None else groups):
            group_id, task_seed = self._next_group_id, int(self._rng.integers(0, 2**31 - 1))
            self._next_group_id += 1
            for _ in range(self.group_size):
                plans.append((self._next_episode_id, EpisodePlan(group_id, task_seed, self.reset_options)))
                self._next_episode_id += 1
        return plans

    def _received(self, w: int, share: list[tuple[int, EpisodePlan]], episodes: list, engine_pids: list[int],
                  ) -> list[Result]:
        """A share's episodes from worker ``w``, under the ids and groups the driver gave them."""
        finished = []
        for (eid, plan), (stats, traces, versions) in zip(share, episodes):
            stats.episode_id, stats.group_id = eid, plan.group_id
            finished.append((stats, traces, versions))
        return finished

    # -- asynchronous collection -------------------------------------------------------------------------

    def _next_async(self) -> TensorDict | None:
        """The next batch from episodes the workers keep running (``max_staleness > 0``).

        A pump thread (:meth:`_pump_loop`) keeps every worker busy, also while the learner trains: a worker that
        finishes a share gets the next at once, at the newest published version, and a busy worker loads
        weights published mid-share before its next round. Workers run ahead by at most ``max_staleness``
        batches (:meth:`_room`). A batch takes the first ``episodes_per_batch`` finished episodes (whole
        groups: a share holds whole groups) of which no trace is more than ``max_staleness`` versions older
        than the newest; older groups are dropped (``stale_dropped``).
        """
        t0 = time.perf_counter()
        rounds = 0
        self._start_pump()
        with self._cond:
            while True:
                if self._pump_error is not None:
                    raise self._pump_error
                self._drop_stale()
                if len(self._ready) >= self.episodes_per_batch:
                    take, self._ready = self._ready[:self.episodes_per_batch], self._ready[self.episodes_per_batch:]
                    self._cond.notify_all()  # room for more shares
                    if any(traces for _, traces, _ in take):
                        break
                    rounds += 1
                    if rounds >= _MAX_TRACELESS_ROUNDS:
                        raise RuntimeError(f"{rounds} batches in a row ended without a finished trace; the "
                                           "environments are failing (see the workers' logged sandbox errors)")
                    continue
                self._cond.wait(timeout=1.0)
            self._batches += 1
            self._taken_since_sync += 1
            batch = self._batch(sorted(take, key=lambda r: r[0].episode_id))
            ages = [self.policy_version - v for _, _, vs in take for v in vs]
            self.last_batch_stats.update(wait_s=time.perf_counter() - t0, stale_dropped=float(self.stale_dropped),
                                         staleness_mean=sum(ages) / max(len(ages), 1),
                                         staleness_max=float(max(ages, default=0)),
                                         episodes_in_flight=float(self._outstanding() - len(self._ready)))
        return batch

    def _outstanding(self) -> int:
        """Episodes started and not yet in a batch: finished (ready) or in flight."""
        return len(self._ready) + sum(len(sh) for _, sh, _ in self._inflight.values())

    def _room(self) -> int:
        """Episodes that may still start: the workers run at most ``max_staleness`` batches ahead of the learner.
        Up to ``(max_staleness + 1) x episodes_per_batch`` episodes may be outstanding, less a batch for each
        one handed out since the last publication (at most ``max_staleness`` of them: there is always room
        for the next batch). An episode started at version ``v`` then goes into a batch trained at version at
        most ``v + max_staleness``, so the bound drops nothing that ran at full speed."""
        ahead = self.max_staleness + 1 - min(self._taken_since_sync, self.max_staleness)
        return ahead * self.episodes_per_batch - self._outstanding()

    def _set_newest(self, version: int) -> None:
        """(Under the lock.) ``version`` is the newest: the workers may run ahead of it again (:meth:`_room`)."""
        self.policy_version, self._taken_since_sync = version, 0
        self._cond.notify_all()

    def _start_pump(self) -> None:
        with self._cond:
            if self._pump is None or not self._pump.is_alive():
                self._pump_stop.clear()
                self._pump = threading.Thread(target=self._pump_loop, name="compactrl-share-pump", daemon=True)
                self._pump.start()

    def _stop_pump(self) -> None:
        """Stop the pump thread (shares in flight keep running until the caller drops them)."""
        self._pump_stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._pump is not None and self._pump is not threading.current_thread():
            self._pump.join(timeout=60)
        self._pump = None

    def _pump_loop(self) -> None:
        """Give idle workers shares while there is room; move finished shares to the ready list. Waits outside
        the lock, so the learner's thread publishes weights and takes batches meanwhile."""
        try:
            while not self._pump_stop.is_set():
                with self._cond:
                    self._refill()
                    handles = list(self._inflight)
                    if not handles:
                        self._cond.wait(timeout=0.5)
                        continue
                done = self._wait_done(handles, timeout=0.2)
                if done is None:
                    continue
                with self._cond:
                    if done in self._inflight and not self._pump_stop.is_set():
                        self._await_one(done)
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - handed to the learner's thread, raised by next()
            with self._cond:
                self._pump_error = exc
                self._cond.notify_all()

    def _refill(self) -> None:
        """Give every worker without a share in flight a new one (whole groups, enough for its envs), while
        there is room (:meth:`_room`)."""
        idle = [w for w in range(self.num_workers) if all(w != v[0] for v in self._inflight.values())]
        for w in idle:
            groups = min(max(1, self.envs_per_worker // self.group_size), self._room() // self.group_size)
            if groups < 1:
                return
            self._ensure_workers([w])
            self._submit(w, self._plan(groups), 0)

    def _submit(self, w: int, share: list[tuple[int, EpisodePlan]], tries: int) -> None:
        self._inflight[self._call(w, [p for _, p in share])] = (w, share, tries)

    def _await_one(self, done: Any) -> None:
        """A finished share: its episodes join the ready ones (a dead worker is replaced and its share re-run,
        as in synchronous collection)."""
        w, share, tries = self._inflight.pop(done)
        try:
            episodes, engine_pids = self._result(done)
        except _WorkerLost as exc:
            log.warning("rollout worker %d died (%r); re-running its %d episodes", w, exc.__cause__, len(share))
            self._drop_worker(w)
            if tries < self.max_retries:
                self.restarts += 1
                self._ensure_workers([w])
                self._submit(w, share, tries + 1)
            else:  # its worker is started again by the next refill
                self._ready += [(_lost(eid, plan, exc.__cause__ or exc), [], []) for eid, plan in share]
            return
        self._ready += self._received(w, share, episodes, engine_pids)

    def _drop_stale(self) -> None:
        """Drop the ready groups holding a trace more than ``max_staleness`` versions old."""
        oldest = self.policy_version - self.max_staleness
        stale = {stats.group_id for stats, _, vs in self._ready if vs and min(vs) < oldest}
        if stale:
            kept = [r for r in self._ready if r[0].group_id not in stale]
            self.stale_dropped += len(self._ready) - len(kept)
            self._ready = kept

    def _batch(self, results: list[Result]) -> TensorDict | None:
        self.last_episode_stats = [stats for stats, _, _ in results]
        self.last_batch_stats = summarize_episodes(self.last_episode_stats)
        self.last_batch_stats.update(self._worker_stats())
        rows = [(EpisodeMeta(s.episode_id, s.group_id, s.terminated, s.truncated), traces)
                for s, traces, _ in results if traces]
        if not rows:
            return None
        batch = stack_traces(rows, pad_id=self.pad_id)
        versions = [v for _, traces, vs in results if traces for v in vs]
        batch["policy_version"] = torch.tensor(versions, dtype=torch.long)
        return batch


class RayCollector(_ShareDriver):
    """:class:`TraceCollector`'s API over Ray rollout workers (see the module docstring).

    Args:
        env_fns: the constructors of one worker's envs (``envs_per_worker`` of them); they are
            pickled to every worker, so they must not close over live resources.
        policy_fn: builds a worker's policy from its index (importable function or picklable object).
        num_workers: rollout worker actors.
        episodes_per_batch: whole episodes per batch (a multiple of ``group_size``).
        tokens_per_batch: instead, close a batch once its finished traces hold this many tokens
            (see :meth:`_run_by_tokens`); exactly one of the two must be given.
        weights: the driver's policy (module or state dict) whose weights the workers start from;
            None keeps what ``policy_fn`` built (scripted policies).
        worker_num_cpus: CPUs Ray reserves per worker.
        threads: torch threads in each worker.
        start_timeout_s: how long a worker (or engine) may take to start before the collector gives up.
        max_retries: re-runs of a share whose worker died before its episodes end as truncated.
        num_engines: shared engine actors (see :mod:`compactrl.distributed.engines`); 0: every worker
            generates with its own ``policy_fn(index)``.
        engine_fn: builds engine ``e``'s policy (default ``policy_fn``); the workers then build none.
        engine_num_cpus, engine_num_gpus: resources Ray reserves per engine.
        engine_threads: torch threads in each engine.
        engine_max_restarts: times Ray restarts a dead engine (beyond them the run stops with an error).
        engine_timeout_s: longest wait for an engine's answer (a batch's generation plus a restart).
        Other arguments as for :class:`TraceCollector`.
    """

    def __init__(self, env_fns: Sequence[EnvFn], policy_fn: PolicyFn, *, num_workers: int,
                 episodes_per_batch: int | None = None, tokens_per_batch: int | None = None,
                 total_batches: int | None = None, group_size: int = 1, seed: int = 0, pad_id: int = 0,
                 give_task_to_policy: bool = True, reset_options: dict | None = None, weights: Any = None,
                 worker_num_cpus: float = 1.0, threads: int = 1, start_timeout_s: float = 120.0,
                 max_retries: int = 2, num_engines: int = 0, engine_fn: EngineFn | None = None,
                 engine_num_cpus: float = 1.0, engine_num_gpus: float = 0.0, engine_threads: int = 1,
                 engine_max_restarts: int = 2, engine_timeout_s: float = 600.0, max_staleness: int = 0) -> None:
        _validate(num_workers, len(env_fns), episodes_per_batch, tokens_per_batch, group_size, start_timeout_s)
        if num_engines < 0:
            raise ValueError(f"num_engines: expected >= 0, got {num_engines}")
        if engine_timeout_s <= 0:
            raise ValueError(f"engine_timeout_s: expected > 0, got {engine_timeout_s}")
        super().__init__(num_workers=num_workers, envs_per_worker=len(env_fns), episodes_per_batch=episodes_per_batch,
                         tokens_per_batch=tokens_per_batch, total_batches=total_batches, group_size=group_size,
                         seed=seed, pad_id=pad_id, give_task_to_policy=give_task_to_policy,
                         reset_options=reset_options, max_staleness=max_staleness, max_retries=max_retries)
        self.env_fns, self.policy_fn = list(env_fns), policy_fn
        self.worker_num_cpus, self.threads, self.start_timeout_s = worker_num_cpus, threads, start_timeout_s
        self.num_engines, self.engine_fn = num_engines, engine_fn or policy_fn
        self.engine_resources = {"num_cpus": engine_num_cpus, "num_gpus": engine_num_gpus}
        self.engine_threads, self.engine_max_restarts = engine_threads, engine_max_restarts
        self.engine_timeout_s = engine_timeout_s
        self._engines: list[Any] = []
        self._engine_pids: list[set[int]] = [set() for _ in range(num_engines)]
        self._weights_ref: Any = None
        self._pending_weights = weights

    @property
    def engine_restarts(self) -> int:
        """Engine processes that replaced a dead one and have answered since (or started)."""
        return sum(max(0, len(p) - 1) for p in self._engine_pids)

    def engine_stats(self) -> list[dict[str, float]]:
        """Each running engine's :meth:`InferenceEngine.stats` (weight loads, calls, generations)."""
        import ray

        return ray.get([e.stats.remote() for e in self._engines], timeout=self.engine_timeout_s)

    # -- TraceCollector's surface -------------------------------------------------------------------

    def update_policy_weights_(self, policy_or_weights: Any = None, **kwargs: Any) -> None:
        """Publish new weights once (one object in the store); workers load them before their next episodes,
        and, collecting asynchronously, the busy ones before their next round (partial rollouts)."""
        with self._cond:
            self._pending_weights = policy_or_weights
            self._set_newest(self.policy_version + 1)
            self._weights_ref = None
            if self._inflight:
                import ray

                self._weights_ref = ray.put(_state_of(policy_or_weights)) if policy_or_weights is not None else None
                for w, _, _ in self._inflight.values():
                    self._workers[w].offer_weights.remote([self._weights_ref], self.policy_version)
                    self._loaded[w] = self.policy_version

    def shutdown(self) -> None:
        """Close every worker's envs and end the actors (episodes in flight are dropped). Idempotent."""
        import ray

        self._stop_pump()
        self._inflight, self._ready = {}, []
        alive = [w for w in self._workers if w is not None]
        engines, self._engines = self._engines, []
        self._workers = [None] * self.num_workers
        if not (alive or engines) or not ray.is_initialized():
            return
        try:
            ray.get([w.shutdown.remote() for w in alive], timeout=30)
        except Exception as exc:  # noqa: BLE001 - a dead worker has nothing left to close
            log.warning("closing rollout workers: %r", exc)
        for a in alive + engines:
            ray.kill(a)

    # -- collection ------------------------------------------------------------------------------------

    def next(self) -> TensorDict | None:
        """Collect one batch of whole episodes on the workers and return its trace batch."""
        if self.max_staleness:
            return self._next_async()
        results: list[tuple[EpisodeStats, list[Trace], list[int]]] = []
        for _ in range(_MAX_TRACELESS_ROUNDS):
            results += self._run_by_tokens() if self.tokens_per_batch else self._run(self._plan())
            if any(traces for _, traces, _ in results):
                break
        else:
            raise RuntimeError(f"{len(results)} episodes in a row ended without a finished trace; the environments "
                               "are failing (see the workers' logged sandbox errors)")
        self._batches += 1
        return self._batch(sorted(results, key=lambda r: r[0].episode_id))

    def _run(self, plans: list[tuple[int, EpisodePlan]]) -> list[tuple[EpisodeStats, list[Trace], list[int]]]:
        """Run the plan's groups on the workers (group g on worker g mod W), re-running lost shares."""
        shares: dict[int, list[tuple[int, EpisodePlan]]] = {}
        first_group = plans[0][1].group_id if plans else 0
        for eid, plan in plans:
            shares.setdefault((plan.group_id - first_group) % self.num_workers, []).append((eid, plan))
        return self._run_shares(shares)

    def _run_by_tokens(self) -> list[tuple[EpisodeStats, list[Trace], list[int]]]:
        """Token-count batch: every worker gets whole groups (enough for its envs), and one that finishes
        gets more while the batch's finished traces hold fewer than ``tokens_per_batch`` tokens; the
        shares still running when that is reached are finished and included, as in TraceCollector."""
        groups = max(1, self.envs_per_worker // self.group_size)
        tokens = episodes = 0

        def more(finished: list[tuple[EpisodeStats, list[Trace], int]]) -> list[tuple[int, EpisodePlan]] | None:
            nonlocal tokens, episodes
            tokens += sum(stats.trace_tokens for stats, _, _ in finished)
            episodes += len(finished)
            if not tokens and episodes >= _MAX_TRACELESS_EPISODES:
                return None  # every env is failing: next() decides whether to try again
            return self._plan(groups) if tokens < self.tokens_per_batch else None

        return self._run_shares({w: self._plan(groups) for w in range(self.num_workers)}, more)

    def _run_shares(self, shares: dict[int, list[tuple[int, EpisodePlan]]], more: Callable | None = None,
                    ) -> list[tuple[EpisodeStats, list[Trace], int]]:
        """Run each worker's share, re-running the share of a worker that died; ``more(results of a
        share)`` may return the next share for the worker that ran it (None: nothing more)."""
        import ray

        self._ensure_workers(sorted(shares))
        calls = {}

        def submit(w: int, share: list[tuple[int, EpisodePlan]], tries: int) -> None:
            calls[self._workers[w].run.remote([p for _, p in share])] = (w, share, tries)

        for w, share in shares.items():
            submit(w, share, 0)
        out = []
        while calls:
            done = wait_one(calls)
            w, share, tries = calls.pop(done)
            try:
                episodes, engine_pids = ray.get(done)
            except ray.exceptions.RayActorError as exc:
                log.warning("rollout worker %d died (%s); re-running its %d episodes", w, type(exc).__name__,
                            len(share))
                self._workers[w] = None
                if tries < self.max_retries:
                    self.restarts += 1
                    self._ensure_workers([w])
                    submit(w, share, tries + 1)
                else:
                    out += [(_lost(eid, plan, exc), [], []) for eid, plan in share]
                continue
            finished = self._received(w, share, episodes, engine_pids)
            out += finished
            nxt = more(finished) if more is not None else None
            if nxt:
                submit(w, nxt, 0)
        return out

    def _received(self, w: int, share: list[tuple[int, EpisodePlan]], episodes: list, engine_pids: list[int],
                  ) -> list[Result]:
        if self.num_engines:
            self._engine_pids[w % self.num_engines].update(engine_pids)
        return super()._received(w, share, episodes, engine_pids)

    # -- the asynchronous loop's hooks (see _ShareDriver) -----------------------------------------------

    def _call(self, w: int, plans: list[EpisodePlan]) -> Any:
        return self._workers[w].run.remote(plans)

    def _wait_done(self, handles: list[Any], timeout: float) -> Any:
        return wait_one(handles, timeout=timeout)

    def _result(self, done: Any) -> tuple[list, list[int]]:
        import ray

        try:
            return ray.get(done)
        except ray.exceptions.RayActorError as exc:
            raise _WorkerLost(f"rollout worker lost: {type(exc).__name__}") from exc

    def _drop_worker(self, w: int) -> None:
        self._workers[w] = None

    def _worker_stats(self) -> dict[str, float]:
        stats = {"rollout_workers": float(self.num_workers), "worker_restarts": float(self.restarts)}
        if self.num_engines:
            stats.update(engines=float(self.num_engines), engine_restarts=float(self.engine_restarts))
        return stats

    def _ensure_workers(self, indices: Sequence[int]) -> None:
        """Start the missing workers among ``indices`` and give every one the current weights."""
        import ray

        if not ray.is_initialized():  # ray.remote would start a default Ray, listening on every interface
            raise RuntimeError("Ray is not running: start it with compactrl.distributed.local_ray() or "
                               "compactrl train --ray / --ray-address")
        if self._weights_ref is None and self._pending_weights is not None:
            self._weights_ref = ray.put(_state_of(self._pending_weights))
        self._ensure_engines()
        new = [w for w in indices if self._workers[w] is None]
        for w in new:
            self._workers[w] = self._actor_class().remote(
                self.env_fns, self._worker_policy_fn(), w, pad_id=self.pad_id,
                give_task_to_policy=self.give_task_to_policy, threads=self.threads)
        self._wait_ready([self._workers[w] for w in new], "rollout worker", f"{self.worker_num_cpus} CPU")
        stale = [w for w in indices if w in new or self._loaded[w] != self.policy_version]
        # boxed: a worker with an engine client passes the reference on; only engines fetch it
        ray.get([self._workers[w].set_weights.remote([self._weights_ref], self.policy_version) for w in stale])
        for w in stale:
            self._loaded[w] = self.policy_version

    def _ensure_engines(self) -> None:
        """Start the engine actors once; Ray itself restarts one that dies (``engine_max_restarts``)."""
        import ray

        if not self.num_engines or self._engines:
            return
        sharing = -(-self.num_workers // self.num_engines)  # workers per engine: one thread each, gathered
        cls = ray.remote(**self.engine_resources, max_restarts=self.engine_max_restarts, max_task_retries=0,
                         max_concurrency=sharing + 1)(InferenceEngine)
        engines = [cls.remote(self.engine_fn, e, threads=self.engine_threads) for e in range(self.num_engines)]
        pids = self._wait_ready(engines, "engine actor", self.engine_resources)
        for e, pid in enumerate(pids):
            self._engine_pids[e].add(pid)
        self._engines = engines

    def _worker_policy_fn(self) -> PolicyFn:
        if not self.num_engines:
            return self.policy_fn
        return functools.partial(engine_client, tuple(self._engines), self.engine_timeout_s, self.engine_max_restarts)

    def _wait_ready(self, actors: list[Any], what: str, needs: Any) -> list[int]:
        import ray

        try:
            return ray.get([a.ready.remote() for a in actors], timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            for a in actors:  # an actor still waiting for resources would start later, unowned
                ray.kill(a)
            raise RuntimeError(f"no {what} started within start_timeout_s={self.start_timeout_s}s "
                               f"(cluster resources: {ray.available_resources()}; each needs {needs})") from None
        except ray.exceptions.RayActorError as exc:
            for a in actors:
                ray.kill(a)
            raise RuntimeError(f"a {what} could not be started: {exc}") from None

    def _actor_class(self):
        import ray

        # asynchronous: a second thread takes weights published while a share runs (offer_weights)
        return ray.remote(num_cpus=self.worker_num_cpus, max_restarts=0,
                          max_concurrency=2 if self.max_staleness else 1)(RolloutWorker)


class ThreadCollector(_ShareDriver):
    """Asynchronous collection in the trainer's process: the async loop of :class:`RayCollector`
    (``max_staleness >= 1``) over one :class:`RolloutWorker` on a background thread, which runs shares of whole
    groups on ``env_fns`` while the learner trains.

    The thread's sampler is either

    * ``policy_fn(0)`` with ``weights`` (the learner's policy): a copy of its own, never the module being
      trained. Each published version (a cloned state dict: the learner then goes on changing its tensors in
      place) is loaded before the worker's next round, a safe point where no forward is running; or
    * ``policy`` used as it is (the trainer's vLLM engine, a scripted policy): each publication calls its
      ``update_weights`` hook, if any, at once from the trainer's thread, between two of the worker's requests
      (a lock serialises the two threads' use of the engine), and its ``last_version``, else the version it
      was last given, labels each response.

    A failing ``act`` (the engine died mid-request) ends that round's episodes as truncated, their finished
    traces kept; any other error that stops a share (not a configuration error, which propagates) loses the
    worker: a new one re-runs the share, ``max_retries`` times, as a dead Ray worker's is. :meth:`shutdown`
    stops the running share before its next round and closes the envs. Other arguments as for
    :class:`RayCollector`.
    """

    def __init__(self, env_fns: Sequence[EnvFn], policy: Policy | None = None, *, policy_fn: PolicyFn | None = None,
                 weights: Any = None, episodes_per_batch: int, max_staleness: int, total_batches: int | None = None,
                 group_size: int = 1, seed: int = 0, pad_id: int = 0, give_task_to_policy: bool = True,
                 reset_options: dict | None = None, max_retries: int = 2) -> None:
        _validate(1, len(env_fns), episodes_per_batch, None, group_size, 1.0)
        if max_staleness < 1:
            raise ValueError(f"max_staleness: expected >= 1 (0: the synchronous TraceCollector), got {max_staleness}")
        if (policy is None) == (policy_fn is None) or (policy is not None and weights is not None):
            raise ValueError("ThreadCollector: expected either policy, or policy_fn (with weights to copy), "
                             f"got policy={policy!r}, policy_fn={policy_fn!r}, weights={type(weights).__name__}")
        super().__init__(num_workers=1, envs_per_worker=len(env_fns), episodes_per_batch=episodes_per_batch,
                         tokens_per_batch=None, total_batches=total_batches, group_size=group_size, seed=seed,
                         pad_id=pad_id, give_task_to_policy=give_task_to_policy, reset_options=reset_options,
                         max_staleness=max_staleness, max_retries=max_retries)
        self.env_fns = list(env_fns)
        self.sampler = _Serialized(policy) if policy is not None else None
        self.policy_fn: PolicyFn = policy_fn if policy_fn is not None else (lambda index: self.sampler)
        self._source, self._published = weights, None  # the learner's policy: cloned when a worker first needs it
        self._threads: list[concurrent.futures.ThreadPoolExecutor | None] = [None] * self.num_workers

    def update_policy_weights_(self, policy_or_weights: Any = None, **kwargs: Any) -> None:
        """Publish the learner's new weights (``version``, when given, numbers them; else +1): the sampler's hook
        syncs them now, or the worker's copy loads a clone before its next round (at once if it is idle)."""
        if self.sampler is not None:  # outside the driver's lock: the sync waits for the request in progress
            version = int(kwargs.get("version", self.policy_version + 1))
            self.sampler.update_weights(policy_or_weights, as_version=version, **kwargs)
            with self._cond:
                self._set_newest(version)
            return
        published = _cloned_state(policy_or_weights) if policy_or_weights is not None else None
        with self._cond:
            self._set_newest(int(kwargs.get("version", self.policy_version + 1)))
            self._source, self._published = None, published
            busy = {w for w, _, _ in self._inflight.values()}
            for w in busy:
                self._workers[w].offer_weights([self._published], self.policy_version)
                self._loaded[w] = self.policy_version

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._loaded = [-1] * self.num_workers  # the learner's restored weights, at the restored version
        if self.sampler is not None:
            self.sampler.version = self.policy_version

    def next(self) -> TensorDict | None:
        """The next batch (see :meth:`RayCollector._next_async`)."""
        return self._next_async()

    def shutdown(self) -> None:
        """Stop the running share before its next round (its episodes are dropped), close the envs. Idempotent."""
        self._stop_pump()
        for worker in self._workers:
            if worker is not None:
                worker.stopping = True
        for w, pool in enumerate(self._threads):
            if pool is not None:
                pool.shutdown(wait=True)
            self._drop_worker(w)
        self._inflight, self._ready, self._threads = {}, [], [None] * self.num_workers

    # -- the asynchronous loop's hooks (see _ShareDriver) -----------------------------------------------

    def _ensure_workers(self, indices: Sequence[int]) -> None:
        for w in indices:
            if self._workers[w] is None:
                self._workers[w] = RolloutWorker(self.env_fns, self.policy_fn, w, pad_id=self.pad_id,
                                                 give_task_to_policy=self.give_task_to_policy, threads=None,
                                                 lost_errors=(Exception,))
                self._loaded[w] = -1
            if self._loaded[w] != self.policy_version:  # idle: nothing else touches its policy now
                if self._published is None and self._source is not None:
                    self._published = _cloned_state(self._source)
                self._workers[w].set_weights([self._published], self.policy_version)
                self._loaded[w] = self.policy_version
            if self._threads[w] is None:
                self._threads[w] = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"compactrl-rollout{w}")

    def _call(self, w: int, plans: list[EpisodePlan]) -> concurrent.futures.Future:
        return self._threads[w].submit(self._workers[w].run, plans)

    def _wait_done(self, handles: list[concurrent.futures.Future], timeout: float
                   ) -> concurrent.futures.Future | None:
        done, _ = concurrent.futures.wait(handles, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)
        return next((f for f in handles if f in done), None)  # the earliest submitted among the finished

    def _result(self, done: concurrent.futures.Future) -> tuple[list, list[int]]:
        try:
            return done.result()
        except CONFIG_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - the worker is replaced and its share re-run
            raise _WorkerLost(f"rollout worker lost: {type(exc).__name__}") from exc

    def _drop_worker(self, w: int) -> None:
        worker, self._workers[w] = self._workers[w], None
        if worker is not None:
            try:
                worker.shutdown()
            except Exception as exc:  # noqa: BLE001 - a broken env has nothing left to close
                log.warning("closing the rollout thread's envs: %r", exc)

    def _worker_stats(self) -> dict[str, float]:
        return {"worker_restarts": float(self.restarts)}


class _Serialized:
    """A sampler whose ``act`` and ``update_weights`` never overlap (one socket to the engine, one thread at a
    time), and which knows the version each ``act`` was served by (``last_version``)."""

    def __init__(self, policy: Policy) -> None:
        self.policy, self.version, self.last_version = policy, 0, None
        self._lock = threading.Lock()
        self._turn = threading.Lock()  # held by a waiting sync: the next request waits for it (no starving)

    def act(self, requests):
        with self._turn:
            pass
        with self._lock:
            out = self.policy.act(requests)
            served = getattr(self.policy, "last_version", None)
            self.last_version = self.version if served is None else int(served)
        return out

    def update_weights(self, model: Any, *, as_version: int, **kwargs: Any) -> None:
        """Sync the sampler (its hook, with ``kwargs``) between two requests; its answers are ``as_version``'s."""
        hook = getattr(self.policy, "update_weights", None)
        with self._turn, self._lock:
            if callable(hook):
                hook(model, **kwargs)
            self.version = as_version

    def __getattr__(self, name: str) -> Any:  # sampling, tokenizer, ...: the sampler's
        return getattr(self.__dict__["policy"], name)


def _lost(episode_id: int, plan: EpisodePlan, exc: BaseException) -> EpisodeStats:
    return EpisodeStats(episode_id=episode_id, group_id=plan.group_id, task_seed=plan.task_seed, truncated=True,
                        sandbox_error=f"rollout worker lost: {type(exc).__name__}")


def _cloned_state(policy_or_weights: Any) -> dict[str, Any]:
    """A CPU copy of the weights that the learner's next in-place update leaves alone (``_state_of`` shares them
    on CPU)."""
    state = policy_or_weights if isinstance(policy_or_weights, dict) else policy_or_weights.state_dict()
    return {k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v for k, v in state.items()}


def _state_of(policy_or_weights: Any) -> dict[str, Any]:
    if isinstance(policy_or_weights, dict):
        return {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in policy_or_weights.items()}
    return {k: v.detach().cpu() for k, v in policy_or_weights.state_dict().items()}


def _validate(workers: int, envs: int, episodes: int | None, tokens: int | None, group: int, timeout: float) -> None:
    if workers < 1:
        raise ValueError(f"num_workers: expected >= 1, got {workers}")
    if envs < 1:
        raise ValueError(f"env_fns: expected at least one env constructor per worker, got {envs}")
    if group < 1:
        raise ValueError(f"group_size: expected >= 1, got {group}")
    if (episodes is None) == (tokens is None):
        raise ValueError(f"episodes_per_batch / tokens_per_batch: expected exactly one, got {episodes} / {tokens}")
    if episodes is not None and (episodes < 1 or episodes % group):
        raise ValueError(f"episodes_per_batch: expected a positive multiple of group_size={group}, got {episodes}")
    if tokens is not None and tokens < 1:
        raise ValueError(f"tokens_per_batch: expected >= 1, got {tokens}")
    if timeout <= 0:
        raise ValueError(f"start_timeout_s: expected > 0, got {timeout}")
