"""The batching engines behind ``/v1/completions``: one thread that gathers concurrent :class:`Job` s
and generates each group with equal sampling settings as one call.

:class:`CompletionEngine` runs a :class:`~compactrl.policies.transformers_policy.TransformersPolicy`
in this process (one KV-cached batch per group); :class:`PolicyEngine` hands each group to a policy
that generates elsewhere (the vLLM engine process). Both are :class:`JobEngine` s: ``submit(jobs)``
returns one future per job, resolved to a :class:`~compactrl.policies.sampling.Generated` (or to the
generation's exception, which the server answers as a 500); ``close()`` stops the thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import torch

from compactrl.policies.sampling import Generated, SamplingConfig
from compactrl.policies.transformers_policy import TransformersPolicy, generate_tokens
from compactrl.serving.completions import Job, RequestError

logger = logging.getLogger(__name__)


class JobEngine(Protocol):
    """What the completion routes generate with."""

    def submit(self, jobs: list[Job]) -> list[Future]:
        """One future per job (a :class:`~compactrl.policies.sampling.Generated`); a
        :class:`~compactrl.serving.completions.RequestError` when the jobs are refused."""

    def close(self) -> None:
        """Stop generating; jobs submitted afterwards are refused with a 503."""


class GeneratingPolicy(Protocol):
    """A policy that generates elsewhere, as :class:`PolicyEngine` drives it (a
    :class:`~compactrl.serving.vllm.policy.VLLMPolicy`)."""

    tokenizer: Any
    context_length: int
    stop_token_ids: Sequence[int]

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int], *,
                 sampling: SamplingConfig, stop_token_ids: Sequence[int],
                 seeds: Sequence[int | None]) -> list[Generated]: ...

    def close(self) -> None: ...


def gather(jobs: queue.Queue[Job], max_batch_size: int, wait_s: float) -> list[Job]:
    """The next batch: the first job to arrive within 0.1 s (none: ``[]``), then those that arrive
    within ``wait_s`` of it, at most ``max_batch_size`` in all, in arrival order."""
    try:
        batch = [jobs.get(timeout=0.1)]
    except queue.Empty:
        return []
    deadline = time.monotonic() + wait_s
    while len(batch) < max_batch_size:
        try:
            batch.append(jobs.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            break
    return batch


class CompletionEngine:
    """One thread that gathers concurrent jobs and generates each compatible group as one batch."""

    def __init__(self, policy: TransformersPolicy, *, max_batch_size: int = 32, batch_wait_ms: float = 5.0,
                 threads: int | None = None):
        self.policy = policy
        self.threads = threads
        """Intra-op threads of the engine thread (None: torch's default for a new thread). With OpenMP
        the setting is per thread, so the caller's ``torch.set_num_threads`` does not reach it."""
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self._queue: queue.Queue[Job] = queue.Queue()
        self._closed = threading.Event()
        self.batches = 0
        """Generation batches run so far (with ``jobs``, shows how well requests are batched)."""
        self.jobs = 0
        self._thread = threading.Thread(target=self._loop, name="compactrl-serve-engine", daemon=True)
        self._thread.start()

    def submit(self, jobs: list[Job]) -> list[Future]:
        if self._closed.is_set():
            raise RequestError("the server is shutting down", status=503)
        for j in jobs:
            self._queue.put(j)
        return [j.future for j in jobs]

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        while not self._closed.is_set():
            jobs = gather(self._queue, self.max_batch_size, self.batch_wait_s)
            groups: dict[tuple, list[Job]] = {}
            for j in jobs:
                groups.setdefault(j.key, []).append(j)
            for group in groups.values():
                self._run(group)

    def _run(self, group: list[Job]) -> None:
        first = group[0]
        generator = self.policy.generator
        if first.seed is not None:
            generator = torch.Generator(device=generator.device).manual_seed(first.seed)
        try:
            gens = generate_tokens(
                self.policy.model, [j.prompt for j in group], [j.max_tokens for j in group],
                sampling=first.sampling, stop_ids=first.stop_ids, pad_id=self.policy.pad_token_id,
                generator=generator, top_logprobs=first.top_logprobs, report=first.report,
            )
        except Exception as exc:  # surfaced to every waiting request as a 500
            logger.exception("generation failed")
            for j in group:
                j.future.set_exception(exc)
            return
        self.batches += 1
        self.jobs += len(group)
        for j, g in zip(group, gens):
            j.future.set_result(g)


class PolicyEngine:
    """A policy with ``generate(prompts, budgets, sampling=, stop_token_ids=, seeds=)`` that runs elsewhere
    (a :class:`~compactrl.serving.vllm.policy.VLLMPolicy`: the vLLM engine process), behind one thread.

    Jobs that arrive while a generation runs are gathered; each group with equal sampling settings
    goes to the engine as one call (vLLM schedules the group's prompts together). Log-probs are
    those of the distribution sampled (``processed_logprobs``); top log-probs are refused.
    """

    def __init__(self, policy: GeneratingPolicy, *, max_batch_size: int = 64, batch_wait_ms: float = 5.0,
                 owns_policy: bool = False) -> None:
        self.policy, self.owns_policy = policy, owns_policy
        self.tokenizer = policy.tokenizer
        self.context_length = policy.context_length
        self.stop_ids = tuple(policy.stop_token_ids)
        self.max_batch_size, self.batch_wait_s = max_batch_size, batch_wait_ms / 1000.0
        self._queue: queue.Queue[Job] = queue.Queue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="compactrl-policy-engine", daemon=True)
        self._thread.start()

    def submit(self, jobs: list[Job]) -> list[Future]:
        if self._closed.is_set():
            raise RequestError("the server is shutting down", status=503)
        if any(j.top_logprobs for j in jobs):
            raise RequestError("top log-probs are not returned by this engine", param="top_logprobs")
        if any(j.report != j.sampling for j in jobs):
            raise RequestError("this engine reports the log-probs of the distribution sampled (processed_logprobs)",
                               param="logprobs_mode")
        for j in jobs:
            self._queue.put(j)
        return [j.future for j in jobs]

    def _loop(self) -> None:
        while not self._closed.is_set():
            jobs = gather(self._queue, self.max_batch_size, self.batch_wait_s)
            groups: dict[tuple, list[Job]] = {}
            for j in jobs:
                groups.setdefault((j.sampling, j.stop_ids), []).append(j)
            for (sampling, stop_ids), group in groups.items():
                try:
                    gens = self.policy.generate([j.prompt for j in group], [j.max_tokens for j in group],
                                                sampling=sampling, stop_token_ids=list(stop_ids),
                                                seeds=[j.seed for j in group])
                except Exception as exc:  # noqa: BLE001 - every waiting request gets it (a 500)
                    for j in group:
                        j.future.set_exception(exc)
                    continue
                for j, g in zip(group, gens):
                    j.future.set_result(g)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=30)
        if self.owns_policy:  # e.g. the vLLM engine process that the gateway command started
            self.policy.close()
