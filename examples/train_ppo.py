"""Critic PPO with token-level GAE over compacted rollouts on CompactCode-v0.

A self-contained script in the style of TorchRL's examples: the configuration is at the top, the
loop reads top to bottom (collect -> values -> GAE -> PPO epochs -> evaluate). It warm-starts a
tiny GLM-4-MoE-architecture model on oracle demonstrations whose summaries drop facts, then
trains it with PPO (``BOUNDARY``: GAE restarts at every trace, or runs across the compaction
boundaries). ``compactrl train`` runs the same algorithm with checkpoints, resume and
plots; this file shows the moving parts.

Run::

    python examples/train_ppo.py                      # a few minutes on a CPU
    COMPACTRL_EXAMPLE_TINY=1 python examples/train_ppo.py   # seconds (smoke test)
"""

from __future__ import annotations

import logging
import os

import gymnasium as gym
import torch

import compactrl  # noqa: F401  (registers CompactCode-v0)
from compactrl.algos.gae import trace_gae
from compactrl.algos.losses import CriticPPOConfig, CriticPPOLoss, add_loss_normalizers, whiten_advantages
from compactrl.algos.packing import micro_batches, pack_rows, row_lengths
from compactrl.algos.sft import ReadingOrderOracle, copy_warmup, sft_train
from compactrl.collectors import TraceCollector, summarize_episodes
from compactrl.policies.critic import ValueModel
from compactrl.policies.tiny_moe import tiny_moe
from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.tokenizer import load_tokenizer

TINY = os.environ.get("COMPACTRL_EXAMPLE_TINY") == "1"

# -- configuration ---------------------------------------------------------------------------------
SEED = 0
ENV_KWARGS = dict(difficulty="tiny", tools=("view", "replace", "test", "submit"), budget=860, reserve=64,
                  tool_output_cap=192, max_compactions=4, max_turns=12)
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
GAMMA, LMBDA = 1.0, 0.95
BOUNDARY = "cut"  # each trace ends with the rollout's reward; "bootstrap" runs GAE across traces
                  # through the critic, which pays off once the critic is trained (docs/training.md)
EVAL_EPISODES = 2 if TINY else 32
# ---------------------------------------------------------------------------------------------------

logging.basicConfig(level=logging.INFO, format="%(message)s")
log = logging.getLogger("train_ppo")
torch.manual_seed(SEED)
if TINY:  # the smoke run must fit a small context
    ENV_KWARGS.update(budget=640, reserve=16, tool_output_cap=64, max_turns=3)
tokenizer = load_tokenizer()
pad_id = tokenizer.pad_token_id or 0


def make_env(split: str, budget: int | None = None):
    kwargs = {**ENV_KWARGS, "budget": budget or ENV_KWARGS["budget"]}
    return lambda: gym.make("CompactCode-v0", split=split, **kwargs)


policy = TransformersPolicy(tiny_moe("glm4_moe", seed=SEED, **MODEL), tokenizer, temperature=1.0,
                            max_new_tokens=ENV_KWARGS["reserve"], seed=SEED)
greedy = TransformersPolicy(policy.model, tokenizer, temperature=0.0, max_new_tokens=ENV_KWARGS["reserve"])


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

# 2. PPO: a critic initialised from the policy, one loss module with both halves
critic = ValueModel.from_policy(policy)
loss_module = CriticPPOLoss(policy, critic, CriticPPOConfig(clip_eps_low=0.2, clip_eps_high=0.2))
optim = torch.optim.AdamW(policy.parameters(), lr=LR)
critic_optim = torch.optim.AdamW(critic.parameters(), lr=CRITIC_LR)
collector = TraceCollector([make_env("train")] * NUM_ENVS, policy, episodes_per_batch=EPISODES_PER_ITER,
                           total_batches=ITERATIONS, seed=SEED + 1, pad_id=pad_id, give_task_to_policy=False)

for i, batch in enumerate(collector):
    batch["value"] = torch.zeros(batch["tokens"].shape)
    with torch.no_grad():                                   # the critic's value at every token, packed
        for rows in pack_rows(row_lengths(batch["attention_mask"]), MICRO_BATCH_TOKENS):
            batch["value"][rows] = critic.value(batch["tokens"][rows], batch["attention_mask"][rows])
    trace_gae(batch, gamma=GAMMA, lmbda=LMBDA, boundary=BOUNDARY,   # token-level GAE over each trace;
              truncation="terminal")                           # a run cut at the turn limit ends at its reward
    whiten_advantages(batch)
    add_loss_normalizers(batch)                              # per-token normalisation over the batch
    for _ in range(EPOCHS):
        for opt, key in ((critic_optim, "loss_critic"), (optim, "loss_objective")):
            opt.zero_grad()
            for mb in micro_batches(batch, MICRO_BATCH_TOKENS):
                out = loss_module.critic_loss(mb) if key == "loss_critic" else loss_module.actor_loss(mb)
                out[key].backward()
            torch.nn.utils.clip_grad_norm_(critic.parameters() if key == "loss_critic" else policy.parameters(), 1.0)
            opt.step()
    collector.update_policy_weights_()
    stats = collector.last_batch_stats
    log.info("iteration %d: train success %.3f, traces/episode %.2f, summary tokens/episode %.1f",
             i, stats["success_rate"], stats["traces_per_episode"], stats["summary_tokens_per_episode"])

log.info("held-out success after PPO: %.3f", evaluate())
collector.shutdown()
