"""ContextBudget on the real CompactCode-v0: registration, check_env, invariants with scripted policies,
and the oracle's success with good and bad summaries on held-out tasks."""

from __future__ import annotations

import gymnasium as gym
import pytest
from budget_checks import TOK, check_episode, run, str_action

import compactrl  # noqa: F401  (registers the env ids)
from compactrl.envs.code_env import CodeRepoEnv
from compactrl.eval import evaluate
from compactrl.policies.scripted.code import OraclePolicy, RandomPolicy
from compactrl.tokenizer import IM_END_ID
from compactrl.types import PolicyRequest, TokenResponse
from compactrl.wrappers import ContextBudget, ContextBudgetConfig

pytestmark = pytest.mark.timeout(120)


def test_make_returns_the_wrapped_env_with_small_defaults_and_kwargs_override():
    env = gym.make("CompactCode-v0")
    assert isinstance(env.unwrapped, CodeRepoEnv)
    wrapper = env.env if not isinstance(env, ContextBudget) else env
    while not isinstance(wrapper, ContextBudget):
        wrapper = wrapper.env
    assert wrapper.config == ContextBudgetConfig() and wrapper.config.budget <= 4096
    env = gym.make("CompactCode-v0", budget=3000, reserve=200, max_compactions=2, split="test")
    wrapper = env.get_wrapper_attr("config")
    assert (wrapper.budget, wrapper.reserve, wrapper.max_compactions) == (3000, 200, 2)
    assert env.unwrapped.split == "test"
    bare = gym.make("CompactCode-v0", context_budget=None)
    assert isinstance(bare.unwrapped, CodeRepoEnv) and bare.observation_space == bare.unwrapped.observation_space
    with pytest.raises(ValueError, match="budget"):
        gym.make("CompactCode-v0", budget=600)


def test_check_env_passes_on_compact_code():
    from gymnasium.utils.env_checker import check_env

    check_env(gym.make("CompactCode-v0"))


def _oracle_tokens(env, policy: OraclePolicy):
    """The oracle's responses as token-carrying responses (as a sampler would return them)."""

    def respond(obs, info, t):
        request = PolicyRequest(messages=obs, prompt_token_ids=info["prompt_token_ids"],
                                max_new_tokens=info["max_new_tokens"],
                                compaction_required=info["compaction_required"], task=env.unwrapped.task)
        text = policy.respond(request)
        ids = (TOK.encode(text, add_special_tokens=False, split_special_tokens=True) + [IM_END_ID])
        ids = ids[: info["max_new_tokens"]]
        lps = [-0.01 * (1 + (t + i) % 5) for i in range(len(ids))]
        body = ids[:-1] if ids[-1] == IM_END_ID else ids
        return TokenResponse(TOK.decode(body), ids, lps, finished=ids[-1] == IM_END_ID), ids, lps

    return respond


def _random_text(env, policy: RandomPolicy):
    def respond(obs, info, t):
        request = PolicyRequest(messages=obs, compaction_required=info["compaction_required"])
        return str_action(policy.respond(request), info["max_new_tokens"])

    return respond


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_invariants_on_compact_code_with_the_oracle_as_token_responses(seed):
    env = gym.make("CompactCode-v0", split="test").env  # the ContextBudget itself (no order enforcing)
    while not isinstance(env, ContextBudget):
        env = env.env
    log = run(env, seed, _oracle_tokens(env, OraclePolicy(summary_quality=1.0)))
    check_episode(env, log)
    last = log[-1]["next_info"]
    assert last["success"] and last["num_compactions"] >= 1


@pytest.mark.parametrize("seed", [0, 1])
def test_invariants_on_compact_code_with_random_text(seed):
    cfg = ContextBudgetConfig(budget=1800, reserve=128, tool_output_cap=256, max_compactions=3)
    env = ContextBudget(CodeRepoEnv(split="test", max_turns=40), cfg, tokenizer=TOK)
    log = run(env, seed, _random_text(env, RandomPolicy(seed=seed, submit_prob=0.0)))
    check_episode(env, log)
    last = log[-1]["next_info"]
    assert last["num_compactions"] >= 1 and (last["budget_exhausted"] or last["turn"] == 40)


def _oracle_rates(episodes: int, quality: float) -> dict:
    return evaluate("CompactCode-v0", OraclePolicy(summary_quality=quality), episodes=episodes,
                    env_kwargs={"split": "test"})[0]


@pytest.mark.timeout(300)
def test_oracle_succeeds_with_good_summaries_and_fails_with_bad_ones():
    """Compaction matters on the default CompactCode-v0: the numbers quoted in docs/context_budget.md
    (200 and 100 held-out tasks, ~20 s)."""
    good, bad = _oracle_rates(200, 1.0), _oracle_rates(100, 0.0)
    assert good["success_rate"] >= 0.99 and good["compactions_per_episode"] >= 1.0
    assert good["traces_per_episode"] == pytest.approx(good["compactions_per_episode"] + 1)
    assert bad["success_rate"] <= 0.2


def test_trace_collector_batches_compact_code_traces():
    """The collector stacks the wrapper's traces: one row per trace, summary rows flagged, rewards kept."""
    from compactrl.collectors import TraceCollector

    fns = [lambda: gym.make("CompactCode-v0", split="test") for _ in range(2)]
    collector = TraceCollector(fns, OraclePolicy(summary_quality=1.0), episodes_per_batch=4, total_batches=1)
    batch = collector.next()
    stats = collector.last_episode_stats
    assert batch.batch_size[0] == sum(s.num_traces for s in stats) == sum(s.compactions + 1 for s in stats)
    assert all(s.success for s in stats) and sum(s.compactions for s in stats) >= 4
    assert int(batch["policy_mask"].sum()) == sum(s.generated_tokens for s in stats)
    assert int(batch["summary_mask"].sum()) == sum(s.summary_tokens for s in stats) > 0
    assert (batch["summary_mask"] <= batch["policy_mask"]).all()
    assert float(batch["reward"].sum()) == 4.0
    collector.shutdown()
