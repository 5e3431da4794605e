"""The FP8 KV cache of the in-process sampler (compactrl.policies.fp8_cache): vLLM's scheme, its stored
bytes, generation with it, and its log-prob deviation from the full-precision cache, bounded."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from policy_helpers import cached_tiny, random_prompts, right_padded

from compactrl.policies.fp8_cache import (
    FP8_DTYPE,
    FP8_MAX,
    Fp8KVCache,
    cached_log_probs,
    dequantize_fp8,
    kv_cache_bytes,
    make_kv_cache,
    quantize_fp8,
)
from compactrl.policies.transformers_policy import TransformersPolicy

pytestmark = pytest.mark.timeout(60)

FP8_MAX_DLOGP = 0.25
FP8_MEAN_DLOGP = 0.03
"""Bounds on max and mean |delta log p| of the sampled tokens, fp8 cache vs float32 cache, tiny models as
initialised (fp32 weights). Measured (benchmarks/results/fp8_kv_bench.md, 16 prompts x 48 tokens): max
0.050 / 0.098, mean 0.008 / 0.010 for glm4_moe / qwen3_moe; here (8 prompts x 16 tokens) 0.059 / 0.060
and 0.008 / 0.010, the same with ATEN_CPU_CAPABILITY=avx2. The cache's arithmetic is plain float32 torch
plus bit operations, identical on every CPU; only the model's kernels differ between AVX2 and AVX-512
(~1e-6 in log-probs), far inside the 2.5x (max over the larger sample) / 3x (mean) margin."""
FP8_MIN_DLOGP = 1e-3
"""...and from below: the float32 cache reproduces the sampler to ~1e-6, so a deviation this large shows the
keys and values really went through fp8."""


def _e4m3_grid() -> torch.Tensor:
    """Every finite non-negative float8 e4m3 value, ascending."""
    values = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(FP8_DTYPE).float()
    return values[torch.isfinite(values) & (values >= 0)].unique()


@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=64),
       st.sampled_from([1.0, 0.25, 3.0]))
def test_truncation_rounds_toward_zero_onto_the_e4m3_grid_and_saturates(values, scale):
    x = torch.tensor(values, dtype=torch.float32)
    q = quantize_fp8(x, scale, "truncate")
    assert q.dtype == FP8_DTYPE
    y, target = q.float(), (x * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX)
    grid = _e4m3_grid()
    # the largest grid value not above |target|: toward zero, as vLLM's CPU kernel
    below = grid[torch.searchsorted(grid, target.abs(), right=True) - 1]
    torch.testing.assert_close(y.abs(), below, rtol=0, atol=0)
    assert bool(((y == 0) | (torch.sign(y) == torch.sign(target))).all())
    torch.testing.assert_close(dequantize_fp8(q, scale, torch.float32), y * scale, rtol=0, atol=0)


@given(st.lists(st.floats(-400, 400, allow_nan=False, width=32), min_size=1, max_size=64))
def test_nearest_is_torch_round_to_nearest_even_with_saturation(values):
    x = torch.tensor(values + [1e4, -1e4], dtype=torch.float32)
    q = quantize_fp8(x, 1.0, "nearest").float()
    torch.testing.assert_close(q[:-2], x[:-2].to(FP8_DTYPE).float(), rtol=0, atol=0)
    assert q[-2:].tolist() == [FP8_MAX, -FP8_MAX]


def test_bad_options_name_the_field():
    for kw, field in (({"rounding": "up"}, "rounding"), ({"k_scale": 0.0}, "k_scale"), ({"v_scale": -1.0}, "v_scale")):
        with pytest.raises(ValueError, match=field):
            Fp8KVCache(**kw)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        make_kv_cache("int8", None)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        TransformersPolicy(cached_tiny("glm4_moe"), None, kv_cache_dtype="fp16")


@pytest.mark.parametrize("arch", ["glm4_moe", "qwen3_moe"])
def test_stored_tensors_are_float8_and_take_a_quarter_of_float32(arch):
    from transformers import DynamicCache

    model = cached_tiny(arch)
    tokens = torch.arange(3, 3 + 40).reshape(2, 20)
    caches = {"fp8": Fp8KVCache(model.config), "fp32": DynamicCache(config=model.config)}
    with torch.no_grad():
        for cache in caches.values():
            model(input_ids=tokens, attention_mask=torch.ones_like(tokens), cache=cache, use_cache=True)
    layers = model.config.num_hidden_layers
    assert len(caches["fp8"].layers) == layers
    for layer in caches["fp8"].layers:
        assert layer.keys.dtype == FP8_DTYPE and layer.values.dtype == FP8_DTYPE
        assert layer.keys.shape == (2, model.config.num_key_value_heads, 20, model.config.head_dim)
    per_token = {k: kv_cache_bytes(c) for k, c in caches.items()}
    # 1 byte per element instead of 4, plus one float32 k_scale and v_scale per layer
    assert per_token["fp8"] == per_token["fp32"] // 4 + 8 * layers
    assert per_token["fp32"] == 2 * layers * model.config.num_key_value_heads * model.config.head_dim * 4 * 40


@pytest.mark.parametrize("arch", ["glm4_moe", "qwen3_moe"])
def test_batched_left_padded_generation_reproduces_teacher_forced_fp8_scores(arch, tokenizer):
    """Prompts of unequal length, left-padded in one batch, rows stopping at their own budgets (the cache
    drops finished rows): every sampled token's log-prob equals the teacher-forced score of the same
    sequence with a fresh fp8 cache (right-padded, one forward), so a static-scale cache is reproduced
    exactly by scoring; and batched greedy decoding equals decoding each prompt alone."""
    model = cached_tiny(arch)
    policy = TransformersPolicy(model, tokenizer, seed=0, kv_cache_dtype="fp8")
    prompts = random_prompts(6, lo=3, hi=40, seed=5)
    gens = policy.generate(prompts, [12, 3, 12, 7, 12, 1])
    assert [len(g.token_ids) <= n for g, n in zip(gens, [12, 3, 12, 7, 12, 1])] == [True] * 6
    seqs = [p + g.token_ids for p, g in zip(prompts, gens)]
    tokens, mask = right_padded(seqs)
    scored = cached_log_probs(model, tokens, mask, Fp8KVCache(model.config))
    diff = max((scored[i, len(p):len(s)] - torch.tensor(g.log_probs)).abs().max().item()
               for i, (p, s, g) in enumerate(zip(prompts, seqs, gens)))
    assert diff < 1e-4
    greedy = TransformersPolicy(model, tokenizer, temperature=0.0, kv_cache_dtype="fp8")
    assert [g.token_ids for g in greedy.generate(prompts, 8)] == \
        [greedy.generate([p], 8)[0].token_ids for p in prompts]


@pytest.mark.parametrize("arch", ["glm4_moe", "qwen3_moe"])
def test_fp8_log_prob_deviation_from_the_full_precision_cache_is_bounded(arch, tokenizer):
    from transformers import DynamicCache

    model = cached_tiny(arch)
    policy = TransformersPolicy(model, tokenizer, seed=1, kv_cache_dtype="fp8", stop_token_ids=[len(tokenizer) + 7])
    prompts = random_prompts(8, lo=16, hi=64, seed=2)
    gens = policy.generate(prompts, 16)
    seqs = [p + g.token_ids for p, g in zip(prompts, gens)]
    tokens, mask = right_padded(seqs)
    fp8 = cached_log_probs(model, tokens, mask, Fp8KVCache(model.config))
    full = cached_log_probs(model, tokens, mask, DynamicCache(config=model.config))
    with torch.no_grad():  # the learner's log_prob (no cache) is the full-precision side too
        learner, _ = policy.log_prob(tokens, mask)
    picked = torch.zeros_like(mask)
    for i, (p, s) in enumerate(zip(prompts, seqs)):
        picked[i, len(p):len(s)] = True
    d = (fp8 - full)[picked].abs()
    print(f"{arch}: fp8 vs float32 cache, max {d.max():.4g} mean {d.mean():.4g} over {d.numel()} sampled tokens")
    assert FP8_MIN_DLOGP < float(d.max()) < FP8_MAX_DLOGP and float(d.mean()) < FP8_MEAN_DLOGP
    assert float((full - learner)[picked].abs().max()) < 1e-4


def test_the_run_config_reaches_both_samplers(tokenizer, monkeypatch):
    """``rollout.kv_cache_dtype`` reaches the transformers sampler (build_policy: its generation runs on an
    Fp8KVCache; evaluation keeps the model's own cache) and the vLLM engine's settings."""
    from compactrl.policies import transformers_policy as TP
    from compactrl.training import rollouts as R
    from compactrl.training.config import override, preset

    cfg = override(preset("smoke"), {"rollout.kv_cache_dtype": "fp8"})
    policy, eval_policy = R.build_policy(cfg, tokenizer)
    assert policy.kv_cache_dtype == "fp8" and eval_policy.kv_cache_dtype == "auto"
    seen = []
    real = TP.generate_tokens

    def spy(*args, make_cache=None, **kwargs):
        seen.append(type(make_cache(policy.model.config)).__name__ if make_cache else "DynamicCache")
        return real(*args, make_cache=make_cache, **kwargs)

    monkeypatch.setattr(TP, "generate_tokens", spy)
    policy.generate([[5, 6, 7]], 2)
    eval_policy.generate([[5, 6, 7]], 2)
    assert seen == ["Fp8KVCache", "DynamicCache"]
    engine, _ = R.engine_settings(override(cfg, {"rollout.engine": "vllm"}), policy)
    assert engine["kv_cache_dtype"] == "fp8"
    assert R.engine_settings(preset("smoke"), policy)[0]["kv_cache_dtype"] == "auto"
    with pytest.raises(ValueError, match="rollout.kv_cache_dtype"):
        override(preset("smoke"), {"rollout.kv_cache_dtype": "fp8_e5m2"})
    # the run report says which sampler ran with which cache
    assert "FP8 KV cache" in R.report_lines(cfg, [])[0] and R.report_lines(preset("smoke"), []) == []
    vllm_line = R.report_lines(override(cfg, {"rollout.engine": "vllm"}), [{"engine/probe_max_abs_dlogp": 0.1}])[0]
    assert "fp8 KV cache" in vllm_line and "0.1" in vllm_line


def test_vllms_cpu_refusal_is_known_before_the_engine_starts():
    from compactrl.serving.vllm.client import VLLMEngineConfig, fp8_kv_refusal

    avx2 = frozenset({"avx", "avx2", "fma"})
    avx512 = avx2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
    fp8 = VLLMEngineConfig(model="m", kv_cache_dtype="fp8")
    message = fp8_kv_refusal(fp8, flags=avx2, cuda=False)
    assert "rollout.kv_cache_dtype" in message and "AVX-512 or AMX" in message and "avx512f absent" in message
    assert fp8_kv_refusal(fp8, flags=avx512, cuda=False) is None
    assert fp8_kv_refusal(fp8, flags=frozenset({"amx_tile"}), cuda=False) is None
    assert fp8_kv_refusal(fp8, flags=avx2, cuda=True) is None  # a GPU engine: vLLM's CUDA kernels decide
    assert fp8_kv_refusal(VLLMEngineConfig(model="m"), flags=avx2, cuda=False) is None


def test_the_in_process_fp8_sampler_measures_its_mismatch_every_batch(tokenizer):
    """With the fp8 cache the transformers sampler draws from other log-probs than the learner's (which
    scores without a cache), so its rollouts report ``mismatch/*`` as the engine's do: k3 and |delta log p|
    above zero; with the model's own cache only the routes are compared (one computation)."""
    from compactrl.training import rollouts as R
    from compactrl.training.config import override, preset

    for dtype in ("fp8", "auto"):
        cfg = override(preset("smoke"), {"rollout.kv_cache_dtype": dtype, "rl.episodes_per_iter": 2})
        policy, _ = R.build_policy(cfg, tokenizer)
        rollouts = R.make_rollouts(cfg, policy, pad_id=tokenizer.pad_token_id or 0)
        try:
            rollouts.next()
            m = rollouts.last_batch_metrics
        finally:
            rollouts.close()
        assert R.sampler_differs(cfg) == (dtype == "fp8")
        if dtype == "fp8":
            assert m["mismatch/tokens"] > 0 and m["mismatch/max_abs_dlogp"] > 0 and m["mismatch/k3"] >= 0
        else:
            assert "mismatch/k3" not in m and m["mismatch/route_disagree_all"] == 0.0
