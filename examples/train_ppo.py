"""Critic PPO with token-level GAE over compacted rollouts on CompactCode-v0 (the reference recipe).

A self-contained script in the style of TorchRL's examples: the configuration is at the top, the
loop reads top to bottom (collect -> values -> GAE -> PPO epochs -> evaluate). It warm-starts a
tiny GLM-4-MoE-architecture model on oracle demonstrations whose summaries drop facts, then
trains it with PPO as ``compactrl train --preset compactionrl`` does: gamma 1, a length-adaptive
lambda ``1 - 1/(1.5 l)`` over each episode's policy tokens, value targets at lambda 1, GAE across
the compaction boundaries (``BOUNDARY``), a critic initialised from the SFT policy and pre-trained
alone on fresh rollouts before the first policy update, two critic steps per policy step.
``compactrl train`` runs the same algorithm with checkpoints, resume and plots; this file shows
the moving parts. The env, the tiny policy, the SFT warm start and evaluation are those of
``examples/common.py``, shared with ``examples/train_grpo.py``.

Run::

    python examples/train_ppo.py                      # a few minutes on a CPU
    COMPACTRL_EXAMPLE_TINY=1 python examples/train_ppo.py   # seconds (smoke test)
"""

from __future__ import annotations

import torch
from common import (
    EPISODES_PER_ITER,
    EPOCHS,
    ITERATIONS,
    LR,
    MICRO_BATCH_TOKENS,
    NUM_ENVS,
    SEED,
    TINY,
    evaluate,
    log_iteration,
    logger,
    make_env,
    make_policies,
    pad_id,
    warm_start,
)

from compactrl.algos.gae import trace_gae
from compactrl.algos.losses import CriticPPOConfig, CriticPPOLoss, add_loss_normalizers, whiten_advantages
from compactrl.algos.packing import micro_batches, pack_rows, row_lengths
from compactrl.collectors import TraceCollector
from compactrl.policies.critic import ValueModel

# -- configuration (the rest is in examples/common.py) ---------------------------------------------
CRITIC_LR = 1e-3
GAMMA, LMBDA_ALPHA, VALUE_LMBDA = 1.0, 1.5, 1.0  # lambda = 1 - 1/(LMBDA_ALPHA * policy tokens of the episode)
BOUNDARY = "bootstrap"  # GAE runs across traces; "cut" ends each trace with the rollout's reward
CRITIC_PRETRAIN_BATCHES = 1 if TINY else 6  # critic-only batches before the first policy update
CRITIC_UPDATES = 2                          # critic steps per policy step
# ---------------------------------------------------------------------------------------------------

log = logger("train_ppo")
policy, greedy = make_policies()

# 1. SFT warm start on oracle demonstrations (imperfect summaries), through the same wrapper
warm_start(policy)
log.info("held-out success after SFT: %.3f", evaluate(greedy))

# 2. PPO: a critic initialised from the SFT policy, one loss module with both halves
critic = ValueModel.from_policy(policy)
loss_module = CriticPPOLoss(policy, critic, CriticPPOConfig(clip_eps_low=0.2, clip_eps_high=0.2))
optim = torch.optim.AdamW(policy.parameters(), lr=LR)
critic_optim = torch.optim.AdamW(critic.parameters(), lr=CRITIC_LR)
collector = TraceCollector([make_env("train")] * NUM_ENVS, policy, episodes_per_batch=EPISODES_PER_ITER,
                           total_batches=CRITIC_PRETRAIN_BATCHES + ITERATIONS, seed=SEED + 1, pad_id=pad_id,
                           give_task_to_policy=False)


def advantages(batch):
    batch["value"] = torch.zeros(batch["tokens"].shape)
    with torch.no_grad():                                   # the critic's value at every token, packed
        for rows in pack_rows(row_lengths(batch["attention_mask"]), MICRO_BATCH_TOKENS):
            batch["value"][rows] = critic.value(batch["tokens"][rows], batch["attention_mask"][rows])
    trace_gae(batch, gamma=GAMMA, length_adaptive_alpha=LMBDA_ALPHA, value_lmbda=VALUE_LMBDA,  # token-level GAE
              boundary=BOUNDARY, truncation="terminal")     # a run cut at the turn limit ends at its reward
    whiten_advantages(batch)
    return add_loss_normalizers(batch)                      # per-token normalisation over the batch


def step(opt, loss_fn, key, params, batch):
    opt.zero_grad()
    for mb in micro_batches(batch, MICRO_BATCH_TOKENS):     # gradients accumulate over micro-batches
        loss_fn(mb)[key].backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


for i, batch in enumerate(collector):
    batch = advantages(batch)
    for _ in range(EPOCHS):
        for _ in range(CRITIC_UPDATES):
            step(critic_optim, loss_module.critic_loss, "loss_critic", critic.parameters(), batch)
        if i >= CRITIC_PRETRAIN_BATCHES:                    # the critic trains alone on the first batches
            step(optim, loss_module.actor_loss, "loss_objective", policy.parameters(), batch)
    collector.update_policy_weights_()
    log_iteration(log, i, collector.last_batch_stats)

log.info("held-out success after PPO: %.3f", evaluate(greedy))
collector.shutdown()
