"""GRPO (the baseline) on CompactCode-v0: one group-normalised outcome advantage per rollout.

A self-contained script in the style of TorchRL's examples: the configuration is at the top, the
loop reads top to bottom (collect groups -> group-relative advantages -> clipped policy epochs ->
evaluate). Every rollout of a task is reset with the same task seed (``group_size`` of them share
a ``group_id``) and every policy token of every trace gets its rollout's advantage: GRPO cannot
tell a good summary from a bad one, which is what ``examples/train_ppo.py`` addresses.

Run::

    python examples/train_grpo.py                      # a few minutes on a CPU
    COMPACTRL_EXAMPLE_TINY=1 python examples/train_grpo.py   # seconds (smoke test)
"""

from __future__ import annotations

import dataclasses
import logging
import os

import gymnasium as gym
import torch

import compactrl  # noqa: F401  (registers CompactCode-v0)
from compactrl.algos.losses import GRPOConfig, GRPOLoss, add_loss_normalizers, grpo_advantage
from compactrl.algos.packing import micro_batches
from compactrl.collectors import TraceCollector, summarize_episodes
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
GROUP_SIZE = 2 if TINY else 4   # rollouts per task
EPOCHS, MICRO_BATCH_TOKENS = 2, 8192
LR = 1e-4
EVAL_EPISODES = 2 if TINY else 32
# ---------------------------------------------------------------------------------------------------

logging.basicConfig(level=logging.INFO, format="%(message)s")
log = logging.getLogger("train_grpo")
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
    stats = collector.last_batch_stats
    log.info("iteration %d: train success %.3f, traces/episode %.2f, summary tokens/episode %.1f",
             i, stats["success_rate"], stats["traces_per_episode"], stats["summary_tokens_per_episode"])

log.info("held-out success after GRPO: %.3f", evaluate())
collector.shutdown()
