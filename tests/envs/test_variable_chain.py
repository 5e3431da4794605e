"""The ``variable_chain`` preset: trace counts that vary between episodes of one task by the agent's choices."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from compactrl.envs.code_env import CodeRepoEnv
from compactrl.eval.episodes import evaluate_policy
from compactrl.policies.scripted.demonstrators import ReadingOrderOracle, reading_order, shuffled_order
from compactrl.tasksets.generators.code import PRESETS, CodeTaskConfig, CodeTaskGenerator


def _env_fns(count: int):
    import gymnasium as gym

    import compactrl  # noqa: F401  (registers the ids)
    from compactrl.wrappers.context_budget import ContextBudgetConfig

    wrapper = ContextBudgetConfig(budget=1024, reserve=96, tool_output_cap=192, max_compactions=6)
    return [lambda: gym.make("CompactCode-v0", task_preset="variable_chain", split="test", max_turns=16,
                             context_budget=wrapper) for _ in range(count)]


def test_the_knob_is_recorded_only_when_set_and_validated():
    task = CodeTaskGenerator("variable_chain").generate(4)
    assert task.metadata["config"]["demo_order"] == "shuffled" and task.id.startswith("code-variable_chain-")
    for name in ("tiny", "easy", "default", "hard", "long_noisy"):  # the other presets' tasks are as before
        assert "demo_order" not in CodeTaskGenerator(name).generate(4).metadata["config"]
    with pytest.raises(ValueError, match="demo_order"):
        CodeTaskConfig(demo_order="random")
    # the knob changes what a demonstrator does, never what the project holds
    fixed = dataclasses.replace(PRESETS["variable_chain"], demo_order="fixed")
    assert CodeTaskGenerator(fixed).generate(4).files == task.files


def test_task_preset_takes_the_place_of_difficulty():
    env = CodeRepoEnv(difficulty="tiny", task_preset="variable_chain", split="test")
    env.reset(seed=0)
    assert env.unwrapped.task.id.startswith("code-variable_chain-")
    env.close()


def test_shuffled_order_is_a_permutation_that_depends_on_the_seed():
    task = CodeTaskGenerator("variable_chain").generate(7)
    files, bug = sorted(task.files), task.metadata["bug_file"]
    orders = {tuple(shuffled_order(files, bug, seed, task.id)) for seed in range(8)}
    assert all(sorted(o) == sorted(reading_order(files, bug)) for o in orders) and len(orders) > 1
    facts = {f["location"] for s in range(60) for f in CodeTaskGenerator("variable_chain").generate(s).metadata["facts"]}
    assert facts == {"config", "doc", "docstring"}  # no fixed reading order finds the fact first


@pytest.mark.timeout(300)
def test_the_demonstrator_solves_it_and_chains_vary_within_a_task():
    """Perfect summaries: the shuffled demonstrator solves (almost) every task, and one task's
    episodes under different demonstrator seeds (reading orders) have different trace counts."""
    per_task: dict[int, list[int]] = {}
    successes = []
    for seed in range(3):
        _, stats = evaluate_policy(_env_fns(4), ReadingOrderOracle(summary_quality=1.0, seed=seed, reproduce_first=True),
                                   episodes=12, seed=5, give_task_to_policy=True)
        for s in stats:
            per_task.setdefault(s.task_seed, []).append(s.num_traces)
            successes.append(s.success)
    assert sum(successes) / len(successes) >= 0.85
    assert statistics.mean(statistics.pstdev(v) for v in per_task.values()) > 0.5
    assert sum(len(set(v)) > 1 for v in per_task.values()) >= len(per_task) // 2
    assert max(max(v) for v in per_task.values()) - min(min(v) for v in per_task.values()) >= 3
