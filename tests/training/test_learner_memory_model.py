"""benchmarks/learner_memory_model.py: parameter counts equal real models', per-GPU state scales as 1/N."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learner_memory_model as lmm  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _numel(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _model(arch: str, **overrides):
    """A tiny model of the project (compactrl/policies/tiny_moe.py), config fields overridden."""
    from transformers import AutoModelForCausalLM

    from compactrl.policies.tiny_moe import TinyMoEConfig, build_config

    config = build_config(TinyMoEConfig(arch=arch, vocab_size=300, hidden_size=64, num_layers=3, num_experts=4,
                                        moe_intermediate_size=48, intermediate_size=96, first_k_dense=1))
    for key, value in overrides.items():
        setattr(config, key, value)
    return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("arch,overrides", [
    ("glm4_moe", {}),
    ("glm4_moe", {"attention_bias": True, "use_qk_norm": True}),  # GLM-4.5-Air has q/k/v biases
    ("glm4_moe", {"tie_word_embeddings": True}),
    ("glm4_moe_lite", {}),
    ("glm4_moe_lite", {"q_lora_rank": None}),  # a full-rank query projection
    ("glm4_moe_lite", {"attention_bias": True}),
])
def test_parameter_count_equals_the_real_model(arch, overrides):
    model = _model(arch, **overrides)
    counts = lmm.param_counts(lmm.arch_from_config(model.config.to_dict()))
    assert counts["total"] == _numel(model)
    experts = sum(p.numel() for name, p in model.named_parameters() if name.endswith(("experts.gate_up_proj",
                                                                                       "experts.down_proj")))
    assert counts["routed_experts"] == experts


def test_critic_count_equals_the_value_model():
    from compactrl.policies.critic import ValueModel

    for arch in ("glm4_moe", "glm4_moe_lite"):
        model = _model(arch)
        critic = ValueModel.from_policy(model)
        assert lmm.critic_params(lmm.arch_from_config(model.config.to_dict()))["total"] == _numel(critic)


def test_the_glm_checkpoints_land_near_their_published_totals():
    for arch in lmm.MODELS:
        counts = lmm.param_counts(arch)
        assert abs(counts["total"] - arch.published_total) / arch.published_total < 0.02, arch.name
        assert counts["total"] < counts["checkpoint_total"] < 1.03 * counts["total"]  # one MTP layer
        assert arch.published_active < counts["active_without_embedding"] < 1.2 * arch.published_active
    assert lmm.param_counts(lmm.GLM_4_7_FLASH)["routed_experts"] == 46 * 64 * 3 * 2048 * 1536


def test_state_scales_as_one_over_n_and_buffers_do_not():
    arch = lmm.GLM_4_5_AIR
    parts = lmm.param_counts(arch)
    one = lmm.state_bytes(parts, lmm.Layout(gpus=1))
    assert one["params"] + one["grads"] + one["optimizer"] == 16 * parts["total"]
    for n in (2, 8, 16, 64):
        sharded = lmm.state_bytes(parts, lmm.Layout(gpus=n))
        for key in ("params", "grads", "optimizer"):
            assert sharded[key] * n == pytest.approx(one[key])
        assert lmm.fsdp_buffer_bytes(arch, 0, lmm.Layout(gpus=n)) == lmm.fsdp_buffer_bytes(arch, 0, lmm.Layout(gpus=1))
    small, big = (lmm.per_gpu(arch, lmm.Layout(gpus=n), checkpointing=True, chunk=4096) for n in (8, 64))
    assert small["activations"] == big["activations"]  # tokens per GPU are fixed: activations do not shrink
    assert small["params"] == pytest.approx(8 * big["params"])


def test_expert_parallelism_shards_experts_over_ep_and_shrinks_the_gathered_layer():
    arch = lmm.GLM_4_5_AIR
    parts = lmm.param_counts(arch)
    fsdp = lmm.state_bytes(parts, lmm.Layout(gpus=64))
    with_fsdp = lmm.state_bytes(parts, lmm.Layout(gpus=64, ep=8))
    assert with_fsdp["params"] == pytest.approx(fsdp["params"])  # (dp_shard, ep) still splits everything / N
    ep_only = lmm.state_bytes(parts, lmm.Layout(gpus=64, ep=8, expert_fsdp=False))
    experts, others = parts["routed_experts"], parts["total"] - parts["routed_experts"]
    assert ep_only["params"] == pytest.approx(4 * (experts / 8 + others / 64))
    gathered_ep = lmm.fsdp_buffer_bytes(arch, 0, lmm.Layout(gpus=64, ep=8))
    assert gathered_ep < lmm.fsdp_buffer_bytes(arch, 0, lmm.Layout(gpus=64)) / 4
    with pytest.raises(ValueError):
        lmm.Layout(gpus=12, ep=8)


def test_checkpointing_and_chunking_cut_activations():
    for arch in lmm.MODELS:
        full = lmm.activation_bytes(arch, 65536, checkpointing=False)
        lean = lmm.activation_bytes(arch, 65536, checkpointing=True, chunk=4096)
        assert lean["layers"] < full["layers"] / 5
        assert full["head"] == 65536 * arch.vocab_size * 10
        assert lean["head"] == pytest.approx(full["head"] / 16, rel=0.01)
        assert lmm.activation_bytes(arch, 65536, checkpointing=True, chunk=65536)["head"] == full["head"]


def test_the_report_prints_every_model_and_gpu_count(capsys):
    assert lmm.main([]) == 0
    out = capsys.readouterr().out
    for arch in lmm.MODELS:
        # the counts, the activations, 3 FSDP rows, 3 EP rows (8, 16 and 64 are multiples of ep 8)
        assert out.count(f"| {arch.name} |") == 1 + 1 + 3 + 3
    assert lmm.main(["--json", "--gpus", "8"]) == 0


def test_the_committed_figures_are_the_scripts():
    root = Path(__file__).resolve().parents[2]
    rows = [r for r in lmm.memory_table((8, 16, 64), 65536, 4096).splitlines() if r.startswith("| GLM")]
    docs = (root / "docs" / "distributed.md").read_text()
    assert rows and all(r in docs for r in rows)
    assert lmm.report() in (root / "benchmarks" / "results" / "learner_memory_model.md").read_text()


@pytest.mark.parametrize("arch", ["glm4_moe", "glm4_moe_lite"])
def test_activation_formula_matches_what_the_layers_save(arch):
    """The per-token, per-layer elements of the model against the tensors a real bf16 layer saves for its
    backward (saved_tensors_hooks; parameters and the shared rotary tables left out)."""
    import torch
    from transformers import AutoModelForCausalLM

    from compactrl.policies.tiny_moe import TinyMoEConfig, build_config

    config = build_config(TinyMoEConfig(
        arch=arch, vocab_size=300, hidden_size=256, num_layers=2, num_experts=8, experts_per_token=2,
        moe_intermediate_size=128, intermediate_size=512, first_k_dense=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, kv_lora_rank=128, q_lora_rank=96, qk_rope_head_dim=32,
        qk_nope_head_dim=32, v_head_dim=64))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa",
                                             experts_implementation="grouped_mm")
    shape = lmm.arch_from_config(config.to_dict())
    tokens = 512
    ids = torch.randint(0, 300, (1, tokens), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(tokens)[None]
    for index, layer in enumerate(model.model.layers):
        weights = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        saved: dict[int, int] = {}

        def pack(t, saved=saved, weights=weights):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in weights:
                saved[ptr] = max(saved.get(ptr, 0), t.untyped_storage().nbytes())
            return t

        hidden = model.model.embed_tokens(ids).detach().requires_grad_(True)
        rotary = model.model.rotary_emb(hidden, positions)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=rotary)
        predicted = lmm.layer_saved_elements(shape, moe=index >= shape.dense_layers) * 2 * tokens
        assert sum(saved.values()) == pytest.approx(predicted, rel=0.05), (arch, index)
