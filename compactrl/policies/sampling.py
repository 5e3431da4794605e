"""The sampling contract every compactrl policy and engine follows, in one place.

Log-prob semantics (one rule for every policy): the log-probs returned at sampling are those of the
distribution the token was actually drawn from, ``log_softmax(truncate(logits / T))`` where
``truncate`` keeps the ``top_k`` / ``top_p`` set (vLLM's ``logprobs_mode="processed_logprobs"``).
Greedy decoding (``temperature=0``) reports the ``T=1`` distribution. A policy's ``log_prob``
recomputes the same quantity (same temperature and truncation, by default the policy's own), so the
PPO ratio compares like with like. With the defaults ``temperature=1, top_k=0, top_p=1`` it is the
plain model log-likelihood.

What lives here:

* :class:`SamplingConfig`, :func:`truncate_logits`, :func:`sampling_log_probs`: the distribution;
* :func:`draw`: how a token is drawn from it (the RNG draws a seeded run depends on);
* :class:`Generated`: one continuation, as every engine returns it (ids, log-probs, finished);
* :func:`prompt_ids_for`, :func:`budgets`, :func:`default_stop_ids`, :func:`to_token_response`: how
  a :class:`~compactrl.types.PolicyRequest` becomes a prompt and a budget, and a continuation a
  :class:`~compactrl.types.TokenResponse` (the same for the in-process model, the vLLM engine and an
  OpenAI-compatible server).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from compactrl.types import PolicyRequest, TokenResponse


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is drawn."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches ``top_p`` (1 = off)."""
    top_k: int = 0
    """Keep the ``top_k`` most likely tokens (0 = off)."""

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """Temperature of the distribution whose log-probs are reported (1 when greedy)."""
        return 1.0 if self.greedy else self.temperature


# --------------------------------------------------------------------------------------------------
# the distribution and the draw


def truncate_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k / top-p set to the dtype's lowest finite value.

    A finite floor (not ``-inf``) keeps ``0 * log_prob`` finite for masked-out positions in losses.
    """
    if top_k <= 0 and top_p >= 1.0:
        return logits
    floor = torch.finfo(logits.dtype).min
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, floor)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass strictly before it already reaches top_p (the top one always stays)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, floor)
    return logits


def sampling_log_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """Log-probs over the vocabulary of the distribution ``sampling`` draws from (float32)."""
    scaled = logits.float() / sampling.logprob_temperature
    return torch.log_softmax(truncate_logits(scaled, sampling.top_k, sampling.top_p), dim=-1)


def draw(logp: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row of ``logp`` (``[rows, vocab]``, :func:`sampling_log_probs` of ``sampling``).

    Greedy takes the argmax and draws nothing. Otherwise each row consumes exactly one uniform from
    ``generator`` (rows in order) and takes the first token whose cumulative probability exceeds it:
    the same generator state gives the same tokens, which is what seeded runs and the tests rely on.
    """
    if sampling.greedy:
        return logp.argmax(-1)
    # inverse CDF: one uniform per row (torch.multinomial costs ~4 ms per [32, 4096] call on CPU)
    cdf = logp.exp().cumsum(-1)
    u = torch.rand((logp.shape[0], 1), generator=generator, device=logp.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=logp.shape[-1] - 1)


# --------------------------------------------------------------------------------------------------
# continuations and requests


@dataclass
class Generated:
    """One generated continuation."""

    token_ids: list[int]
    log_probs: list[float]
    finished: bool
    """The last token is a stop (end-of-turn) token."""
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """Per step, the ``k`` most likely (id, log-prob) pairs of the sampling distribution, when asked."""
    routed_experts: Any = None
    """MoE routes of the prompt and generated tokens, ``[prompt + generated, moe_layers, k]`` (a compact
    numpy array, :mod:`compactrl.policies.routing`; the sentinel where a token has none), or None."""


def default_stop_ids(tokenizer, model=None) -> list[int]:
    """End-of-turn ids: the chat format's token spec (end-of-turn and eos ids) plus the model's eos ids
    (:func:`compactrl.wrappers.chat_format.stop_ids`, the one place they are worked out)."""
    from compactrl.wrappers.chat_format import stop_ids

    return stop_ids(tokenizer, model)


def prompt_ids_for(request: PolicyRequest, tokenizer) -> list[int]:
    """The request's exact prompt ids, or its messages rendered with the chat template."""
    if request.prompt_token_ids is not None:
        return [int(t) for t in request.prompt_token_ids]
    enc = tokenizer.apply_chat_template(list(request.messages), add_generation_prompt=True, tokenize=True)
    ids = enc["input_ids"] if not isinstance(enc, list) else enc
    return [int(t) for t in ids]


def to_token_response(gen: Generated, tokenizer, stop_ids: Iterable[int]) -> TokenResponse:
    """Text is the decode of the ids without the end-of-turn token; ids and log-probs are kept whole."""
    body = gen.token_ids[:-1] if gen.finished and gen.token_ids and gen.token_ids[-1] in set(stop_ids) \
        else gen.token_ids
    text = tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return TokenResponse(text, gen.token_ids, gen.log_probs, finished=gen.finished,
                         routed_experts=gen.routed_experts)


def budgets(requests: Sequence[PolicyRequest], prompt_lens: Sequence[int], cap: int, context: int) -> list[int]:
    """New-token budget per request: the request's (if any) within the policy's cap and the context."""
    out = []
    for req, n in zip(requests, prompt_lens):
        if n >= context:
            raise ValueError(f"prompt of {n} tokens does not fit the model's context of {context} tokens")
        want = cap if req.max_new_tokens is None else min(int(req.max_new_tokens), cap)
        out.append(max(0, min(want, context - n)))
    return out
