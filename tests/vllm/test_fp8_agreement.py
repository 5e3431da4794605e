"""compactrl's transformers FP8 KV cache and vLLM's ``kv_cache_dtype="fp8"`` are the same scheme: vLLM's CPU
quantiser gives the bytes ``quantize_fp8`` gives, and on the same sequences the two fp8 caches' log-probs
agree far more closely than either agrees with a float32 cache (benchmarks/results/fp8_kv_bench.md)."""

from __future__ import annotations

import subprocess

import pytest
import torch

from compactrl.policies.fp8_cache import Fp8KVCache, cached_log_probs, quantize_fp8
from compactrl.provenance import has_avx512_or_amx
from compactrl.serving.vllm.client import default_engine_python
from compactrl.serving.vllm.policy import VLLMPolicy

pytestmark = [pytest.mark.timeout(600), pytest.mark.skipif(
    not has_avx512_or_amx(), reason="vLLM runs an fp8 KV cache on CPU only with AVX-512 or AMX (refused here: "
    "tests/vllm/test_architectures.py::test_an_fp8_kv_cache_on_a_cpu_without_avx512_is_refused_before_the_engine_starts)")]

AGREE_MAX = 1e-2
AGREE_MEAN = 1e-4
"""fp8 transformers vs fp8 vLLM on the same sequences, measured 1.9e-6 max on tiny glm4_moe (the float32
floor) and up to 1e-3 on qwen3_moe, where a key the two compute 1e-7 apart lands on either side of an
fp8 grid step; fp8 vs float32 is 0.05-0.1 max, 0.008-0.01 mean (docs/mismatch.md)."""
FP8_FROM_FULL = 1e-3
"""The check is not vacuous: each fp8 cache is this far or more (max) from the float32 scores."""

_KERNEL = r"""
import sys, numpy as np, torch, vllm._custom_ops as ops
x = torch.from_numpy(np.frombuffer(sys.stdin.buffer.read(), dtype=np.float32).copy()).reshape(-1, 2, 32)
kc = torch.zeros(1, 2, x.shape[0], 32, dtype=torch.uint8); vc = torch.zeros_like(kc)
ops.cpu_attn_reshape_and_cache(x, x, kc, vc, torch.arange(x.shape[0]), "vec", k_scale=1.0, v_scale=0.5,
                               kv_cache_dtype="fp8")
sys.stdout.buffer.write(vc.permute(0, 2, 1, 3).reshape(-1).numpy().tobytes())
"""


def test_vllms_cpu_quantiser_gives_the_bytes_of_quantize_fp8():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 2, 32, generator=g) * torch.logspace(-4, 3, 128)[:, None, None]
    proc = subprocess.run([default_engine_python(), "-c", _KERNEL], input=x.numpy().tobytes(), capture_output=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    got = torch.frombuffer(bytearray(proc.stdout), dtype=torch.uint8).reshape(x.shape)
    assert torch.equal(quantize_fp8(x, 0.5, "truncate").view(torch.uint8), got)
    assert not torch.equal(quantize_fp8(x, 0.5, "nearest").view(torch.uint8), got)  # vLLM CPU truncates


def test_the_two_fp8_caches_agree_on_the_same_sequences(tokenizer, tmp_path):
    from transformers import DynamicCache

    from compactrl.policies.tiny_moe import tiny_moe

    model = tiny_moe("glm4_moe", vocab_size=len(tokenizer), seed=0)
    prompts = [list(range(5 + 7 * i, 40 + 9 * i)) for i in range(4)]
    with VLLMPolicy.from_model(model, tokenizer, tmp_path / "m", engine={"kv_cache_dtype": "fp8"}, seed=0) as pol:
        gens = pol.generate(prompts, 24, stop_token_ids=[])
        seqs = [p + g.token_ids for p, g in zip(prompts, gens)]
        vllm_fp8 = pol.score(seqs)
    width = max(map(len, seqs))
    tokens = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    ours = cached_log_probs(model, tokens, mask, Fp8KVCache(model.config))
    full = cached_log_probs(model, tokens, mask, DynamicCache(config=model.config))
    picked = [(i, t) for i, (p, s) in enumerate(zip(prompts, seqs)) for t in range(len(p), len(s))]
    v = torch.tensor([vllm_fp8[i][t - 1] for i, t in picked], dtype=torch.float64)
    o = torch.tensor([float(ours[i, t]) for i, t in picked], dtype=torch.float64)
    f = torch.tensor([float(full[i, t]) for i, t in picked], dtype=torch.float64)
    sampled = torch.tensor([x for g in gens for x in g.log_probs], dtype=torch.float64)
    print(f"fp8 transformers vs fp8 vLLM: max {(o - v).abs().max():.3g} mean {(o - v).abs().mean():.3g}; "  # noqa: T201
          f"fp8 vs float32: {(o - f).abs().max():.3g}")
    assert float((o - v).abs().max()) < AGREE_MAX and float((o - v).abs().mean()) < AGREE_MEAN
    assert float((o - f).abs().max()) > FP8_FROM_FULL and float((v - f).abs().max()) > FP8_FROM_FULL
    assert float((sampled - v).abs().max()) < 1e-5  # vLLM's scoring reproduces its own sampler
