"""A policy backed by an in-process vLLM engine (``pip install 'compactrl[vllm]'``, CUDA machine).

Token-in/token-out: prompts go in as ``TokensPrompt`` (the exact ids the context-budget wrapper
keeps), responses come back as ``TokenResponse`` with the sampled ids and their log-probs
(``SamplingParams(logprobs=0)``, ``logprobs_mode="processed_logprobs"`` by default, i.e. the
log-probs of the temperature-scaled, top-k/top-p-truncated distribution actually sampled, the same
rule as :class:`~compactrl.policies.TransformersPolicy`).

Weight sync after each update: :meth:`VLLMPolicy.sync_weights` streams the trainer's weights under
their per-expert checkpoint names (fused ``gate_up_proj`` / ``down_proj`` split per expert, see
:mod:`compactrl.policies.moe_weights`) to every vLLM worker through ``LLM.collective_rpc`` and a
worker extension (``LLM(worker_extension_cls=...)``) that calls the model's own ``load_weights``,
then resets the prefix cache so no KV computed with old weights is reused.

vllm is imported only when an engine is built. The pure parts (engine arguments, sampling
arguments, prompt building, output parsing, name mapping) are unit-tested on CPU; the engine itself
was not run here (no GPU, no vLLM). See docs/policies.md.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from compactrl.policies.moe_weights import buckets, checkpoint_weights
from compactrl.policies.transformers_policy import (
    Generated,
    SamplingConfig,
    budgets,
    default_stop_ids,
    prompt_ids_for,
    to_token_response,
)
from compactrl.types import PolicyRequest

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "compactrl.policies.vllm_policy.WeightSyncWorkerExtension"
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")


def import_vllm():
    """Import vllm or explain how to get it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "VLLMPolicy needs vLLM, which is not installed: `pip install 'compactrl[vllm]'` on a machine "
            "with a CUDA GPU (or use TransformersPolicy / OpenAICompletionsPolicy)"
        ) from exc
    return vllm


@dataclass(frozen=True)
class VLLMEngineConfig:
    """Arguments of the in-process ``vllm.LLM`` engine."""

    model: str
    """Local model directory (Hugging Face format, e.g. written by ``save_pretrained``)."""
    tokenizer: str | None = None
    """Tokenizer directory; None means ``model``."""
    tensor_parallel_size: int = 1
    """GPUs the model is sharded over."""
    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory vLLM may take (weights + KV cache)."""
    kv_cache_dtype: str = "auto"
    """KV cache dtype: "auto" (model dtype), "fp8", "fp8_e4m3", "fp8_e5m2", ..."""
    dtype: str = "auto"
    """Weight/activation dtype ("auto", "bfloat16", "float16", "float32")."""
    max_model_len: int | None = None
    """Longest context (prompt + response); None means the model's."""
    enable_prefix_caching: bool = True
    """Reuse KV of shared prompt prefixes (reset after every weight sync)."""
    enforce_eager: bool = False
    """Disable CUDA graphs (slower, less memory, faster start)."""
    seed: int = 0
    """Engine seed."""
    logprobs_mode: str = "processed_logprobs"
    """Which log-probs vLLM reports; "processed_logprobs" = the distribution actually sampled."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Any other ``vllm.LLM`` / ``EngineArgs`` keyword, passed through unchanged."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be a local model directory, got an empty value")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if not isinstance(self.kv_cache_dtype, str) or not self.kv_cache_dtype:
            raise ValueError(f"kv_cache_dtype must be a non-empty string, got {self.kv_cache_dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1 or None, got {self.max_model_len}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        clash = set(self.extra) & set(self.llm_kwargs(include_extra=False))
        if clash:
            raise ValueError(f"extra repeats fields that have their own setting: {sorted(clash)}")

    def llm_kwargs(self, *, include_extra: bool = True) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM(...)``."""
        kw: dict[str, Any] = dict(
            model=self.model,
            tokenizer=self.tokenizer or self.model,
            tensor_parallel_size=self.tensor_parallel_size,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_dtype=self.kv_cache_dtype,
            dtype=self.dtype,
            enable_prefix_caching=self.enable_prefix_caching,
            enforce_eager=self.enforce_eager,
            seed=self.seed,
            logprobs_mode=self.logprobs_mode,
            worker_extension_cls=WORKER_EXTENSION,
        )
        if self.max_model_len is not None:
            kw["max_model_len"] = self.max_model_len
        if include_extra:
            kw.update(self.extra)
        return kw


def sampling_kwargs(
    sampling: SamplingConfig, max_tokens: int, stop_token_ids: Sequence[int], seed: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams`` (token ids out, sampled-token log-probs)."""
    kw: dict[str, Any] = dict(
        n=1,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k if sampling.top_k > 0 else -1,
        max_tokens=int(max_tokens),
        logprobs=0,  # the sampled token's log-prob only
        stop_token_ids=list(stop_token_ids),
        detokenize=False,  # text is decoded here from the ids, like every other compactrl policy
        skip_special_tokens=False,
    )
    if seed is not None:
        kw["seed"] = int(seed)
    return kw


def tokens_prompt(ids: Sequence[int]) -> dict[str, list[int]]:
    """A ``vllm.inputs.TokensPrompt`` (a TypedDict, so a plain dict is the real thing)."""
    return {"prompt_token_ids": [int(t) for t in ids]}


def parse_completion(completion: Any, stop_ids: Sequence[int]) -> Generated:
    """A ``vllm.CompletionOutput`` -> :class:`Generated`.

    ``completion.token_ids`` holds the sampled ids (a sampled stop token included);
    ``completion.logprobs[i]`` maps token id -> ``Logprob(logprob, rank, decoded_token)`` and holds
    at least the sampled token (list of dicts, or vLLM's ``FlatLogprobs`` with the same indexing).
    """
    ids = [int(t) for t in completion.token_ids]
    if completion.logprobs is None:
        raise ValueError("vLLM returned no logprobs: SamplingParams(logprobs=0) is required")
    if len(completion.logprobs) != len(ids):
        raise ValueError(f"vLLM returned {len(completion.logprobs)} logprob entries for {len(ids)} tokens")
    lps = []
    for i, t in enumerate(ids):
        entry = completion.logprobs[i]
        if t not in entry:
            raise ValueError(f"vLLM logprobs at step {i} lack the sampled token {t}")
        lps.append(float(entry[t].logprob))
    finished = bool(ids) and ids[-1] in set(stop_ids)
    return Generated(ids, lps, finished)


class WeightSyncWorkerExtension:
    """Mixed into every vLLM worker (``LLM(worker_extension_cls=WORKER_EXTENSION)``).

    ``self.model_runner.model`` is the worker's vLLM model; its ``load_weights`` takes checkpoint
    names and shards each tensor for tensor parallelism itself.
    """

    def compactrl_load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> int:
        model = self.model_runner.model  # type: ignore[attr-defined]
        device = next(model.parameters()).device
        model.load_weights(weights=((name, t.to(device, non_blocking=True)) for name, t in weights))
        return len(weights)


def _owned_cpu(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy with its own storage: pickling a view would ship the whole fused tensor."""
    return t.detach().to("cpu", copy=True).contiguous()


class VLLMPolicy:
    """An in-process vLLM engine as a compactrl policy."""

    def __init__(
        self,
        engine: VLLMEngineConfig | str,
        tokenizer=None,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int = 512,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        sync_bucket_bytes: int = 256 << 20,
        llm: Any = None,
    ) -> None:
        self.engine_config = engine if isinstance(engine, VLLMEngineConfig) else VLLMEngineConfig(model=engine)
        vllm = import_vllm() if llm is None else None  # fail early and clearly without vLLM
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.engine_config.tokenizer or self.engine_config.model)
        self.tokenizer = tokenizer
        self.sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.max_new_tokens = max_new_tokens
        self.stop_token_ids = sorted(set(stop_token_ids)) if stop_token_ids else default_stop_ids(tokenizer)
        self.sync_bucket_bytes = sync_bucket_bytes
        self._seed = seed
        self._calls = 0
        self.llm = llm if llm is not None else vllm.LLM(**self.engine_config.llm_kwargs())

    @classmethod
    def from_model(cls, model, tokenizer, directory, *, engine_kwargs: Mapping[str, Any] | None = None,
                   **kwargs) -> VLLMPolicy:
        """Write a Hugging Face model + tokenizer to ``directory`` and serve it with vLLM."""
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        return cls(VLLMEngineConfig(model=str(directory), **dict(engine_kwargs or {})), tokenizer, **kwargs)

    @property
    def context_length(self) -> int:
        if self.engine_config.max_model_len is not None:
            return self.engine_config.max_model_len
        try:
            return int(self.llm.llm_engine.model_config.max_model_len)
        except AttributeError:
            return 1 << 30

    def act(self, requests: Sequence[PolicyRequest]) -> list[str]:
        prompts = [prompt_ids_for(r, self.tokenizer) for r in requests]
        limits = budgets(requests, [len(p) for p in prompts], self.max_new_tokens, self.context_length)
        return [to_token_response(g, self.tokenizer, self.stop_token_ids) for g in self.generate(prompts, limits)]

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int] | int) -> list[Generated]:
        """Continuations of token-id prompts (vLLM batches and schedules them itself)."""
        vllm = import_vllm()
        if isinstance(max_new_tokens, int):
            max_new_tokens = [max_new_tokens] * len(prompts)
        params = []
        for n in max_new_tokens:
            seed = None if self._seed is None else self._seed + self._calls
            self._calls += 1
            params.append(vllm.SamplingParams(**sampling_kwargs(self.sampling, n, self.stop_token_ids, seed)))
        outputs = self.llm.generate([tokens_prompt(p) for p in prompts], sampling_params=params, use_tqdm=False)
        return [parse_completion(o.outputs[0], self.stop_token_ids) for o in outputs]

    def sync_weights(self, model) -> int:
        """Push a Hugging Face model's current weights into the engine; returns tensors sent."""
        sent = 0
        with torch.no_grad():
            stream = ((n, _owned_cpu(t)) for n, t in checkpoint_weights(model))
            for bucket in buckets(stream, self.sync_bucket_bytes):
                counts = self.llm.collective_rpc("compactrl_load_weights", args=(bucket,))
                if any(c != len(bucket) for c in counts):
                    raise RuntimeError(f"a vLLM worker loaded {counts} of {len(bucket)} tensors")
                sent += len(bucket)
        self.llm.reset_prefix_cache()
        logger.info("synced %d tensors into vLLM", sent)
        return sent
