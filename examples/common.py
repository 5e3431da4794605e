"""What ``train_ppo.py`` and ``train_grpo.py`` share: the configuration both run at, the wrapped env,
the tiny policy, the SFT warm start and held-out evaluation.

Each training script imports this module (``python examples/train_ppo.py`` puts ``examples/`` on the
path) and keeps only its own algorithm: the loss, the advantages and the update loop.
``COMPACTRL_EXAMPLE_TINY=1`` shrinks everything to a seconds-long smoke run.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import gymnasium as gym
import torch

import compactrl  # noqa: F401  (registers CompactCode-v0)
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
ENV_KWARGS = dict(difficulty="tiny", tools=("view", "replace", "test", "submit"), max_turns=3 if TINY else 12)
CONTEXT = (ContextBudgetConfig(budget=640, reserve=16, tool_output_cap=64, max_compactions=4) if TINY  # smoke
           else ContextBudgetConfig(budget=860, reserve=64, tool_output_cap=192, max_compactions=4))  # the wrapper
NUM_ENVS = 2 if TINY else 16
MODEL = dict(hidden_size=32, num_layers=1, num_experts=2, experts_per_token=1) if TINY else dict(hidden_size=128)
DEMO_EPISODES, COPY_STEPS, SFT_STEPS, SFT_LR = (2, 2, 2, 3e-3) if TINY else (512, 200, 300, 3e-3)
SFT_BUDGET = 896                # phase 1 demonstrations: roomier, most fixes are written before a summary
SECOND_STEPS, SECOND_LR = (2, 1e-3) if TINY else (100, 1e-3)  # phase 2: reproduce-first demonstrations
SUMMARY_QUALITY = 0.5           # oracle summaries keep each fact with this probability
ITERATIONS = 2 if TINY else 10
EPISODES_PER_ITER = 2 if TINY else 32
EPOCHS, MICRO_BATCH_TOKENS = 2, 8192
LR = 1e-4
EVAL_EPISODES = 2 if TINY else 32
# ---------------------------------------------------------------------------------------------------

tokenizer = shared_tokenizer()
pad_id = tokenizer.pad_token_id or 0


def logger(name: str) -> logging.Logger:
    """The script's log (INFO lines on stderr)."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return logging.getLogger(name)


def make_env(split: str, budget: int | None = None):
    """A constructor of the wrapped env on ``split`` (``budget`` overrides the context budget)."""
    context = dataclasses.replace(CONTEXT, budget=budget or CONTEXT.budget)
    return lambda: gym.make("CompactCode-v0", split=split, context_budget=context, **ENV_KWARGS)


def make_policies() -> tuple[TransformersPolicy, TransformersPolicy]:
    """The trained policy (a tiny GLM-4-MoE-architecture model, seeded) and its greedy twin for evaluation."""
    torch.manual_seed(SEED)
    policy = TransformersPolicy(tiny_moe("glm4_moe", seed=SEED, **MODEL), tokenizer, temperature=1.0,
                                max_new_tokens=CONTEXT.reserve, seed=SEED)
    greedy = TransformersPolicy(policy.model, tokenizer, temperature=0.0, max_new_tokens=CONTEXT.reserve)
    return policy, greedy


def evaluate(greedy: TransformersPolicy) -> float:
    """Held-out success rate of ``greedy`` on ``EVAL_EPISODES`` test tasks (the same ones every time)."""
    col = TraceCollector([make_env("test")] * NUM_ENVS, greedy, episodes_per_batch=EVAL_EPISODES, seed=1234,
                         pad_id=pad_id, give_task_to_policy=False)
    col.next()
    col.shutdown()
    return summarize_episodes(col.last_episode_stats)["success_rate"]


def demonstrations(demonstrator, budget: int | None, seed: int):
    """``DEMO_EPISODES`` scripted episodes through the wrapper, as a trace batch (those that hit a limit dropped)."""
    col = TraceCollector([make_env("train", budget)] * NUM_ENVS, demonstrator, episodes_per_batch=DEMO_EPISODES,
                         seed=seed, pad_id=pad_id)
    batch = col.next()
    col.shutdown()
    return batch[~batch["truncated"]] if not bool(batch["truncated"].all()) else batch


def warm_start(policy: TransformersPolicy) -> None:
    """SFT on oracle demonstrations whose summaries drop facts, through the same wrapper as training."""
    demos = demonstrations(ReadingOrderOracle(SUMMARY_QUALITY, seed=SEED), None if TINY else SFT_BUDGET, SEED)
    copy_warmup(policy, demos, steps=COPY_STEPS, lr=SFT_LR)     # in-context copying, as a base model has it
    sft_train(policy, demos, steps=SFT_STEPS, lr=SFT_LR, batch_traces=16 if not TINY else 2)
    # phase 2, at the training budget: test first, then fix from the summary (which drops the fact half the time)
    second = ReadingOrderOracle(SUMMARY_QUALITY, seed=SEED + 1000, reproduce_first=True)
    demos = demonstrations(second, None, SEED + 1000)
    sft_train(policy, demos, steps=SECOND_STEPS, lr=SECOND_LR, batch_traces=16 if not TINY else 2)


def log_iteration(log: logging.Logger, i: int, stats: dict[str, float]) -> None:
    """One iteration's line: the batch's success, traces and summary tokens per episode."""
    log.info("iteration %d: train success %.3f, traces/episode %.2f, summary tokens/episode %.1f",
             i, stats["success_rate"], stats["traces_per_episode"], stats["summary_tokens_per_episode"])
