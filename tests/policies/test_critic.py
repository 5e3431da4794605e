import copy

import pytest
import torch
from policy_helpers import cached_tiny, random_prompts, right_padded

from compactrl.policies.critic import ValueModel
from compactrl.policies.transformers_policy import TransformersPolicy


@pytest.mark.timeout(60)
def test_values_shape_padding_and_causality(arch, tokenizer):
    policy = TransformersPolicy(copy.deepcopy(cached_tiny(arch)), tokenizer)
    critic = ValueModel.from_policy(policy, head_init_std=0.05)
    tokens, mask = right_padded(random_prompts(3, lo=6, hi=16, seed=3))
    v = critic.value(tokens, mask)
    assert v.shape == tokens.shape and v.dtype == torch.float32
    assert torch.all(v[:, 0] == 0) and torch.all(v[~mask] == 0)
    # V at t sees tokens[:t] only: changing token t leaves values up to t unchanged and moves t+1
    t = 4
    changed = tokens.clone()
    changed[:, t] = (changed[:, t] + 1) % 4096
    v2 = critic.value(changed, mask)
    assert torch.allclose(v[:, : t + 1], v2[:, : t + 1], atol=1e-5)
    assert not torch.allclose(v[:, t + 1], v2[:, t + 1])


@pytest.mark.timeout(60)
def test_copied_trunk_is_independent_and_starts_equal(tokenizer):
    policy = TransformersPolicy(copy.deepcopy(cached_tiny("glm4_moe")), tokenizer)
    critic = ValueModel.from_policy(policy)
    trunk_params = dict(critic.trunk.named_parameters())
    for name, p in policy.model.model.named_parameters():
        assert torch.equal(p, trunk_params[name]) and p.data_ptr() != trunk_params[name].data_ptr()
    assert torch.all(critic.head.weight == 0)  # zero head: V = 0 before training
    tokens, mask = right_padded(random_prompts(2, lo=5, hi=9, seed=4))
    critic.value(tokens, mask).sum().backward()
    assert critic.head.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in policy.model.parameters())


@pytest.mark.timeout(60)
def test_shared_trunk_only_adds_a_head(tokenizer):
    model = copy.deepcopy(cached_tiny("qwen3_moe"))
    policy = TransformersPolicy(model, tokenizer)
    critic = ValueModel.from_policy(policy, share_trunk=True, head_init_std=0.05)
    assert critic.trunk is model.model
    assert set(critic.state_dict()) == {"head.weight", "head.bias"}
    assert sum(p.numel() for p in critic.parameters()) == model.config.hidden_size + 1
    tokens, mask = right_padded(random_prompts(2, lo=5, hi=9, seed=5))
    v, aux = critic.value(tokens, mask, return_aux_loss=True)
    (v.sum() + aux).backward()
    assert model.model.embed_tokens.weight.grad is not None  # gradient reaches the shared trunk
    opt = torch.optim.SGD(list(policy.parameters()) + list(critic.parameters()), lr=0.1)
    opt.step()  # every weight once: no duplicate-parameter error


def test_bad_inputs_are_clear(tokenizer):
    critic = ValueModel.from_policy(cached_tiny("mixtral"), share_trunk=True)
    with pytest.raises(ValueError, match=r"\[N, L\]"):
        critic.value(torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="head_init_std"):
        ValueModel(cached_tiny("mixtral").model, 128, head_init_std=-1)


@pytest.mark.timeout(60)
def test_head_bias_is_the_value_everywhere_before_training(tokenizer):
    """``model.critic_head_init`` reaches the critic as its initial value at every real position."""
    critic = ValueModel.from_policy(cached_tiny("glm4_moe"), head_bias=0.3)
    tokens, mask = right_padded(random_prompts(3, lo=5, hi=12, seed=6))
    v = critic.value(tokens, mask)
    keep = mask.clone()
    keep[:, 0] = False
    torch.testing.assert_close(v[keep], torch.full_like(v[keep], 0.3))
    assert torch.all(v[~keep] == 0)
