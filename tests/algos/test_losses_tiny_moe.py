"""Critic PPO on the project's tiny MoE policy and critic: micro-batching keeps the gradient."""

from __future__ import annotations

import pytest
import torch
from algos_helpers import batch_with_values, random_episodes

from compactrl.algos.gae import trace_gae
from compactrl.algos.losses import CriticPPOConfig, CriticPPOLoss, add_loss_normalizers
from compactrl.algos.packing import micro_batches


@pytest.mark.timeout(120)
def test_tiny_moe_packed_micro_batches_give_the_full_batch_gradient():
    from compactrl.policies.critic import ValueModel
    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.policies.transformers_policy import TransformersPolicy
    from compactrl.tokenizer import load_tokenizer

    policy = TransformersPolicy(tiny_moe("glm4_moe", hidden_size=32, num_layers=1, seed=0), load_tokenizer())
    critic = ValueModel.from_policy(policy, head_init_std=0.1)
    batch = batch_with_values(random_episodes(4, n_episodes=3, max_traces=3), 0)
    with torch.no_grad():
        logp, _ = policy.log_prob(batch["tokens"], batch["attention_mask"])
        batch.set("sample_log_prob", torch.where(batch["policy_mask"], logp + 0.1, 0.0))
        batch.set("value", critic.value(batch["tokens"], batch["attention_mask"]))
    trace_gae(batch, gamma=1.0, lmbda=0.95)
    add_loss_normalizers(batch)
    loss = CriticPPOLoss(policy, critic, CriticPPOConfig(entropy_coef=0.01))
    grads = []
    for parts in ([batch], micro_batches(batch, 120)):
        loss.zero_grad(set_to_none=True)
        for part in parts:
            out = loss(part)
            sum(v for k, v in out.items() if k.startswith("loss_")).backward()
        grads.append([p.grad.clone() for p in loss.parameters() if p.grad is not None])
    assert len(micro_batches(batch, 120)) > 1 and grads[0]
    for full, split in zip(*grads):
        torch.testing.assert_close(split, full, rtol=1e-4, atol=1e-6)
