"""A black-box rollout source: mini-swe-agent episodes through an in-process gateway, as trace batches.

:class:`AgentCollector` has the trace collector's surface (``next``, ``update_policy_weights_``,
``state_dict``/``load_state_dict``, ``shutdown``, ``last_batch_stats``, ``last_episode_stats``), so
the trainer's loop reads it as it reads :class:`~compactrl.collectors.trace_collector.TraceCollector`.
Each :meth:`AgentCollector.next`:

1. draws ``episodes_per_batch`` tasks from the env's own task source: the task that
   ``env.reset(seed=s)`` would give for the same task seed (``group_size`` episodes per seed, GRPO);
2. runs mini-swe-agent on each (:func:`~compactrl.gateway.mini_swe.run_episode`) in a fresh sandbox
   of the env's backend, ``concurrency`` at a time, through a gateway in front of the policy being
   trained (the module itself, so its weights are always the trainer's current ones);
3. ends each session with the task's check run on the agent's sandbox, reads the finished sessions
   back and stacks them as one trace batch with the tree keys (:func:`session_batch`); the update
   step's advantage call then runs GAE over the trace trees
   (:func:`~compactrl.algos.tree_gae.tree_gae`).

Collection is on-policy: the weights change only between two ``next()`` calls, and
``update_policy_weights_`` moves :attr:`Gateway.policy_version` on, so every call of a batch records
the version that sampled it. An episode whose sandbox or agent fails is logged and left out of the
batch (``sandbox_error`` in its statistics); a batch in which every episode failed raises.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium.utils import seeding
from tensordict import TensorDict

from compactrl.collectors.episodes import EpisodeStats, summarize_episodes
from compactrl.gateway.app import Gateway, GatewayConfig
from compactrl.gateway.engines import policy_engine
from compactrl.gateway.mini_swe import EpisodeResult, run_episode
from compactrl.gateway.recording import Session, load_session
from compactrl.gateway.traces import build_tree, sessions_to_batch
from compactrl.sandbox import make_sandbox
from compactrl.serving.server import ServeConfig
from compactrl.task import prepared

log = logging.getLogger(__name__)

MODEL_NAME = "policy"
"""The model name the gateway serves the trained policy under."""


@dataclass(frozen=True)
class AgentEpisodeConfig:
    """How each mini-swe-agent episode runs (the keyword arguments of ``run_episode``)."""

    context_tokens: int
    """The agent compacts when its messages exceed this many tokens (counted with the gateway's chat format)."""
    step_limit: int
    """Model calls per episode (summaries included)."""
    max_tokens: int
    """Longest response per call."""
    temperature: float = 1.0
    """Sampling temperature the agent requests (the policy's, so recorded log-probs are its own)."""
    config_name: str = "default.yaml"
    """mini-swe-agent's packaged config: ``default.yaml`` (text actions) or ``mini.yaml`` (tool calls)."""
    action_regex: str | None = None
    """``default.yaml``: its text model's ``action_regex`` (None keeps mini-swe-agent's own)."""
    command_timeout_s: float = 30.0
    """Seconds each of the agent's commands may run."""


def session_batch(sessions: Sequence[Session], *, pad_id: int = 0, group_ids: Sequence[int] | None = None,
                  episode_ids: Sequence[int] | None = None) -> TensorDict:
    """Finished sessions as one trace batch (white-box keys plus the tree keys, see ``sessions_to_batch``).

    ``episode_ids`` renames the batch's episodes (default: their positions in ``sessions``).
    Advantages come from the update step (:meth:`compactrl.training.update.Updater.advantages`).
    """
    unfinished = [s.name for s in sessions if not s.finished]
    if unfinished:
        raise ValueError(f"sessions: expected finished sessions (with a reward), got unfinished {unfinished}")
    batch = sessions_to_batch(sessions, pad_id=pad_id, group_ids=group_ids)
    if episode_ids is not None:
        batch.set("episode_id", torch.as_tensor(list(episode_ids), dtype=torch.long)[batch["episode_id"]])
    return batch


class AgentCollector:
    """mini-swe-agent episodes on an env's tasks, through a gateway in front of ``policy``.

    Args:
        policy: the :class:`~compactrl.policies.transformers_policy.TransformersPolicy` being trained.
        env_fn: builds the (wrapped) env whose task source and sandbox backend the episodes use; its
            own loop is never stepped.
        episode: how each agent episode runs.
        episodes_per_batch: episodes per :meth:`next` (a multiple of ``group_size``).
        group_size: episodes per task seed (GRPO groups).
        concurrency: episodes running at once (their calls batch in the gateway's engine).
        seed: seeds the task-seed stream.
        pad_id: padding token id of the trace batch.
        record_dir: where the gateway writes the session files (default: a temporary directory).
        threads: intra-op threads of the gateway's generation thread.
    """

    def __init__(self, policy, env_fn: Callable[[], Any], episode: AgentEpisodeConfig, *, episodes_per_batch: int,
                 group_size: int = 1, concurrency: int = 4, seed: int = 0, pad_id: int = 0,
                 record_dir: str | None = None, threads: int | None = None) -> None:
        if episodes_per_batch < 1 or group_size < 1 or episodes_per_batch % group_size:
            raise ValueError(f"episodes_per_batch: expected a positive multiple of group_size ({group_size}), "
                             f"got {episodes_per_batch}")
        if concurrency < 1:
            raise ValueError(f"concurrency: expected >= 1, got {concurrency}")
        self.env = env_fn()
        inner = self.env.unwrapped
        self.task_source, self.backend, self.sandbox_kwargs = inner.task_source, inner.backend, inner.sandbox_kwargs
        self.episode, self.episodes_per_batch, self.group_size = episode, episodes_per_batch, group_size
        self.concurrency, self.pad_id, self.policy = concurrency, pad_id, policy
        config = GatewayConfig(serve=ServeConfig(port=0, model_name=MODEL_NAME), record_dir=record_dir, max_n=1,
                               default_max_tokens=episode.max_tokens)
        self.gateway = Gateway(policy_engine(policy, threads=threads), config).start()
        self._closed = False
        self.load_state_dict({"seed": seed, "rng": np.random.default_rng(seed).bit_generator.state,
                              "next_episode_id": 0, "next_group_id": 0, "batches": 0, "policy_version": 0})
        self.last_episode_stats: list[EpisodeStats] = []
        """Per-episode statistics of the most recent batch, failed episodes included."""
        self.last_batch_stats: dict[str, float] = {}
        """Aggregates of the most recent batch (:func:`summarize_episodes`)."""

    # -- the collector's surface ----------------------------------------------------------------

    def next(self) -> TensorDict:
        """Run one batch of agent episodes; their finished sessions as a trace batch."""
        plan = []
        for _ in range(self.episodes_per_batch // self.group_size):
            task_seed = int(self._rng.integers(0, 2**31 - 1))
            for _ in range(self.group_size):
                plan.append((self._next_episode_id, self._next_group_id, task_seed))
                self._next_episode_id += 1
            self._next_group_id += 1
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="compactrl-agent") as pool:
            done = list(pool.map(lambda p: self._run(*p), plan))
        self._batches += 1
        self.last_episode_stats = [stats for stats, _ in done]
        self.last_batch_stats = summarize_episodes(self.last_episode_stats)
        kept = [(stats, session) for stats, session in done if session is not None]
        if not kept:
            raise RuntimeError(f"every episode of the batch failed; the first: {done[0][0].sandbox_error}")
        return session_batch([s for _, s in kept], pad_id=self.pad_id, group_ids=[st.group_id for st, _ in kept],
                             episode_ids=[st.episode_id for st, _ in kept])

    def update_policy_weights_(self, policy_or_weights: Any = None, **kwargs: Any) -> None:
        """The gateway serves the trained module itself: only the recorded policy version moves on. A
        policy that generates elsewhere (the vLLM engine) gets the weights first (``update_weights``)."""
        hook = getattr(self.policy, "update_weights", None)
        if callable(hook):
            hook(policy_or_weights, **kwargs)
        self.gateway.policy_version += 1

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self._seed, "rng": self._rng.bit_generator.state, "next_episode_id": self._next_episode_id,
                "next_group_id": self._next_group_id, "batches": self._batches,
                "policy_version": self.gateway.policy_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._seed = int(state["seed"])
        self._rng = np.random.default_rng(self._seed)
        self._rng.bit_generator.state = state["rng"]
        self._next_episode_id, self._next_group_id = int(state["next_episode_id"]), int(state["next_group_id"])
        self._batches = int(state["batches"])
        self.gateway.policy_version = int(state["policy_version"])

    def shutdown(self) -> None:
        """Stop the gateway and close the env. Idempotent."""
        if not self._closed:
            self._closed = True
            self.gateway.stop()
            self.env.close()

    # -- one episode ------------------------------------------------------------------------------

    def _run(self, episode_id: int, group_id: int, task_seed: int) -> tuple[EpisodeStats, Session | None]:
        task = self.task_source.sample(seeding.np_random(task_seed)[0])  # the task env.reset(seed=...) gives
        stats = EpisodeStats(episode_id, group_id, task_seed, task_id=task.id)
        name = f"episode-{episode_id}"
        for path in (self.gateway.recorder.path(name), self.gateway.recorder.part_path(name)):
            path.unlink(missing_ok=True)  # left by a batch that a killed run never trained on
        t0 = time.perf_counter()
        sandbox = make_sandbox(self.backend, **self.sandbox_kwargs)
        try:
            task = prepared(task, self.backend)
            sandbox.start(task)
            result = run_episode(self.gateway.url, MODEL_NAME, name, task, sandbox, self.gateway.fmt,
                                 **dataclasses.asdict(self.episode))
        except Exception as exc:  # noqa: BLE001 - a failed episode is left out, the batch goes on
            log.warning("agent episode %s (task %s) failed: %s: %s", name, task.id, type(exc).__name__, exc)
            stats.sandbox_error, stats.truncated = f"{type(exc).__name__}: {exc}", True
            stats.wall_clock_s = time.perf_counter() - t0
            return stats, None
        finally:
            sandbox.close()
        session = load_session(self.gateway.recorder.path(name))
        _fill_stats(stats, result, session, time.perf_counter() - t0)
        return stats, session


def _fill_stats(stats: EpisodeStats, result: EpisodeResult, session: Session, wall_s: float) -> None:
    nodes = build_tree(session)
    stats.num_traces, stats.compactions, stats.steps = len(nodes), result.compactions, result.calls
    stats.generated_tokens = sum(sum(n.policy_mask) for n in nodes)
    stats.trace_tokens = sum(len(n.token_ids) for n in nodes)
    stats.reward, stats.success = result.reward, result.reward > 0
    stats.terminated = result.exit_status == "Submitted"
    stats.truncated = not stats.terminated
    stats.other_gen_time_s = sum(c.generate_s for c in session.calls)  # summaries are not told apart
    stats.wall_clock_s = wall_s
    stats.env_time_s = max(wall_s - stats.other_gen_time_s, 0.0)
    stats.info = {"exit_status": result.exit_status, "agents": float(len({n.agent for n in nodes}))}


__all__ = ["AgentCollector", "AgentEpisodeConfig", "MODEL_NAME", "session_batch"]
