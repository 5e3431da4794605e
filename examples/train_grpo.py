"""GRPO (the baseline) on CompactCode-v0: one group-normalised outcome advantage per rollout.

A self-contained script in the style of TorchRL's examples: the configuration is at the top, the
loop reads top to bottom (collect groups -> group-relative advantages -> clipped policy epochs ->
evaluate). Every rollout of a task is reset with the same task seed (``group_size`` of them share
a ``group_id``) and every policy token of every trace gets its rollout's advantage: GRPO cannot
tell a good summary from a bad one, which is what ``examples/train_ppo.py`` addresses. The env, the
tiny policy, the SFT warm start and evaluation are those of ``examples/common.py``, shared with it.

Run::

    python examples/train_grpo.py                      # a few minutes on a CPU
    COMPACTRL_EXAMPLE_TINY=1 python examples/train_grpo.py   # seconds (smoke test)
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

from compactrl.algos.losses import GRPOConfig, GRPOLoss, add_loss_normalizers, grpo_advantage
from compactrl.algos.packing import micro_batches
from compactrl.collectors import TraceCollector

# -- configuration (the rest is in examples/common.py) ---------------------------------------------
GROUP_SIZE = 2 if TINY else 4   # rollouts per task
# ---------------------------------------------------------------------------------------------------

log = logger("train_grpo")
policy, greedy = make_policies()

# 1. SFT warm start on oracle demonstrations (imperfect summaries), through the same wrapper
warm_start(policy)
log.info("held-out success after SFT: %.3f", evaluate(greedy))

# 2. GRPO: no critic; the advantage is the group-normalised episode reward
loss_module = GRPOLoss(policy, GRPOConfig(clip_eps_low=0.2, clip_eps_high=0.2))
optim = torch.optim.AdamW(policy.parameters(), lr=LR)
collector = TraceCollector([make_env("train")] * NUM_ENVS, policy, episodes_per_batch=EPISODES_PER_ITER,
                           group_size=GROUP_SIZE, total_batches=ITERATIONS, seed=SEED + 1, pad_id=pad_id,
                           give_task_to_policy=False)

for i, batch in enumerate(collector):
    grpo_advantage(batch)                                    # same advantage on every token of a rollout
    add_loss_normalizers(batch)                              # per-token normalisation over the batch
    for _ in range(EPOCHS):
        optim.zero_grad()
        for mb in micro_batches(batch, MICRO_BATCH_TOKENS):
            loss_module.actor_loss(mb)["loss_objective"].backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optim.step()
    collector.update_policy_weights_()
    log_iteration(log, i, collector.last_batch_stats)

log.info("held-out success after GRPO: %.3f", evaluate(greedy))
collector.shutdown()
