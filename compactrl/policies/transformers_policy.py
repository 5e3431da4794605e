"""A policy around any local Hugging Face causal LM: batched sampling with exact log-probs, and the
differentiable ``log_prob`` the losses train with.

Sampling and ``log_prob`` follow the one log-prob rule of :mod:`compactrl.policies.sampling`: the
log-probs are those of the distribution the token was drawn from (temperature, top-k, top-p).

Generation is a hand-written loop over ``model.forward`` with a ``DynamicCache``: prompts of unequal
length are left-padded, position ids count real tokens only (so they equal the right-padded training
positions), finished rows leave the batch, and each row stops at its own end-of-turn token or budget.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from compactrl.policies.routing import records_routes
from compactrl.policies.sampling import (
    Generated,
    SamplingConfig,
    budgets,
    default_stop_ids,
    draw,
    prompt_ids_for,
    sampling_log_probs,
    to_token_response,
)
from compactrl.types import PolicyRequest

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------
# pure maths shared by sampling and training


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count real tokens only: identical for left- and right-padded rows."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _head_log_probs(head: nn.Module | None, rows: torch.Tensor, targets: torch.Tensor, sampling: SamplingConfig,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` and the entropy for ``rows`` (``[R, H]`` hidden states through ``head``,
    or ``[R, V]`` logits when ``head`` is None)."""
    logp = sampling_log_probs(rows if head is None else head(rows), sampling)
    token_lp = logp.gather(-1, targets[:, None]).squeeze(-1)
    return token_lp, -(logp.exp() * logp).sum(-1)


def chunked_log_probs(head: nn.Module | None, rows: torch.Tensor, targets: torch.Tensor, sampling: SamplingConfig,
                      chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_head_log_probs` over at most ``chunk`` rows at a time (0: all at once).

    Each chunk runs under ``torch.utils.checkpoint`` when gradients are on: autograd then keeps only
    the chunk's inputs, and the backward recomputes one chunk's ``[chunk, vocab]`` logits at a time,
    so neither pass holds more than O(chunk x vocab). Without it every chunk's log-softmax output
    would stay alive for the backward and chunking would save nothing while training. Values and
    gradients equal the unchunked ones up to float summation order.
    """
    if chunk <= 0 or rows.shape[0] <= chunk:
        return _head_log_probs(head, rows, targets, sampling)
    params = head.parameters() if head is not None else ()
    grad = torch.is_grad_enabled() and (rows.requires_grad or any(p.requires_grad for p in params))
    pieces = []
    for r, t in zip(rows.split(chunk), targets.split(chunk)):
        if grad:
            pieces.append(torch.utils.checkpoint.checkpoint(_head_log_probs, head, r, t, sampling, use_reentrant=False))
        else:
            pieces.append(_head_log_probs(head, r, t, sampling))
    return torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])


def shift_token_log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingConfig,
    chunk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``out[:, t] = log p(tokens[:, t] | tokens[:, :t])`` and the entropy there; 0 at t=0 and padding.

    ``chunk > 0`` runs the log-softmax over at most ``chunk`` positions at a time (the logits
    themselves are the caller's; :meth:`TransformersPolicy.log_prob` avoids materialising them).
    """
    if chunk > 0:  # row by row: ``logits[i, :-1]`` is a view, where flattening the batch would copy it
        rows = [chunked_log_probs(None, logits[i, :-1], tokens[i, 1:], sampling, chunk) for i in range(len(logits))]
        token_lp, entropy = torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
    else:
        logp = sampling_log_probs(logits[:, :-1], sampling)
        token_lp = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
    zero = token_lp.new_zeros(tokens.shape[0], 1)
    keep = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    token_lp = torch.cat([zero, token_lp.masked_fill(~keep, 0.0)], dim=1)
    entropy = torch.cat([zero, entropy.masked_fill(~keep, 0.0)], dim=1)
    return token_lp, entropy


def _selected_token_log_probs(head: nn.Module, hidden: torch.Tensor, tokens: torch.Tensor,
                              attention_mask: torch.Tensor, select: torch.Tensor, sampling: SamplingConfig,
                              chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`shift_token_log_probs` at the positions ``select`` only, from the trunk's hidden states
    (the head over at most ``chunk`` selected positions at a time when ``chunk > 0``)."""
    keep = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    rows = torch.cat([select.new_zeros(select.shape[0], 1), select[:, 1:] & keep], dim=1)
    token_lp, entropy = chunked_log_probs(head, hidden[:, :-1][rows[:, 1:]], tokens[rows], sampling, chunk)
    zeros = torch.zeros(tokens.shape, dtype=token_lp.dtype, device=tokens.device)
    return zeros.masked_scatter(rows, token_lp), zeros.masked_scatter(rows, entropy)


def enable_activation_checkpointing(model: nn.Module, enable: bool = True) -> None:
    """Hugging Face activation checkpointing of every decoder layer (non-reentrant ``torch.utils.checkpoint``):
    the backward recomputes each layer's activations instead of keeping them. Engaged only where
    :func:`checkpointing_engaged` runs the forward (see there). ``enable=False`` switches it off again."""
    if not enable:
        if not any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules()):
            return
        if hasattr(model, "activation_checkpointing_disable"):
            model.activation_checkpointing_disable()
        else:
            model.gradient_checkpointing_disable()
        return
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


@contextmanager
def checkpointing_engaged(model: nn.Module):
    """Run a forward with the checkpointed decoder layers in training mode, their submodules untouched.

    Hugging Face checkpoints a layer only when the layer itself is in training mode, but the learner
    trains the policy in eval mode (no dropout, no router jitter): flipping the layers' own flag,
    not their children's, engages checkpointing and changes nothing else of the forward.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
              and not m.training]
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m in layers:
            m.training = False


def router_aux_loss(model: nn.Module, router_logits: Any, attention_mask: torch.Tensor) -> torch.Tensor:
    """Switch-Transformer load-balancing loss over every MoE layer, padding excluded (unscaled).

    Uses the softmax of the router logits for every architecture; GLM-4-MoE routes with a sigmoid
    plus a bias correction, for which this is the usual auxiliary proxy. Dense models give 0.
    """
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    cfg = model.config
    num_experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    if not router_logits or num_experts is None:
        return torch.zeros((), device=attention_mask.device)
    layers = tuple(r for r in router_logits if r is not None)
    return load_balancing_loss_func(layers, num_experts, cfg.num_experts_per_tok, attention_mask)


# --------------------------------------------------------------------------------------------------
# batched generation


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
@records_routes
def generate_tokens(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int],
    *,
    sampling: SamplingConfig,
    stop_ids: Iterable[int],
    pad_id: int = 0,
    generator: torch.Generator | None = None,
    top_logprobs: int = 0,
    report: SamplingConfig | None = None,
    make_cache: Callable[[Any], Any] | None = None,
) -> list[Generated]:
    """Sample continuations of ``prompts`` in one batch (KV cache, per-row stop and budget).

    Log-probs are those of ``sampling``'s distribution, or of ``report``'s when given (e.g.
    ``SamplingConfig()`` for vLLM's "raw_logprobs": the untempered, untruncated model). An MoE model's
    routes of the prompt and generated tokens come with each result (``Generated.routed_experts``,
    :func:`compactrl.policies.routing.records_routes`). ``make_cache(model.config)`` builds the KV cache
    (default: a ``DynamicCache``; e.g. :func:`compactrl.policies.fp8_cache.make_kv_cache` for an fp8 one).
    """
    if len(prompts) != len(max_new_tokens):
        raise ValueError(f"{len(prompts)} prompts but {len(max_new_tokens)} max_new_tokens")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    from transformers import DynamicCache

    device = next(model.parameters()).device
    stop = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=device)
    results = [Generated([], [], False, [] if top_logprobs else None) for _ in prompts]
    budget = torch.tensor([int(n) for n in max_new_tokens], device=device)
    ids, mask = _left_pad(prompts, pad_id, device)
    positions = positions_from_mask(mask)
    cache = DynamicCache(config=model.config) if make_cache is None else make_cache(model.config)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                use_cache=True, logits_to_keep=1)
    rows = torch.arange(len(prompts), device=device)  # original index of each live batch row
    next_pos = positions[:, -1] + 1
    live = budget > 0
    step = 0
    while True:
        if not bool(live.all()):
            keep = live.nonzero().squeeze(-1)
            if keep.numel() == 0:
                break
            cache.batch_select_indices(keep)
            rows, mask, next_pos, budget = rows[keep], mask[keep], next_pos[keep], budget[keep]
            out.logits = out.logits[keep]
        logp = sampling_log_probs(out.logits[:, -1], sampling)
        tok = draw(logp, sampling, generator)
        if report is not None and report != sampling:
            logp = sampling_log_probs(out.logits[:, -1], report)
        tok_lp = logp.gather(-1, tok[:, None]).squeeze(-1)
        top = torch.topk(logp, top_logprobs, dim=-1) if top_logprobs else None
        for j, (r, t, lp) in enumerate(zip(rows.tolist(), tok.tolist(), tok_lp.tolist())):
            res = results[r]
            res.token_ids.append(t)
            res.log_probs.append(lp)
            if top is not None:
                res.top_logprobs.append(list(zip(top.indices[j].tolist(), top.values[j].tolist())))
        step += 1
        finished = torch.isin(tok, stop)
        for r in rows[finished].tolist():
            results[r].finished = True
        live = ~finished & (budget > step)
        if not bool(live.any()):
            break
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                    cache=cache, use_cache=True)
        next_pos = next_pos + 1
    return results


# --------------------------------------------------------------------------------------------------
# the policy


def batch_chunks(lengths_desc: Sequence[int], max_rows: int, max_tokens: int) -> list[list[int]]:
    """Split positions of descending prompt lengths into batches within ``max_rows`` and
    ``max_tokens`` padded tokens (rows x longest), each batch non-empty."""
    chunks: list[list[int]] = []
    for i in range(len(lengths_desc)):
        last = chunks[-1] if chunks else None
        if last and len(last) < max_rows and (len(last) + 1) * lengths_desc[last[0]] <= max_tokens:
            last.append(i)
        else:
            chunks.append([i])
    return chunks


class TransformersPolicy(nn.Module):
    """A Hugging Face causal LM as a compactrl policy (``act``) and as a trainable module (``log_prob``).

    ``kv_cache_dtype``: the sampler's KV cache, ``auto`` (the model's dtype) or ``fp8`` (float8 e4m3 with
    vLLM's per-tensor scales, :mod:`compactrl.policies.fp8_cache`); ``log_prob`` never uses a cache.

    ``state_dict()`` / ``load_state_dict()`` pass through to ``model`` (Hugging Face parameter names);
    ``save_pretrained(dir)`` writes model and tokenizer, ``from_pretrained(dir)`` reads them back.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int = 512,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        max_batch_size: int = 64,
        max_batch_tokens: int = 65536,
        logprob_chunk_tokens: int = 0,
        activation_checkpointing: bool = False,
        kv_cache_dtype: str = "auto",
    ) -> None:
        super().__init__()
        from compactrl.policies.fp8_cache import KV_CACHE_DTYPES

        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype: expected one of {'|'.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        if logprob_chunk_tokens < 0:
            raise ValueError(f"logprob_chunk_tokens must be >= 0, got {logprob_chunk_tokens}")
        self.model = model
        self.logprob_chunk_tokens = logprob_chunk_tokens
        """``log_prob`` runs the LM head, log-softmax and entropy over at most this many positions at
        a time (memory O(chunk x vocab), not O(T x vocab)); 0: all at once."""
        if activation_checkpointing:
            enable_activation_checkpointing(model)
        self.tokenizer = tokenizer
        self.sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
        self.max_new_tokens = max_new_tokens
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.kv_cache_dtype = kv_cache_dtype
        self.stop_token_ids = sorted(set(stop_token_ids)) if stop_token_ids else default_stop_ids(tokenizer, model)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop_token_ids[0]
        self.generator = torch.Generator(device=next(model.parameters()).device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    # -- checkpoints -------------------------------------------------------------------------------

    def state_dict(self, *args, **kwargs):  # Hugging Face names, so the dict loads into vLLM / HF as is
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    def save_pretrained(self, path) -> None:
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    @classmethod
    def from_pretrained(cls, path, *, dtype: torch.dtype = torch.float32, **kwargs) -> TransformersPolicy:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, experts_implementation="grouped_mm")
        return cls(model.eval(), AutoTokenizer.from_pretrained(path), **kwargs)

    # -- acting ------------------------------------------------------------------------------------

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30))

    def act(self, requests: Sequence[PolicyRequest]) -> list[str]:
        prompts = [prompt_ids_for(r, self.tokenizer) for r in requests]
        limits = budgets(requests, [len(p) for p in prompts], self.max_new_tokens, self.context_length)
        gens = self.generate(prompts, limits)
        return [to_token_response(g, self.tokenizer, self.stop_token_ids) for g in gens]

    def generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int] | int, *,
        sampling: SamplingConfig | None = None, top_logprobs: int = 0,
    ) -> list[Generated]:
        """Continuations of token-id prompts, batched (similar lengths together).

        A batch holds at most ``max_batch_size`` prompts and ``max_batch_tokens`` padded prompt
        tokens (the prefill's memory), but always at least one prompt.
        """
        if isinstance(max_new_tokens, int):
            max_new_tokens = [max_new_tokens] * len(prompts)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]), reverse=True)
        out: list[Generated | None] = [None] * len(prompts)
        for chunk in batch_chunks([len(prompts[i]) for i in order], self.max_batch_size, self.max_batch_tokens):
            chunk = [order[j] for j in chunk]
            gens = generate_tokens(
                self.model, [prompts[i] for i in chunk], [max_new_tokens[i] for i in chunk],
                sampling=sampling or self.sampling, stop_ids=self.stop_token_ids, pad_id=self.pad_token_id,
                generator=self.generator, top_logprobs=top_logprobs, make_cache=self._make_cache(),
            )
            for i, g in zip(chunk, gens):
                out[i] = g
        return out  # type: ignore[return-value]

    def _make_cache(self) -> Callable[[Any], Any] | None:
        """The sampler's KV cache factory: None (a ``DynamicCache``) or vLLM's fp8 scheme (``kv_cache_dtype``)."""
        if self.kv_cache_dtype == "auto":
            return None
        from compactrl.policies.fp8_cache import make_kv_cache

        return functools.partial(make_kv_cache, self.kv_cache_dtype)

    # -- training ----------------------------------------------------------------------------------

    def _sampling_for(self, temperature, top_k, top_p) -> SamplingConfig:
        s = self.sampling
        t = s.logprob_temperature if temperature is None else temperature
        return SamplingConfig(
            temperature=t if t > 0 else 1.0,
            top_k=s.top_k if top_k is None else top_k,
            top_p=s.top_p if top_p is None else top_p,
        )

    def log_prob(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor,
        select: torch.Tensor | None = None,
        *,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        return_aux_loss: bool = False,
    ):
        """Per-token log-probs and entropies ``[N, L]`` of ``tokens`` under the current weights.

        ``out[:, t] = log p(tokens[:, t] | tokens[:, :t])`` from the logits at ``t - 1``; position 0
        and padding are 0. Differentiable. The distribution is the policy's sampling distribution
        (its temperature, top-k, top-p) unless overridden. ``select`` (``[N, L]`` bool): the LM head
        and softmax run only where it is set (the trunk still runs over every position), and the
        outputs are 0 elsewhere. Losses read a small share of a trace's positions (its policy
        tokens), and on a small model with a 4k vocabulary the head is most of a step's cost. With
        ``return_aux_loss=True`` a third value is the MoE router load-balancing loss (unscaled;
        multiply by e.g. ``model.config.router_aux_loss_coef``).
        With ``logprob_chunk_tokens`` the head runs over at most that many (selected) positions at a
        time and the full ``[N, L, vocab]`` logits are never built.
        """
        if tokens.shape != attention_mask.shape or tokens.dim() != 2:
            raise ValueError(f"tokens and attention_mask must both be [N, L], got {tuple(tokens.shape)} "
                             f"and {tuple(attention_mask.shape)}")
        if select is not None and select.shape != tokens.shape:
            raise ValueError(f"select must be [N, L] like tokens {tuple(tokens.shape)}, got {tuple(select.shape)}")
        mask = attention_mask.long()
        sampling = self._sampling_for(temperature, top_k, top_p)
        chunk = self.logprob_chunk_tokens
        trunk, head = getattr(self.model, "base_model", None), getattr(self.model, "lm_head", None)
        if chunk > 0 and select is None:
            select = torch.ones_like(tokens, dtype=torch.bool)  # the head per chunk needs the trunk's path
        positions = positions_from_mask(mask)
        with checkpointing_engaged(self.model):
            if select is None or trunk is None or head is None or trunk is self.model:
                out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions,
                                 use_cache=False, output_router_logits=return_aux_loss)
                lp, ent = shift_token_log_probs(out.logits, tokens, mask, sampling, chunk)
                if select is not None:
                    lp, ent = lp.masked_fill(~select.bool(), 0.0), ent.masked_fill(~select.bool(), 0.0)
            else:
                out = trunk(input_ids=tokens, attention_mask=mask, position_ids=positions,
                            use_cache=False, output_router_logits=return_aux_loss)
                lp, ent = _selected_token_log_probs(head, out.last_hidden_state, tokens, mask, select.bool(),
                                                    sampling, chunk)
        if return_aux_loss:
            return lp, ent, router_aux_loss(self.model, getattr(out, "router_logits", None), mask)
        return lp, ent

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor, **kwargs):
        return self.log_prob(tokens, attention_mask, **kwargs)
