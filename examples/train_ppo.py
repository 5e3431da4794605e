"""Critic PPO with token-level GAE over compacted rollouts on CompactCode-v0 (the reference recipe).

A self-contained script in the style of TorchRL's examples: the configuration is at the top, the
loop reads top to bottom (collect -> values -> GAE -> PPO epochs -> evaluate). It warm-starts a
tiny GLM-4-MoE-architecture model on oracle demonstrations whose summaries drop facts, then
trains it with PPO as ``compactrl train --preset compactionrl`` does: gamma 1, a length-adaptive
lambda ``1 - 1/(1.5 l)`` over each episode's policy tokens, value targets at lambda 1, GAE across
the compaction boundaries (``BOUNDARY``), a critic initialised from the SFT policy and pre-trained
alone on fresh rollouts before the first policy update, two critic steps per policy step.
``compactrl train`` runs the same algorithm with checkpoints, resume and plots; this file shows
the moving parts.

Run::

    python examples/train_ppo.py                      # a few minutes on a CPU
    COMPACTRL_EXAMPLE_TINY=1 python examples/train_ppo.py   # seconds (smoke test)
"""

from __future__ import annotations

import dataclasses
import logging
import os

import gymnasium as gym
import torch

import compactrl  # noqa: F401  (registers CompactCode-v0)
from compactrl.algos.gae import trace_gae
from compactrl.algos.losses import CriticPPOConfig, CriticPPOLoss, add_loss_normalizers, whiten_advantages
from compactrl.algos.packing import micro_batches, pack_rows, row_lengths
from compactrl.collectors import TraceCollector, summarize_episodes
from compactrl.policies.critic import ValueModel
from compactrl.policies.scripted.demonstrators import ReadingOrderOracle
from compactrl.policies.tiny_moe import tiny_moe
from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.tokenizer import shared_tokenizer
from compactrl.training.sft import copy_warmup, sft_train
from compactrl.wrappers import ContextBudgetConfig

TINY = os.environ.get("COMPACTRL_EXAMPLE_TINY") == "1"

# -- configuration ---------------------------------------------------------------------------------
SEED = 0
ENV_KWARGS = dict(difficulty="tiny", tools=("view", "replace", "test", "submit"), max_turns=12)
CONTEXT = ContextBudgetConfig(budget=860, reserve=64, tool_output_cap=192, max_compactions=4)  # the wrapper
NUM_ENVS = 2 if TINY else 16
MODEL = dict(hidden_size=32, num_layers=1, num_experts=2, experts_per_token=1) if TINY else dict(hidden_size=128)
DEMO_EPISODES, COPY_STEPS, SFT_STEPS, SFT_LR = (2, 2, 2, 3e-3) if TINY else (512, 200, 300, 3e-3)
SFT_BUDGET = 896                # phase 1 demonstrations: roomier, most fixes are written before a summary
SECOND_STEPS, SECOND_LR = (2, 1e-3) if TINY else (100, 1e-3)  # phase 2: reproduce-first demonstrations
SUMMARY_QUALITY = 0.5           # oracle summaries keep each fact with this probability
ITERATIONS = 2 if TINY else 10
EPISODES_PER_ITER = 2 if TINY else 32
EPOCHS, MICRO_BATCH_TOKENS = 2, 8192
LR, CRITIC_LR = 1e-4, 1e-3
GAMMA, LMBDA_ALPHA, VALUE_LMBDA = 1.0, 1.5, 1.0  # lambda = 1 - 1/(LMBDA_ALPHA * policy tokens of the episode)
BOUNDARY = "bootstrap"  # GAE runs across traces; "cut" ends each trace with the rollout's reward
CRITIC_PRETRAIN_BATCHES = 1 if TINY else 6  # critic-only batches before the first policy update
CRITIC_UPDATES = 2                          # critic steps per policy step
EVAL_EPISODES = 2 if TINY else 32
# ---------------------------------------------------------------------------------------------------

logging.basicConfig(level=logging.INFO, format="%(message)s")
log = logging.getLogger("train_ppo")
torch.manual_seed(SEED)
if TINY:  # the smoke run must fit a small context
    ENV_KWARGS.update(max_turns=3)
    CONTEXT = dataclasses.replace(CONTEXT, budget=640, reserve=16, tool_output_cap=64)
tokenizer = shared_tokenizer()
pad_id = tokenizer.pad_token_id or 0


def make_env(split: str, budget: int | None = None):
    context = dataclasses.replace(CONTEXT, budget=budget or CONTEXT.budget)
    return lambda: gym.make("CompactCode-v0", split=split, context_budget=context, **ENV_KWARGS)


policy = TransformersPolicy(tiny_moe("glm4_moe", seed=SEED, **MODEL), tokenizer, temperature=1.0,
                            max_new_tokens=CONTEXT.reserve, seed=SEED)
greedy = TransformersPolicy(policy.model, tokenizer, temperature=0.0, max_new_tokens=CONTEXT.reserve)


def evaluate() -> float:
    col = TraceCollector([make_env("test")] * NUM_ENVS, greedy, episodes_per_batch=EVAL_EPISODES, seed=1234,
                         pad_id=pad_id, give_task_to_policy=False)
    col.next()
    col.shutdown()
    return summarize_episodes(col.last_episode_stats)["success_rate"]


# 1. SFT warm start on oracle demonstrations (imperfect summaries), through the same wrapper
def demonstrations(demonstrator, budget: int | None, seed: int):
    col = TraceCollector([make_env("train", budget)] * NUM_ENVS, demonstrator, episodes_per_batch=DEMO_EPISODES,
                         seed=seed, pad_id=pad_id)
    batch = col.next()
    col.shutdown()
    return batch[~batch["truncated"]] if not bool(batch["truncated"].all()) else batch


demos = demonstrations(ReadingOrderOracle(SUMMARY_QUALITY, seed=SEED), None if TINY else SFT_BUDGET, SEED)
copy_warmup(policy, demos, steps=COPY_STEPS, lr=SFT_LR)     # in-context copying, as a base model has it
sft_train(policy, demos, steps=SFT_STEPS, lr=SFT_LR, batch_traces=16 if not TINY else 2)
# phase 2, at the training budget: test first, then fix from the summary (which drops the fact half the time)
demos = demonstrations(ReadingOrderOracle(SUMMARY_QUALITY, seed=SEED + 1000, reproduce_first=True), None, SEED + 1000)
sft_train(policy, demos, steps=SECOND_STEPS, lr=SECOND_LR, batch_traces=16 if not TINY else 2)
log.info("held-out success after SFT: %.3f", evaluate())

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
    stats = collector.last_batch_stats
    log.info("iteration %d: train success %.3f, traces/episode %.2f, summary tokens/episode %.1f",
             i, stats["success_rate"], stats["traces_per_episode"], stats["summary_tokens_per_episode"])

log.info("held-out success after PPO: %.3f", evaluate())
collector.shutdown()
