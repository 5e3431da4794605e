"""CompactTerminal-v0: Gymnasium's checker, robustness, and the measurements that show compaction
matters here (oracle with perfect summaries >= 99% on held-out tasks and compacting; with useless
summaries <= 20%)."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import compactrl  # noqa: F401  (registers the ids)
from compactrl.eval import evaluate
from compactrl.policies.scripted.code import OraclePolicy, RandomPolicy
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.policies.scripted.terminal import TerminalOraclePolicy

pytestmark = pytest.mark.timeout(300)

HELD_OUT = {"split": "test"}


def test_check_env_bare_and_registered() -> None:
    from compactrl.envs.terminal_env import TerminalEnv

    check_env(TerminalEnv(), skip_render_check=True)
    env = gym.make("CompactTerminal-v0")
    check_env(env.unwrapped, skip_render_check=True)
    check_env(env, skip_render_check=True)
    env.close()


def test_registered_env_is_context_budgeted_terminal_env() -> None:
    from compactrl.envs.terminal_env import TerminalEnv
    from compactrl.wrappers import ContextBudget

    env = gym.make("CompactTerminal-v0", budget=3000, difficulty="easy")
    assert isinstance(env.unwrapped, TerminalEnv)
    wrapper = env
    while not isinstance(wrapper, ContextBudget):
        wrapper = wrapper.env
    assert wrapper.config.budget == 3000
    assert isinstance(gym.make("CompactTerminal-v0", context_budget=None).unwrapped, TerminalEnv)


def test_oracle_with_perfect_summaries_succeeds_and_compacts() -> None:
    res, _ = evaluate("CompactTerminal-v0", OraclePolicy(summary_quality=1.0), episodes=150, seed=0, env_kwargs=HELD_OUT)
    assert res["success_rate"] >= 0.99, res
    assert res["compactions_per_episode"] >= 1.0, res
    assert res["truncated_rate"] == 0.0, res


def test_oracle_with_useless_summaries_mostly_fails() -> None:
    res, _ = evaluate("CompactTerminal-v0", OraclePolicy(summary_quality=0.0), episodes=150, seed=0, env_kwargs=HELD_OUT)
    assert res["success_rate"] <= 0.20, res


def test_terminal_oracle_directly_solves_every_difficulty_without_budget() -> None:
    for difficulty in ("easy", "default", "hard"):
        res, _ = evaluate("CompactTerminal-v0", TerminalOraclePolicy(), episodes=20, seed=0,
                       env_kwargs={"difficulty": difficulty, "context_budget": None, **HELD_OUT})
        assert res["success_rate"] == 1.0, (difficulty, res)


def test_gold_succeeds_and_noop_fails_on_sim() -> None:
    kwargs = {"context_budget": None, **HELD_OUT}
    assert evaluate("CompactTerminal-v0", GoldPolicy(), episodes=30, env_kwargs=kwargs)[0]["success_rate"] == 1.0
    assert evaluate("CompactTerminal-v0", NoopPolicy(), episodes=30, env_kwargs=kwargs)[0]["success_rate"] == 0.0


def test_random_policy_runs_without_errors() -> None:
    res, _ = evaluate("CompactTerminal-v0", RandomPolicy(seed=1), episodes=10, seed=0, env_kwargs={"max_turns": 30})
    assert res["episodes"] == 10 and res["success_rate"] == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=200) | st.builds(lambda c: f"<tool>shell {c}</tool>", st.text(max_size=60)),
                min_size=1, max_size=6))
def test_any_unicode_action_is_an_observation(actions: list[str]) -> None:
    from compactrl.envs.terminal_env import TerminalEnv

    env = TerminalEnv(difficulty="easy")
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs) and reward in (0.0, 1.0)
        if terminated or truncated:
            break
    env.close()


def test_seeded_reset_reproduces_task_and_observation() -> None:
    a, b = gym.make("CompactTerminal-v0"), gym.make("CompactTerminal-v0")
    oa, _ = a.reset(seed=7)
    ob, _ = b.reset(seed=7)
    assert oa == ob and a.unwrapped.task == b.unwrapped.task


def test_shell_tool_runs_the_emulator_on_sim() -> None:
    from compactrl.envs.terminal_env import TerminalEnv

    env = TerminalEnv(difficulty="easy")
    env.reset(seed=3)
    obs, *_ = env.step("<tool>shell ls | wc -l</tool>")
    top = {p.split("/", 1)[0] for p in env.unwrapped.task.files}
    assert obs == f"{len(top)}\n[exit code 0]"
    obs, *_ = env.step("<tool>shell cat .compactrl_check.py</tool>")
    assert "No such file" in obs  # the checker stays hidden
