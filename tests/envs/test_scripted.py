"""Scripted policies: the oracle solves every task; lossy summaries make it fail; random never breaks the env."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.envs.code_env import CodeRepoEnv
from compactrl.policies.scripted.code import (
    OraclePolicy,
    RandomPolicy,
    SummaryState,
    format_summary,
    parse_summary,
)
from compactrl.types import PolicyRequest

pytestmark = pytest.mark.timeout(240)
ENVS = {d: CodeRepoEnv(difficulty=d) for d in ("easy", "default", "hard")}


def play(env, policy, seed, *, budget_chars=None, max_steps=500):
    """One episode; with ``budget_chars``, compact like the context-budget wrapper does."""
    obs, info = env.reset(seed=seed)
    prefix = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": obs}]
    messages, compactions, chars_read = list(prefix), 0, len(obs)
    for _ in range(max_steps):
        action = policy.act([PolicyRequest(messages=list(messages), task=env.task)])[0]
        obs, reward, terminated, truncated, info = env.step(action)
        chars_read += len(obs)
        if terminated or truncated:
            return reward, compactions, info
        messages.append({"role": "assistant", "content": action})
        if budget_chars and sum(len(m["content"]) for m in messages) + len(obs) > budget_chars:
            ask = messages + [{"role": "user", "content": "Summarise."}]
            summary = policy.act([PolicyRequest(messages=ask, compaction_required=True, task=env.task)])[0]
            messages = prefix + [{"role": "user", "content": "Summary of your earlier work:\n" + summary},
                                 {"role": "tool", "content": obs}]
            compactions += 1
        else:
            messages.append({"role": "tool", "content": obs})
    raise AssertionError("episode did not end")


@settings(max_examples=25)
@given(st.sampled_from(sorted(ENVS)), st.integers(0, 2**31))
def test_oracle_solves_every_task(difficulty, seed):
    reward, _, info = play(ENVS[difficulty], OraclePolicy(), seed)
    assert reward == 1.0 and info["success"] and info["format_errors"] == 0 and info["tool_errors"] == 0


@settings(max_examples=10)
@given(st.sampled_from(["default", "hard"]), st.integers(0, 2**31))
def test_oracle_survives_lossless_compaction(difficulty, seed):
    reward, compactions, _ = play(ENVS[difficulty], OraclePolicy(summary_quality=1.0), seed, budget_chars=4000)
    assert compactions >= 1 and reward == 1.0


def test_lossy_summaries_make_the_oracle_fail():
    results = [play(ENVS["default"], OraclePolicy(summary_quality=0.0), s, budget_chars=3000) for s in range(12)]
    compacted = [r for r, c, _ in results if c > 0]
    assert len(compacted) >= 10
    assert sum(compacted) <= 0.2 * len(compacted)


def test_oracle_is_a_pure_function_of_its_request():
    env = ENVS["default"]
    obs, _ = env.reset(seed=11)
    request = PolicyRequest(messages=[{"role": "system", "content": env.system_prompt}, {"role": "user", "content": obs}],
                            task=env.task)
    a, b = OraclePolicy(seed=1), OraclePolicy(seed=1)
    assert a.act([request, request]) == b.act([request]) * 2
    summary_request = PolicyRequest(messages=request.messages, compaction_required=True, task=env.task)
    assert a.act([summary_request]) == b.act([summary_request])
    with pytest.raises(ValueError, match="summary_quality"):
        OraclePolicy(summary_quality=1.5)
    with pytest.raises(ValueError, match="task"):
        OraclePolicy().act([PolicyRequest(messages=[])])


def test_oracle_works_under_the_context_budget_wrapper():
    from compactrl.eval import evaluate
    from compactrl.wrappers.context_budget import ContextBudget

    def make(**kwargs):
        return ContextBudget(CodeRepoEnv(**kwargs), budget=2048, max_compactions=8)

    good, _ = evaluate(make, OraclePolicy(summary_quality=1.0), episodes=6, env_kwargs={"difficulty": "default"})
    bad, _ = evaluate(make, OraclePolicy(summary_quality=0.0), episodes=6, env_kwargs={"difficulty": "default"})
    assert good["success_rate"] == 1.0 and good["compactions_per_episode"] >= 1
    assert bad["success_rate"] <= 0.34


def test_oracle_does_not_loop_when_a_summary_is_written_before_its_edit_is_seen():
    """A compaction can come between a replace and its output: the next trace shows the output."""
    import gymnasium as gym

    import compactrl  # noqa: F401
    from compactrl.eval import evaluate

    def make(**kwargs):
        return gym.make("CompactCode-v0", difficulty="tiny", tools=("view", "replace", "test", "submit"), budget=896,
                        reserve=64, tool_output_cap=192, max_turns=12, **kwargs)

    stats, _ = evaluate(make, OraclePolicy(summary_quality=0.0), episodes=16)
    assert stats["compactions_per_episode"] >= 1
    assert stats["success_rate"] >= 0.9  # the edit was made before the fact was dropped: it stands
    assert stats["truncated_rate"] == 0.0


@given(st.dictionaries(st.from_regex(r"\A[A-Za-z_./-]{1,20}\Z", fullmatch=True), st.integers(1, 10**6), max_size=4),
       st.dictionaries(st.from_regex(r"\A[A-Z_]{1,20}\Z", fullmatch=True),
                       st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(alphabet="abc;|/ ")).map(repr), max_size=5),
       st.lists(st.from_regex(r"\A[a-z]+ [A-Z_]+\Z", fullmatch=True), max_size=3),
       st.from_regex(r"\A[a-z0-9 ./-]{0,40}\Z", fullmatch=True))
def test_summary_round_trips(read, facts, done, next_step):
    state = SummaryState(read=read, facts=facts, done=done, next=next_step)
    assert parse_summary("Summary of your earlier work:\n" + format_summary(state)) == state
    assert parse_summary("no summary here") is None


@settings(max_examples=10)
@given(st.integers(0, 2**31), st.integers(0, 1000))
def test_random_policy_never_breaks_the_env(seed, policy_seed):
    env = ENVS["easy"]
    reward, _, info = play(env, RandomPolicy(seed=policy_seed), seed)
    assert reward in (0.0, 1.0) and info["turn"] <= env.task.max_turns
