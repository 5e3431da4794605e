"""What generates behind the gateway: an in-process policy or an upstream completions server.

Both take :class:`~compactrl.serving.completions.Job` lists and return one future of
:class:`~compactrl.policies.sampling.Generated` per job, so the routes do not know which
one they talk to.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import torch

from compactrl.gateway.constrain import TokenMasks, ToolCallGrammar, ToolChoice, constrained_generate
from compactrl.policies.openai_client import OpenAICompletionsPolicy
from compactrl.policies.sampling import Generated
from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.serving.batching import CompletionEngine, PolicyEngine
from compactrl.serving.completions import Job, RequestError


class Engine(Protocol):
    """What the gateway generates with. An engine that can mask logits also has
    ``submit_constrained(jobs, choice)`` (:class:`LocalEngine`); the gateway constrains the others'
    answers to a ``tool_choice`` by rejection (``app.py``)."""

    tokenizer: object
    context_length: int
    stop_ids: tuple[int, ...]

    def submit(self, jobs: list[Job]) -> list[Future]: ...

    def close(self) -> None: ...


@dataclass
class LocalEngine:
    """A :class:`TransformersPolicy` in this process, behind ``compactrl serve``'s batching engine."""

    policy: TransformersPolicy
    max_batch_size: int = 32
    batch_wait_ms: float = 5.0
    threads: int | None = None

    def __post_init__(self) -> None:
        self.engine = CompletionEngine(self.policy, max_batch_size=self.max_batch_size,
                                       batch_wait_ms=self.batch_wait_ms, threads=self.threads)
        self.tokenizer = self.policy.tokenizer
        self.context_length = self.policy.context_length
        self.stop_ids = tuple(self.policy.stop_token_ids)
        # constrained calls run token by token on a thread of their own, beside the batching engine
        self._constrained = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compactrl-constrained",
                                               initializer=self._set_threads)
        seed = int(torch.randint(2**62, (1,), generator=self.policy.generator))
        self._generator = torch.Generator(device=self.policy.generator.device).manual_seed(seed)
        self._masks: OrderedDict[tuple, TokenMasks] = OrderedDict()

    def _set_threads(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)

    def submit(self, jobs: list[Job]) -> list[Future]:
        return self.engine.submit(jobs)

    def submit_constrained(self, jobs: list[Job], choice: ToolChoice) -> list[Future]:
        """Jobs whose answers must be tool calls as ``choice`` says (logits masked; see ``constrain.py``)."""
        return [self._constrained.submit(self._one_constrained, j, choice) for j in jobs]

    def masks(self, choice: ToolChoice) -> TokenMasks:
        """The token masks of ``choice``'s grammar (the few most recent tool sets kept)."""
        key = (choice.names, choice.multiple, json.dumps(choice.parameters, sort_keys=True, default=str))
        masks = self._masks.get(key)
        if masks is None:
            masks = self._masks[key] = TokenMasks(ToolCallGrammar(choice), self.tokenizer, self.stop_ids,
                                                  getattr(self.tokenizer, "all_special_ids", ()))
            while len(self._masks) > 8:
                self._masks.popitem(last=False)
        self._masks.move_to_end(key)
        return masks

    def _one_constrained(self, job: Job, choice: ToolChoice):
        generator = self._generator
        if job.seed is not None:
            generator = torch.Generator(device=generator.device).manual_seed(job.seed)
        return constrained_generate(self.policy.model, job.prompt, job.max_tokens, masks=self.masks(choice),
                                    sampling=job.sampling, report=job.report, stop_ids=job.stop_ids,
                                    generator=generator, top_logprobs=job.top_logprobs)

    def close(self) -> None:
        self._constrained.shutdown(wait=True, cancel_futures=True)
        self.engine.close()


class UpstreamEngine:
    """An OpenAI-compatible ``/v1/completions`` server (``compactrl serve``, vLLM) reached by URL.

    Prompts go out as token ids with ``return_token_ids``; top-k log-probs are not forwarded (only
    the sampled tokens' log-probs come back).
    """

    def __init__(self, url: str, model: str, tokenizer, *, context_length: int, max_concurrency: int = 64,
                 timeout: float = 600.0) -> None:
        self.client = OpenAICompletionsPolicy(url, model, tokenizer=tokenizer, context_length=context_length,
                                              max_concurrency=1, timeout=timeout)
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.stop_ids = tuple(self.client.stop_token_ids)
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="compactrl-upstream")

    def submit(self, jobs: list[Job]) -> list[Future]:
        if any(j.top_logprobs for j in jobs):
            raise RequestError("top log-probs are not forwarded to an upstream engine", param="top_logprobs")
        return [self._pool.submit(self._one, j) for j in jobs]

    def _one(self, job: Job) -> Generated:
        return self.client.complete(job.prompt, job.max_tokens, sampling=job.sampling, stop_token_ids=job.stop_ids,
                                    seed=job.seed)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def policy_engine(policy, *, threads: int | None = None, max_batch_size: int = 32,
                  batch_wait_ms: float = 5.0) -> Engine:
    """The gateway engine for ``policy``: in process for a :class:`TransformersPolicy`, or through the
    policy's own ``generate`` when it runs elsewhere (the vLLM engine process)."""
    if isinstance(policy, TransformersPolicy):
        return LocalEngine(policy, max_batch_size=max_batch_size, batch_wait_ms=batch_wait_ms, threads=threads)
    return PolicyEngine(policy, max_batch_size=max_batch_size, batch_wait_ms=batch_wait_ms)
