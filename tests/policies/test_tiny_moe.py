import pytest
import torch
from policy_helpers import cached_tiny
from transformers import AutoModelForCausalLM

from compactrl.policies.tiny_moe import ARCHS, TinyMoEConfig, build_config, tiny_moe

CLASSES = {"glm4_moe": "Glm4MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
           "glm4_moe_lite": "Glm4MoeLiteForCausalLM", "glm_moe_dsa": "GlmMoeDsaForCausalLM"}


@pytest.mark.timeout(60)
def test_real_architecture_with_project_vocab(arch, tokenizer):
    model = cached_tiny(arch)
    assert type(model).__name__ == CLASSES[arch]
    assert model.config.model_type == arch
    assert model.config.vocab_size == len(tokenizer) == 4096
    assert model.config.max_position_embeddings >= 8192
    assert model.config._experts_implementation != "batched_mm"
    fused = [n for n, _ in model.named_parameters() if n.endswith("experts.gate_up_proj")]
    assert fused, "expected fused 3-D expert weights"
    assert sorted(model.generation_config.eos_token_id) == [0, 2]


@pytest.mark.timeout(60)
def test_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = tiny_moe("qwen3_moe", vocab_size=64, seed=7)
    after = torch.rand(3)
    b = tiny_moe("qwen3_moe", vocab_size=64, seed=7)
    c = tiny_moe("qwen3_moe", vocab_size=64, seed=8)
    assert torch.equal(before, after)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


@pytest.mark.timeout(60)
def test_save_load_round_trip(arch, tmp_path):
    model = cached_tiny(arch)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    s1, s2 = model.state_dict(), loaded.state_dict()
    assert s1.keys() == s2.keys()
    assert all(torch.equal(s1[k], s2[k]) for k in s1)
    ids = torch.randint(3, 4096, (2, 17))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)


@pytest.mark.parametrize(
    "field,value",
    [("arch", "llama"), ("num_experts", 0), ("experts_per_token", 9), ("max_position_embeddings", 4096),
     ("num_key_value_heads", 3), ("vocab_size", 2)],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TinyMoEConfig(**{field: value})


@pytest.mark.parametrize("arch", ARCHS)
def test_config_sizes(arch):
    cfg = build_config(TinyMoEConfig(arch=arch, vocab_size=100, num_layers=3, num_experts=6, experts_per_token=3))
    assert cfg.vocab_size == 100 and cfg.num_hidden_layers == 3 and cfg.num_experts_per_tok == 3
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    assert experts == 6


def test_one_layer_model_is_moe():
    """The last layer is always an MoE layer (vLLM refuses a glm4_moe checkpoint without one)."""
    for arch in ("glm4_moe", "glm4_moe_lite"):
        model = tiny_moe(arch, vocab_size=64, num_layers=1, hidden_size=32, num_experts=2, experts_per_token=1)
        assert any(n.endswith("experts.gate_up_proj") for n, _ in model.named_parameters()), arch


def test_dsa_index_head_dim_must_exceed_rope_dim():
    with pytest.raises(ValueError, match="index_head_dim"):
        TinyMoEConfig(arch="glm_moe_dsa", index_head_dim=64, qk_rope_head_dim=64)
