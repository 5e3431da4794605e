"""A policy served by a vLLM engine in its own process and environment (the process and how it is
started: :mod:`compactrl.serving.vllm.client`).

:class:`VLLMPolicy` speaks the same protocol as :class:`~compactrl.policies.TransformersPolicy`:

* ``act`` / ``generate``: token ids in (``TokensPrompt``, no re-tokenisation), sampled token ids and
  the log-probs of the distribution they were drawn from out (``logprobs_mode="processed_logprobs"``,
  the rule every compactrl policy follows);
* ``score``: the log-probs of given tokens (vLLM's prompt log-probs);
* ``update_weights(model)``: after each update the learner's weights go to the engine in buckets,
  under their per-expert checkpoint names (:mod:`compactrl.policies.moe_weights`), tagged with the
  policy version that the engine reports with every generation; the engine reloads them through
  vLLM's ``reload_weights`` (plus the CPU experts' repack, see
  :func:`compactrl.serving.vllm.engine.reload_weights`) and resets its prefix cache. Then the engine
  and the learner score one fixed probe batch (:meth:`VLLMPolicy.check_sync`): the max |delta log p|
  goes into :attr:`VLLMPolicy.last_sync`, and beyond ``sync_tolerance`` a :class:`SyncCheckError`
  naming the sync stops the run before any rollout from those weights is used;
* ``close``: the engine exits; an engine that dies becomes an
  :class:`~compactrl.serving.vllm.client.EngineDied` naming its exit status and the tail of its log.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from compactrl.policies.moe_weights import buckets, checkpoint_weights
from compactrl.policies.routing import checkpoint_moe_layers, prompt_and_output_routes
from compactrl.policies.sampling import (
    Generated,
    SamplingConfig,
    budgets,
    default_stop_ids,
    prompt_ids_for,
    to_token_response,
)
from compactrl.serving.vllm import wire
from compactrl.serving.vllm.client import EngineFailure, VLLMEngine, VLLMEngineConfig
from compactrl.types import PolicyRequest

logger = logging.getLogger(__name__)

DEFAULT_SYNC_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.5, "float16": 0.1}
"""Largest max |delta log p| on the probe batch accepted after a sync, by engine dtype. float32 agrees
to ~1e-6 (a stale expert layout moves it by ~0.1); bf16/fp16 activations alone differ from the float32
learner by the measured gaps in docs/policies.md, so only a gross corruption is caught there."""
FP8_KV_SYNC_MEAN_TOLERANCE = 0.35
"""The probe bound with a quantised KV cache (``kv_cache_dtype`` "fp8*"), on the *mean* |delta log p|. fp8
keys and values (per-tensor scale 1.0, truncating on CPU) move a trained model's log-probs by up to 1-3.7
on single probe tokens, as far as a corrupted sync moves them (a stale expert layout: 4.3-4.7), so the
maximum cannot tell the two apart; the mean can: 0.15-0.16 after a correct sync of the main job's SFT and
RL-trained models, 0.58-0.62 with one MoE layer's expert weights perturbed by 5%, 0.98-1.05 with a stale
expert layout (bf16 engine, vLLM's fp8 cache; docs/policies.md)."""


def default_sync_bound(config: VLLMEngineConfig) -> tuple[str, float]:
    """The post-sync probe check of an engine, ``(statistic, bound)``: the max |delta log p| within the
    engine dtype's :data:`DEFAULT_SYNC_TOLERANCE`, or with an fp8 KV cache the mean within
    :data:`FP8_KV_SYNC_MEAN_TOLERANCE`."""
    if config.kv_cache_dtype.startswith("fp8"):
        return "mean", FP8_KV_SYNC_MEAN_TOLERANCE
    return "max", DEFAULT_SYNC_TOLERANCE[config.dtype]








class SyncCheckError(EngineFailure):
    """After a weight sync the engine's log-probs differ from the learner's beyond the bound."""








def sampling_kwargs(sampling: SamplingConfig, max_tokens: int, stop_token_ids: Sequence[int],
                    seed: int | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams``: token ids out, the sampled tokens' log-probs."""
    kw: dict[str, Any] = dict(
        n=1, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
        max_tokens=int(max_tokens), logprobs=0, stop_token_ids=[int(t) for t in stop_token_ids],
        detokenize=False, skip_special_tokens=False,
    )
    if seed is not None:
        kw["seed"] = int(seed)
    return kw




def probe_sequences(vocab_size: int, *, count: int = 4, length: int = 48, seed: int = 1234) -> list[list[int]]:
    """The fixed probe batch: seeded random token sequences of one length."""
    if vocab_size < 4 or count < 1 or length < 2:
        raise ValueError(f"probe: expected vocab_size >= 4, count >= 1, length >= 2, got {vocab_size}, {count}, "
                         f"{length}")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (count, length), generator=g).tolist()


@torch.no_grad()
def learner_log_probs(model: torch.nn.Module, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
    """``log p(seq[t] | seq[:t])`` for ``t >= 1`` under a Hugging Face causal LM (float32 softmax)."""
    device = next(model.parameters()).device
    out = []
    for seq in sequences:
        ids = torch.tensor([list(seq)], device=device)
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        out.append(torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist())
    return out


def max_abs_diff(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> tuple[float, float]:
    """(max, mean) of |a - b| over equal-shaped ragged lists."""
    diffs = [abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return (max(diffs), sum(diffs) / len(diffs)) if diffs else (0.0, 0.0)


class VLLMPolicy:
    """A compactrl policy whose generations come from a vLLM engine process."""

    def __init__(
        self,
        engine: VLLMEngineConfig | VLLMEngine,
        tokenizer,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int = 512,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        sync_bucket_bytes: int = 64 << 20,
        sync_tolerance: float | None = None,
        probe: Sequence[Sequence[int]] | None = None,
        version: int = 0,
        log_path: str | Path | None = None,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
        if sync_bucket_bytes < 1:
            raise ValueError(f"sync_bucket_bytes: expected >= 1, got {sync_bucket_bytes}")
        self.engine = engine if isinstance(engine, VLLMEngine) else VLLMEngine(engine, version=version,
                                                                                 log_path=log_path)
        self.engine_config = self.engine.config
        statistic, tol = default_sync_bound(self.engine_config) if sync_tolerance is None else ("max", sync_tolerance)
        if not (tol > 0 and math.isfinite(tol)):
            raise ValueError(f"sync_tolerance: expected a finite number > 0, got {sync_tolerance}")
        self.sync_tolerance = tol
        """The post-sync probe bound on :attr:`sync_statistic` (an explicit ``sync_tolerance`` bounds the max)."""
        self.sync_statistic = statistic
        """"max" or "mean": which |delta log p| over the probe batch :meth:`check_sync` bounds."""
        self.tokenizer = tokenizer
        self.sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
        self.max_new_tokens = max_new_tokens
        self.stop_token_ids = sorted(set(stop_token_ids)) if stop_token_ids else default_stop_ids(tokenizer)
        self.sync_bucket_bytes = sync_bucket_bytes
        self.probe = [list(p) for p in probe] if probe is not None else probe_sequences(len(tokenizer))
        self.version = int(self.engine.info["version"])
        """Weight version the engine holds (0: the weights it started from; +1 per sync)."""
        self.last_version: int | None = None
        """Version the engine reported with the latest generation."""
        self.last_sync: dict[str, float] = {}
        """The latest sync's measurements (``engine/*`` metrics)."""
        self._seed = seed
        self._calls = 0
        self._moe_layers: list[int] | None = None  # decoder layers with a router (read from the model at first use)

    @classmethod
    def from_model(cls, model, tokenizer, directory: str | Path, *, engine: Mapping[str, Any] | None = None,
                   **kwargs: Any) -> VLLMPolicy:
        """Write a Hugging Face model to ``directory`` and serve it with a vLLM engine process."""
        model.save_pretrained(directory)
        return cls(VLLMEngineConfig(model=str(directory), **dict(engine or {})), tokenizer, **kwargs)

    @property
    def context_length(self) -> int:
        return int(self.engine.info["max_model_len"])

    # -- acting ------------------------------------------------------------------------------------

    def act(self, requests: Sequence[PolicyRequest]) -> list:
        prompts = [prompt_ids_for(r, self.tokenizer) for r in requests]
        limits = budgets(requests, [len(p) for p in prompts], self.max_new_tokens, self.context_length)
        return [to_token_response(g, self.tokenizer, self.stop_token_ids) for g in self.generate(prompts, limits)]

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int] | int, *,
                 sampling: SamplingConfig | None = None, stop_token_ids: Sequence[int] | None = None,
                 seeds: Sequence[int | None] | None = None) -> list[Generated]:
        """Continuations of token-id prompts (the engine batches and schedules them itself)."""
        if isinstance(max_new_tokens, int):
            max_new_tokens = [max_new_tokens] * len(prompts)
        if len(max_new_tokens) != len(prompts):
            raise ValueError(f"max_new_tokens: expected {len(prompts)} budgets, got {len(max_new_tokens)}")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: every prompt needs at least one token")
        sampling = sampling or self.sampling
        stop = list(stop_token_ids) if stop_token_ids is not None else self.stop_token_ids
        out: list[Generated] = [Generated([], [], False) for _ in prompts]
        todo = [i for i, n in enumerate(max_new_tokens) if n > 0]
        if not todo:
            return out
        params = []
        for j, i in enumerate(todo):
            seed = seeds[i] if seeds is not None else (None if self._seed is None else self._seed + self._calls + j)
            params.append(sampling_kwargs(sampling, max_new_tokens[i], stop, seed))
        self._calls += len(todo)
        answer = self.engine.call("generate", prompts=[[int(t) for t in prompts[i]] for i in todo], params=params)
        self.last_version = int(answer["version"])
        stops = set(stop)
        for i, o in zip(todo, answer["outputs"]):
            ids = o["token_ids"]
            out[i] = Generated(ids, o["log_probs"], bool(ids) and ids[-1] in stops)
            if "routed_experts" in o:  # [tokens, layers, top-k] expert ids (capture_routes, enable_return_routed_experts)
                if self._moe_layers is None:
                    self._moe_layers = checkpoint_moe_layers(self.engine_config.model)
                out[i].routed_experts = prompt_and_output_routes(o["routed_experts"], len(prompts[i]) + len(ids),
                                                                 self._moe_layers)
        return out

    def score(self, sequences: Sequence[Sequence[int]], *, temperature: float = 1.0) -> list[list[float]]:
        """``log p(seq[t] | seq[:t])`` for ``t >= 1`` under the engine's weights (prompt log-probs)."""
        answer = self.engine.call("score", sequences=[[int(t) for t in s] for s in sequences],
                                  params={"temperature": temperature})
        return answer["log_probs"]

    # -- weights -----------------------------------------------------------------------------------

    def sync_weights(self, model, *, version: int | None = None, repack_experts: bool = True) -> dict[str, float]:
        """Send a Hugging Face model's current weights (bucketed) and make them the engine's ``version``."""
        version = self.version + 1 if version is None else int(version)
        t0 = time.perf_counter()
        sent = nbytes = nbuckets = 0
        with torch.no_grad():
            for bucket in buckets(checkpoint_weights(model), self.sync_bucket_bytes):
                self.engine.call("stage", tensors=list(wire.named_tensors(bucket)))
                sent, nbuckets = sent + len(bucket), nbuckets + 1
                nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
        t_send = time.perf_counter() - t0
        answer = self.engine.call("commit", version=version, repack_experts=repack_experts)
        self.version = int(answer["version"])
        return {"engine/sync_version": float(self.version), "engine/sync_tensors": float(sent),
                "engine/sync_buckets": float(nbuckets),
                "engine/sync_mb": nbytes / 1e6, "engine/sync_send_s": t_send,
                "engine/sync_load_s": float(answer["load_s"]), "engine/sync_s": time.perf_counter() - t0}

    def check_sync(self, model, reference: Callable | None = None) -> dict[str, float]:
        """Score the probe batch on both sides; raise :class:`SyncCheckError` beyond ``sync_tolerance``.

        The learner's side is ``reference(probe)`` when given (a sharded learner scores with its own shards,
        so a bucket corrupted on its way here is caught), else ``model``'s log-probs."""
        t0 = time.perf_counter()
        engine_lp = self.score(self.probe)
        learner_lp = reference(self.probe) if reference is not None else learner_log_probs(model, self.probe)
        worst, mean = max_abs_diff(engine_lp, learner_lp)
        row = {"engine/probe_max_abs_dlogp": worst, "engine/probe_mean_abs_dlogp": mean,
               "engine/probe_s": time.perf_counter() - t0}
        checked = mean if self.sync_statistic == "mean" else worst
        if not checked <= self.sync_tolerance:  # nan fails too
            raise SyncCheckError(
                f"weight sync to version {self.version}: the vLLM engine's log-probs differ from the learner's by "
                f"up to {worst:.4g} (mean {mean:.4g}) on the {len(self.probe)}-sequence probe batch, the "
                f"{self.sync_statistic} beyond sync_tolerance={self.sync_tolerance:g}; no rollout from these weights was used")
        return row

    def update_weights(self, model, *, reference: Callable | None = None, **kwargs: Any) -> dict[str, float]:
        """Sync and check (the trace collector's ``update_policy_weights_`` hook); returns the metrics.
        ``reference`` scores the probe batch for the learner (see :meth:`check_sync`)."""
        if isinstance(model, Mapping):
            raise ValueError("update_weights: expected the learner's model (a torch module), got a state dict")
        if hasattr(model, "log_prob") and hasattr(model, "model"):  # a TransformersPolicy: its Hugging Face model
            model = model.model
        row = self.sync_weights(model, **kwargs)
        row.update(self.check_sync(model, reference))
        self.last_sync = row
        logger.info("engine synced to version %d in %.3f s; probe max |dlogp| %.3g", self.version,
                    row["engine/sync_s"], row["engine/probe_max_abs_dlogp"])
        return row

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> VLLMPolicy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

