"""Task knobs of the code generator: flaky test runs, per-fact progress rewards, the long_noisy preset.

The knobs are off by default and then leave every generated task byte for byte as before they
existed; switched on, they change how runs behave, never what the project holds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compactrl  # noqa: F401  (registers the env ids)
from compactrl.envs.code_env import CodeRepoEnv
from compactrl.tasksets.generators.code import PRESETS, CodeTaskConfig, CodeTaskGenerator
from compactrl.tools import ToolCall, format_call

pytestmark = pytest.mark.timeout(120)

# sha256 over Task.to_json() of seeds 0-11 of tiny, easy, default and hard, then seeds 0-2 of a
# custom config (num_facts=3), computed before the knobs existed.
DEFAULT_TASKS_DIGEST = "c7745c576b2eccd15a16fea567c751baaaec5b54510807f32566a08eaaec2ac5"
FLAKY = "test_scheduler_latency"


def test_default_presets_generate_the_same_tasks_as_before_the_knobs():
    digest = hashlib.sha256()
    for name in ("tiny", "easy", "default", "hard"):
        gen = CodeTaskGenerator(name)
        for seed in range(12):
            digest.update(gen.generate(seed).to_json().encode())
    custom = CodeTaskGenerator(CodeTaskConfig(name="custom", num_facts=3))
    for seed in range(3):
        digest.update(custom.generate(seed).to_json().encode())
    assert digest.hexdigest() == DEFAULT_TASKS_DIGEST


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**40))
def test_knobs_change_runs_not_the_project(seed):
    noisy = CodeTaskGenerator("long_noisy").generate(seed)
    plain_cfg = dataclasses.replace(PRESETS["long_noisy"], flaky_test_p=0.0, progress_reward=0.0)
    plain = CodeTaskGenerator(plain_cfg).generate(seed)
    assert noisy.files == plain.files and noisy.check == plain.check and noisy.instruction == plain.instruction
    assert "dynamics" not in plain.metadata
    dyn = noisy.metadata["dynamics"]
    assert dyn["flaky_test_p"] == 0.5 and dyn["progress_tests"] == [
        f"{noisy.metadata['spec_file']}::test_{f['function']}" for f in noisy.metadata["facts"]]
    assert all(t in noisy.check.must_pass for t in dyn["progress_tests"])


@pytest.mark.parametrize("field, value", [("flaky_test_p", -0.1), ("flaky_test_p", 1.0), ("progress_reward", -1.0)])
def test_knob_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        CodeTaskConfig(**{field: value})


def _env(**knobs) -> CodeRepoEnv:
    cfg = dataclasses.replace(PRESETS["tiny"], name="knobs", max_turns=40, **knobs)
    return CodeRepoEnv(difficulty=cfg, split="test")


def _fix(env: CodeRepoEnv) -> None:
    for fix in env.task.metadata["fix"]:
        env.step(format_call(ToolCall("replace", path=fix["file"], old=fix["old"], new=fix["new"])))


def test_flaky_runs_fail_at_the_configured_rate_whatever_the_work():
    env, flakes, runs = _env(flaky_test_p=0.3), 0, 0
    for seed in range(20):
        env.reset(seed=seed)
        if seed % 2:
            _fix(env)
        for _ in range(10):
            obs, *_ = env.step("<tool>test</tool>")
            runs, flakes = runs + 1, flakes + (FLAKY in obs)
    assert 0.2 * runs <= flakes <= 0.4 * runs  # binomial(200, 0.3): mean 60, sd 6.5
    plain = _env()
    plain.reset(seed=0)
    assert all(FLAKY not in plain.step("<tool>test</tool>")[0] for _ in range(20))


def test_flakes_are_reproducible_from_the_reset_seed():
    def pattern(seed):
        env = _env(flaky_test_p=0.5)
        env.reset(seed=seed)
        return [FLAKY in env.step("<tool>test</tool>")[0] for _ in range(16)]

    assert pattern(3) == pattern(3)
    assert any(pattern(s) != pattern(3) for s in range(4, 8))


def test_a_flaked_submit_is_not_accepted_and_the_agent_submits_again():
    env = _env(flaky_test_p=0.5)
    for seed in range(50):
        env.reset(seed=seed)
        _fix(env)
        obs, reward, terminated, truncated, info = env.step("<tool>submit</tool>")
        if FLAKY in obs:
            break
    else:
        pytest.fail("no flaked submit in 50 episodes at p=0.5")
    assert not terminated and not truncated and reward == 0.0 and "not accepted" in obs
    while not terminated:
        obs, reward, terminated, truncated, info = env.step("<tool>submit</tool>")
    assert reward == 1.0 and info["success"] and not truncated


def test_grading_at_the_limit_is_a_run_that_can_flake():
    env = _env(flaky_test_p=0.999)
    env.max_turns = 3
    env.reset(seed=0)
    _fix(env)
    truncated = False
    while not truncated:
        obs, reward, terminated, truncated, info = env.step("<tool>view README.md</tool>")
    assert env._turn == 3 and truncated and not terminated and reward == 0.0 and not info["success"]


def test_progress_reward_is_paid_once_per_fact_at_the_run_that_shows_it():
    env = _env(progress_reward=0.25)
    env.reset(seed=1)
    assert env.step("<tool>test</tool>")[1] == 0.0  # the stale constant: the spec test fails
    _fix(env)
    assert env.step("<tool>test</tool>")[1] == 0.25
    assert env.step("<tool>test</tool>")[1] == 0.0
    assert env.step("<tool>submit</tool>")[1] == 1.0


def test_long_noisy_flakes_lengthen_the_oracles_chains_at_the_training_budget():
    """The preset's claim: on the same task seeds at the main job's budget, the flaked submits the
    oracle must repeat give it longer chains than on ``tiny``, and the flakes alone cost episodes."""
    from compactrl.collectors.trace_collector import TraceCollector
    from compactrl.policies.scripted.code import OraclePolicy

    def stats(difficulty: str, max_turns: int):
        def make():
            return gym.make("CompactCode-v0", difficulty=difficulty, split="test", max_turns=max_turns, budget=860,
                            reserve=64, tool_output_cap=192, max_compactions=6, tools=("view", "replace", "test", "submit"))

        collector = TraceCollector([make, make], OraclePolicy(summary_quality=1.0), episodes_per_batch=32, seed=5,
                                   give_task_to_policy=True)
        try:
            collector.next()
            return collector.last_episode_stats
        finally:
            collector.shutdown()

    plain, noisy = stats("tiny", 10), stats("long_noisy", 10)
    assert statistics.mean(s.num_traces for s in noisy) > statistics.mean(s.num_traces for s in plain) + 0.2
    assert all(s.success for s in plain)  # the oracle with perfect summaries: only flakes can fail it
    short = stats("long_noisy", 4)  # too few turns to repeat every flaked submit
    assert sum(s.success for s in short) < len(short)


def test_progress_reward_sits_on_the_last_token_of_the_response_that_earned_it():
    cfg = dataclasses.replace(PRESETS["tiny"], name="knobs", max_turns=40, progress_reward=0.25)
    env = gym.make("CompactCode-v0", difficulty=cfg, split="test", budget=4096, max_compactions=0)
    env.reset(seed=1)
    task = env.unwrapped.task
    fix = task.metadata["fix"][0]
    env.step(format_call(ToolCall("replace", path=fix["file"], old=fix["old"], new=fix["new"])))
    env.step("<tool>test</tool>")
    *_, info = env.step("<tool>submit</tool>")
    trace = info["trace"]
    trace.validate()  # rewards only on policy tokens
    mask = [*trace.policy_mask, False]
    ends = [i for i in range(len(trace.token_ids)) if mask[i] and not mask[i + 1]]  # each response's last token
    assert sorted(trace.rewards.items()) == [(ends[0], 0.0), (ends[1], 0.25), (ends[2], 1.0)]
