"""Evaluation on generated envs: the same episodes as training collection, summary names, bare envs."""

from __future__ import annotations

import gymnasium as gym
import pytest

import compactrl  # noqa: F401  (registers the ids)
from compactrl.collectors import TraceCollector
from compactrl.envs.code_env import CodeRepoEnv
from compactrl.eval import evaluate, evaluate_policy, open_budget
from compactrl.policies.scripted.code import OraclePolicy, RandomPolicy
from compactrl.policies.tiny_moe import tiny_moe
from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.tokenizer import load_tokenizer
from compactrl.wrappers import ContextBudget

pytestmark = pytest.mark.timeout(300)

TIMING = {"summary_gen_time_s", "other_gen_time_s", "env_time_s", "wall_clock_s"}
# a budget where the tiny tasks need a summary after a few responses of a random model
SMALL_BUDGET = dict(difficulty="tiny", max_turns=4, budget=760, reserve=40, tool_output_cap=96, max_compactions=2)


class Recorded(gym.Wrapper):
    """Keeps every finished trace an env emits, in order (what the collector was handed)."""

    def __init__(self, env, log):
        super().__init__(env)
        self.log = log

    def step(self, action):
        out = self.env.step(action)
        if out[4].get("trace") is not None:
            self.log.append(out[4]["trace"])
        return out


def _sampling_policy():
    tok = load_tokenizer()
    return TransformersPolicy(tiny_moe("glm4_moe", vocab_size=len(tok), seed=0), tok, temperature=1.0, seed=3,
                              max_new_tokens=40)


def _env_fns(log, n=2):
    return [lambda: Recorded(gym.make("CompactCode-v0", **SMALL_BUDGET), log) for _ in range(n)]


def test_evaluation_and_training_collection_play_identical_episodes():
    eval_log, train_log = [], []
    agg, stats = evaluate_policy(_env_fns(eval_log), _sampling_policy(), episodes=3, seed=7)
    collector = TraceCollector(_env_fns(train_log), _sampling_policy(), episodes_per_batch=3, seed=7,
                               give_task_to_policy=False)
    batch = collector.next()
    collector.shutdown()
    train = collector.last_episode_stats
    assert [s.task_id for s in stats] == [s.task_id for s in train] and len({s.task_id for s in stats}) == 3
    assert [s.task_seed for s in stats] == [s.task_seed for s in train]
    assert sum(s.compactions for s in stats) >= 1  # the chains cross a summary boundary
    assert [t.token_ids for t in eval_log] == [t.token_ids for t in train_log]
    assert [t.rewards for t in eval_log] == [t.rewards for t in train_log]
    assert [s.reward for s in stats] == [s.reward for s in train]
    assert agg["episodes"] == 3 and int(batch["policy_mask"].sum()) == sum(s.generated_tokens for s in stats)


def test_a_different_seed_evaluates_other_tasks():
    _, a = evaluate("CompactCode-v0", OraclePolicy(), episodes=3, seed=1, env_kwargs={"difficulty": "easy"})
    _, b = evaluate("CompactCode-v0", OraclePolicy(), episodes=3, seed=2, env_kwargs={"difficulty": "easy"})
    assert {s.task_id for s in a}.isdisjoint({s.task_id for s in b})


def test_summary_uses_the_collector_names_once_and_records_chain_length():
    agg, stats = evaluate("CompactCode-v0", OraclePolicy(summary_quality=1.0), episodes=4, seed=3, num_envs=3,
                          env_kwargs={"split": "test", "budget": 2048})
    assert agg["success_rate"] == 1.0 and agg["episodes"] == 4 and agg["format_errors_per_episode"] == 0
    assert agg["traces_per_episode"] == pytest.approx(agg["compactions_per_episode"] + 1)
    assert agg["compactions_per_episode"] >= 1
    assert not [k for k in agg if k.startswith("mean_")]  # one name per figure
    assert [s.num_traces for s in stats] == [s.compactions + 1 for s in stats]
    assert all(s.info["tests_passed"] > 0 and "num_compactions" not in s.info for s in stats)
    bad, _ = evaluate(CodeRepoEnv, RandomPolicy(seed=1), episodes=3, env_kwargs={"difficulty": "easy"})
    assert bad["format_errors_per_episode"] > 0


def test_results_do_not_depend_on_the_number_of_envs():
    runs = [evaluate(CodeRepoEnv, OraclePolicy(), episodes=3, seed=5, num_envs=n)[1] for n in (1, 3)]
    one, three = ([{k: v for k, v in s.to_dict().items() if k not in TIMING} for s in run] for run in runs)
    assert one == three


def test_a_bare_env_runs_in_an_open_budget_that_never_compacts():
    agg, stats = evaluate("CompactCode-v0", OraclePolicy(), episodes=3, seed=0,
                          env_kwargs={"context_budget": None, "difficulty": "hard"})
    assert agg["success_rate"] == 1.0 and all(s.num_traces == 1 and s.compactions == 0 for s in stats)
    # the same tasks overflow the default budget without compaction
    assert max(s.info["context_tokens_max"] for s in stats) > 2048
    cfg = open_budget(OraclePolicy())
    assert cfg.max_compactions == 0 and cfg.tool_output_cap >= 1 << 20
    policy = _sampling_policy()
    cfg = open_budget(policy)
    assert (cfg.budget, cfg.reserve) == (policy.context_length, policy.max_new_tokens)
    env = CodeRepoEnv(difficulty="easy")
    wrapped = ContextBudget(env)
    from compactrl.eval import with_budget

    assert with_budget(wrapped, policy) is wrapped and isinstance(with_budget(env, policy), ContextBudget)


def test_bad_arguments():
    with pytest.raises(ValueError, match="episodes"):
        evaluate(CodeRepoEnv, OraclePolicy(), episodes=0)
    with pytest.raises(ValueError, match="num_envs"):
        evaluate(CodeRepoEnv, OraclePolicy(), episodes=1, num_envs=0)
