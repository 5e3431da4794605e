"""Shared inference engine actors: rollout workers send their generation requests to them.

With ``num_engines > 0`` a :class:`~compactrl.distributed.RayCollector` starts that many engine
actors (:class:`InferenceEngine`) and rollout worker ``w`` generates on engine ``w mod num_engines``
through an :class:`EngineClient`, a policy that forwards each round's requests (one batched
``act``) and returns the engine's responses, token ids and log-probs exact. An engine holds any
compactrl policy built by ``engine_fn(index)``: a ``TransformersPolicy`` (in process, or behind
``compactrl serve`` on the node's loopback: :func:`served_engine`), or a ``VLLMPolicy`` whose vLLM
engine runs in its own process and environment beside the actor, on CPUs or a GPU
(:func:`vllm_engine`). An engine gathers the calls that arrive while it generates and serves them
together in its next generation.

Weights: the driver puts each version's state dict in the object store once and hands the
reference to the workers; every request names the version it wants (with that reference), and an
engine that holds another version (a new update, or a fresh engine after a restart) fetches and
loads it before generating. A ``TransformersPolicy`` loads the state dict as it is; a ``VLLMPolicy``
streams it, bucketed, to its engine process under per-expert checkpoint names, tagged with the
version, where vLLM's ``reload_weights`` loads it; then the engine and the state dict (rebuilt as a
Hugging Face model from the served config) score the probe batch, and a disagreement beyond the
bound fails the call with a ``SyncCheckError`` naming the version
(:meth:`~compactrl.serving.vllm.policy.VLLMPolicy.update_weights`).
Every answer carries the version the engine sampled with; the batch records, per episode, the
oldest version any of its responses came from.

Faults: an engine that dies mid-batch fails the calls it was serving; the workers end those
requests' episodes as truncated (their finished traces are kept; the episodes are not re-run, so
nothing can be counted twice), and Ray restarts the engine (``max_restarts``) with its constructor
arguments; it loads the current weights at its first request. Every wait is bounded: a request
that gets no answer within ``timeout_s`` (generation plus a restart), an engine that does not come
back within it, or one lost more than ``max_losses`` times in a row, stops the run with a
``RuntimeError`` naming the engine. After a loss a worker waits for the restart before its next
request (calls to a restarting actor fail at once), so only the episodes in flight are lost.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from compactrl.types import Policy, PolicyRequest

log = logging.getLogger(__name__)

EngineFn = Callable[[int], Policy]


class EngineLost(RuntimeError):
    """The engine serving a request died before answering; the request's episodes end truncated."""


class _Call:
    """One worker's request batch waiting in an engine, and its answer once generated."""

    def __init__(self, requests: list[PolicyRequest], weights: list, version: int) -> None:
        self.requests, self.weights, self.version = requests, weights, version
        self.responses: list[str] | None = None
        self.error: BaseException | None = None


class InferenceEngine:
    """The body of an engine actor (wrapped by ``ray.remote`` in :class:`~compactrl.distributed.RayCollector`).

    Run as a threaded actor (``max_concurrency`` > 1), it gathers the calls of several workers:
    while one generation runs, the calls that arrive wait, and the next generation serves all of
    them at once (one batched ``act`` per policy version), so an engine shared by many workers
    generates in batches as large as the workers waiting on it.
    """

    def __init__(self, engine_fn: EngineFn, index: int, *, threads: int) -> None:
        torch.set_num_threads(threads)
        self.policy = engine_fn(index)
        self.index = index
        self.version = -1  # a fresh (or restarted) engine holds no published version yet
        self.loads, self.load_s = 0, 0.0
        self.generations, self.calls = 0, 0
        self._cond = threading.Condition()
        self._waiting: list[_Call] = []
        self._generating = False

    def ready(self) -> int:
        return os.getpid()

    def stats(self) -> dict[str, float]:
        """Weight versions loaded and seconds spent fetching and loading them; calls served and the
        generations that served them (fewer generations than calls: calls were gathered)."""
        return {"loads": float(self.loads), "load_s": self.load_s, "calls": float(self.calls),
                "generations": float(self.generations)}

    def act(self, requests: Sequence[PolicyRequest], weights: list, version: int) -> tuple[int, int, list[str]]:
        """(version sampled with, engine pid, responses); loads ``weights[0]`` first when ``version`` is new here.

        ``weights`` is a one-element list so that Ray passes the object reference through unresolved:
        only an engine that needs the version fetches it.
        """
        call = _Call(list(requests), weights, version)
        with self._cond:
            self._waiting.append(call)
            self._cond.notify_all()  # the queue changed (wakes whoever watches it; waiting callers re-check)
            while call.responses is None and call.error is None and self._generating:
                self._cond.wait()
            if call.responses is None and call.error is None:  # nobody generating: serve every waiting call
                self._generating = True
                gathered, self._waiting = self._waiting, []
            else:
                gathered = []
        if gathered:
            try:
                self._serve(gathered)
            finally:
                with self._cond:
                    self._generating = False
                    self._cond.notify_all()
        if call.error is not None:
            raise call.error
        return call.version, os.getpid(), call.responses  # type: ignore[return-value]

    def _serve(self, calls: list[_Call]) -> None:
        """One batched generation per policy version among ``calls`` (a synchronous batch has one)."""
        for version in dict.fromkeys(c.version for c in calls):
            group = [c for c in calls if c.version == version]
            try:
                if version != self.version:
                    self._load(group[0].weights[0], version)
                responses = self.policy.act([r for c in group for r in c.requests])
            except Exception as exc:  # noqa: BLE001 - every gathered call gets the error
                for c in group:
                    c.error = exc
                continue
            self.generations, self.calls = self.generations + 1, self.calls + len(group)
            for c in group:
                c.responses, responses = list(responses[:len(c.requests)]), responses[len(c.requests):]

    def _load(self, ref: Any, version: int) -> None:
        import ray

        if ref is not None:
            t0 = time.perf_counter()
            load_published(self.policy, ray.get(ref), version)
            self.loads, self.load_s = self.loads + 1, self.load_s + time.perf_counter() - t0
        self.version = version


def load_published(policy: Any, state: Mapping[str, torch.Tensor], version: int | None = None) -> None:
    """Load a published state dict (Hugging Face names, fused experts) into an engine's policy.

    A ``VLLMPolicy`` gets it as a Hugging Face model rebuilt from the served model's config (what
    its sync sends and what its probe check scores against), as weight version ``version``.
    """
    from compactrl.serving.vllm.policy import VLLMPolicy  # the learner side only: no vllm import here

    if isinstance(policy, VLLMPolicy):
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(policy.engine_config.model, local_files_only=True)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, experts_implementation="grouped_mm")
        model.load_state_dict(dict(state))
        policy.update_weights(model.eval(), **({} if version is None else {"version": version}))
    else:
        policy.load_state_dict(state)


class EngineClient:
    """A rollout worker's policy in engine mode: each ``act`` is one request to its engine actor.

    ``last_version`` is the version the engine reported for the latest answer (None before the
    first); ``engine_pids`` the processes that answered (a restart shows as a new pid).
    """

    def __init__(self, engine: Any, index: int, *, timeout_s: float, max_losses: int) -> None:
        self.engine, self.index = engine, index
        self.timeout_s, self.max_losses = timeout_s, max_losses
        self.weights: list = [None]
        self.version = 0
        self.last_version: int | None = None
        self.engine_pids: set[int] = set()
        self._lost_in_a_row = 0

    def follow(self, weights: list, version: int) -> None:
        """Ask for ``version`` (fetched by the engine from ``weights[0]`` when it lacks it) from now on."""
        self.weights, self.version = weights, version

    def act(self, requests: Sequence[PolicyRequest]) -> list[str]:
        import ray

        if self._lost_in_a_row:
            self._await_restart()
        call = self.engine.act.remote(list(requests), self.weights, self.version)
        try:
            version, pid, responses = ray.get(call, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(call)
            raise RuntimeError(f"engine actor {self.index} did not answer {len(requests)} requests within "
                               f"timeout_s={self.timeout_s}s") from None
        except ray.exceptions.RayActorError as exc:
            self._lost_in_a_row += 1
            if self._lost_in_a_row > self.max_losses:
                raise RuntimeError(f"engine actor {self.index} was lost {self._lost_in_a_row} times in a row "
                                   f"without answering (restarts exhausted?): {exc}") from None
            log.warning("engine actor %d lost with %d requests in flight: %s", self.index, len(requests),
                        type(exc).__name__)
            raise EngineLost(f"engine actor {self.index} lost: {type(exc).__name__}") from None
        self._lost_in_a_row = 0
        self.last_version = version
        self.engine_pids.add(pid)
        return responses

    def _await_restart(self) -> None:
        """After a loss, wait (at most ``timeout_s``) for Ray to bring the engine back.

        Calls to an engine that is restarting fail at once (``ActorUnavailableError``) rather than
        queue, so without this wait every episode started meanwhile would be lost too. Ray offers no
        call that blocks until an actor is alive again: poll its ``ready`` with a growing pause.
        """
        import ray

        deadline, pause = time.monotonic() + self.timeout_s, 0.05
        while True:
            try:
                ray.get(self.engine.ready.remote(), timeout=max(deadline - time.monotonic(), 0.01))
                return
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(pause)
                pause = min(2 * pause, 1.0)
            except ray.exceptions.GetTimeoutError:
                break
            except ray.exceptions.RayActorError as exc:  # died for good: no restarts left
                raise RuntimeError(f"engine actor {self.index} is dead and will not be restarted: {exc}") from None
        raise RuntimeError(f"engine actor {self.index} did not come back within timeout_s={self.timeout_s}s")


def engine_client(engines: Sequence[Any], timeout_s: float, max_losses: int, worker_index: int) -> EngineClient:
    """Worker ``worker_index``'s client of engine ``worker_index mod len(engines)`` (a ``policy_fn``)."""
    e = worker_index % len(engines)
    return EngineClient(engines[e], e, timeout_s=timeout_s, max_losses=max_losses)


class ServedEngine:
    """An engine's policy served by ``compactrl serve`` on the loopback interface of the engine's node.

    The engine generates through the OpenAI-compatible ``/v1/completions`` endpoint (token-id prompts
    in, token ids and log-probs out), as any client of that server would; published weights load
    into the served model in place (the engine loads only between its generations). Built by
    :func:`served_engine`.
    """

    def __init__(self, policy: Any) -> None:
        from compactrl.policies.openai_client import OpenAICompletionsPolicy
        from compactrl.serving.server import ServeConfig, make_server

        self.policy = policy
        self.server = make_server(policy, ServeConfig(host="127.0.0.1", port=0, model_name="engine")).start()
        s = policy.sampling
        self.client = OpenAICompletionsPolicy(
            self.server.url, "engine", tokenizer=policy.tokenizer, temperature=s.temperature, top_p=s.top_p,
            top_k=s.top_k, max_new_tokens=policy.max_new_tokens, context_length=policy.context_length,
            stop_token_ids=policy.stop_token_ids)

    def act(self, requests: Sequence[PolicyRequest]) -> list[str]:
        return self.client.act(requests)

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.policy.load_state_dict(state)


def served_engine(policy_fn: EngineFn, index: int) -> ServedEngine:
    """An ``engine_fn``: ``policy_fn(index)`` (a ``TransformersPolicy``) behind ``compactrl serve`` on loopback.

    Use it as ``RayCollector(..., engine_fn=functools.partial(served_engine, policy_fn))``.
    """
    return ServedEngine(policy_fn(index))


def vllm_engine(model_dir: str, index: int, *, engine_kwargs: Mapping[str, Any] | None = None,
                tokenizer: Any = None, **policy_kwargs: Any) -> Policy:
    """An ``engine_fn``: a :class:`~compactrl.serving.vllm.policy.VLLMPolicy` whose vLLM engine process
    (``.venv-vllm``, built by ``bash scripts/setup.sh --vllm`` on every node) serves the Hugging Face
    model in ``model_dir`` (present on every node), seeded per engine.

    Use it as ``RayCollector(..., engine_fn=functools.partial(vllm_engine, model_dir))`` (with
    ``engine_num_gpus=1`` on GPU nodes). Without the engine environment it raises
    ``FileNotFoundError`` saying how to build it. Ray's restart of a dead actor starts a new engine
    process. Tensor parallelism inside one engine is vLLM's own and is not wired: one device per engine.
    """
    from compactrl.serving.vllm.client import VLLMEngineConfig, engine_env_missing
    from compactrl.serving.vllm.policy import VLLMPolicy

    missing = engine_env_missing((engine_kwargs or {}).get("python") or None)
    if missing:  # the clear error, before any tokenizer or engine is built
        raise FileNotFoundError(missing)
    if tokenizer is None:
        from compactrl.tokenizer import shared_tokenizer

        tokenizer = shared_tokenizer()
    kw = {"seed": index, **dict(engine_kwargs or {})}
    return VLLMPolicy(VLLMEngineConfig(model=model_dir, **kw), tokenizer,
                      seed=policy_kwargs.pop("seed", 1000 * (index + 1)), **policy_kwargs)
