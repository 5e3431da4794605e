import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file

from compactrl.policies.moe_weights import buckets, checkpoint_weights, fuse_experts, unfuse_experts
from compactrl.policies.tiny_moe import tiny_moe

# non-square experts (intermediate 48 != hidden 64) so a transposed split cannot pass by accident
SIZES = dict(vocab_size=128, hidden_size=64, moe_intermediate_size=48, intermediate_size=80, head_dim=16,
             num_experts=3, experts_per_token=2, num_layers=2)


@pytest.fixture(scope="module", params=["glm4_moe", "qwen3_moe", "mixtral"])
def model(request):
    return tiny_moe(request.param, **SIZES)


@pytest.mark.timeout(60)
def test_stream_equals_save_pretrained_checkpoint(model, tmp_path):
    model.save_pretrained(tmp_path)
    on_disk = load_file(tmp_path / "model.safetensors")
    streamed = dict(checkpoint_weights(model))
    assert streamed.keys() == on_disk.keys()
    for name, tensor in on_disk.items():
        assert torch.equal(streamed[name], tensor), name
    experts = [n for n in streamed if ".experts." in n]
    assert experts and all(".experts.gate_up_proj" not in n for n in experts)
    if model.config.model_type == "mixtral":
        assert any(n.endswith("block_sparse_moe.experts.2.w3.weight") for n in streamed)
        assert any(n.endswith("block_sparse_moe.gate.weight") for n in streamed)
    else:
        assert any(n.endswith("mlp.experts.2.up_proj.weight") for n in streamed)


@pytest.mark.timeout(60)
def test_fuse_inverts_unfuse(model):
    state = model.state_dict()
    back = fuse_experts(unfuse_experts(state, model.config.model_type), model.config.model_type)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)


@given(experts=st.integers(1, 5), inter=st.integers(1, 7), hidden=st.integers(1, 7),
       mixtral=st.booleans())
def test_round_trip_any_shape(experts, inter, hidden, mixtral):
    kind = "mixtral" if mixtral else "qwen3_moe"
    state = {
        "model.layers.0.mlp.experts.gate_up_proj": torch.randn(experts, 2 * inter, hidden),
        "model.layers.0.mlp.experts.down_proj": torch.randn(experts, hidden, inter),
        "model.layers.0.mlp.gate.weight": torch.randn(experts, hidden),
        "model.norm.weight": torch.randn(hidden),
    }
    named = list(unfuse_experts(state, kind))
    assert len(named) == 3 * experts + 2
    for name, t in named:
        if "experts." in name:
            assert t.shape in {(inter, hidden), (hidden, inter)}
    back = fuse_experts(named, kind)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)


def test_incomplete_experts_rejected():
    named = [("model.layers.0.mlp.experts.0.gate_proj.weight", torch.zeros(2, 2)),
             ("model.layers.0.mlp.experts.0.down_proj.weight", torch.zeros(2, 2))]
    with pytest.raises(ValueError, match="incomplete experts"):
        fuse_experts(named, "qwen3_moe")


@given(sizes=st.lists(st.integers(1, 50), max_size=30), cap=st.integers(4, 400))
def test_buckets_keep_order_and_cap(sizes, cap):
    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate(sizes)]  # float32: 4 bytes each
    groups = list(buckets(named, cap))
    assert [n for g in groups for n, _ in g] == [n for n, _ in named]
    for g in groups:
        assert len(g) == 1 or sum(t.numel() * 4 for _, t in g) <= cap
