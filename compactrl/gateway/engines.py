"""What generates behind the gateway: an in-process policy or an upstream completions server.

Both take :class:`~compactrl.policies.serve.Job` lists and return one future of
:class:`~compactrl.policies.transformers_policy.Generated` per job, so the routes do not know which
one they talk to.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from compactrl.policies.openai_client import OpenAICompletionsPolicy
from compactrl.policies.serve import CompletionEngine, Job, PolicyEngine, RequestError
from compactrl.policies.transformers_policy import Generated, TransformersPolicy


class Engine(Protocol):
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

    def submit(self, jobs: list[Job]) -> list[Future]:
        return self.engine.submit(jobs)

    def close(self) -> None:
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
