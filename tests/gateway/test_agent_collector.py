"""The black-box rollout source: mini-swe-agent episodes through an in-process gateway as trace batches,
with the trace collector's surface (next, stats, policy version, state)."""

from __future__ import annotations

import pytest
import torch
from gymnasium.utils import seeding

from compactrl.gateway.collector import AgentCollector, AgentEpisodeConfig
from compactrl.gateway.mini_swe import offline_environment
from compactrl.gateway.recording import load_session
from compactrl.sandbox import SandboxError, make_sandbox
from compactrl.training.config import EnvConfig
from compactrl.training.rollouts import make_env_fns
from compactrl.wrappers import ContextBudgetConfig

offline_environment()
pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (pip install -e '.[test]')")

ENV = EnvConfig(backend="local", difficulty="tiny", context_budget=ContextBudgetConfig(budget=1400, reserve=16))
EPISODE = AgentEpisodeConfig(context_tokens=1300, step_limit=5, max_tokens=16, config_name="default.yaml",
                             action_regex=r"\A\s*([^\n]+)", command_timeout_s=3.0)


@pytest.fixture
def collector(policy, tmp_path):
    env_fn = make_env_fns(ENV, split="train", count=1)[0]
    sandbox = make_sandbox("local")
    try:
        sandbox.start(env_fn().unwrapped.task_source.sample(seeding.np_random(0)[0]))
    except (SandboxError, OSError) as exc:
        pytest.skip(f"the local sandbox needs bubblewrap or unshare with user namespaces: {exc}")
    finally:
        sandbox.close()
    c = AgentCollector(policy, env_fn, EPISODE, episodes_per_batch=2, concurrency=2, seed=3,
                       record_dir=str(tmp_path / "sessions"), threads=1)
    yield c
    c.shutdown()


@pytest.mark.timeout(300)
def test_next_is_a_batch_of_whole_rewarded_sessions_at_the_current_policy_version(collector, policy):
    batch = collector.next()
    stats = collector.last_episode_stats
    assert [s.episode_id for s in stats] == [0, 1] and not any(s.sandbox_error for s in stats)
    assert sorted(batch["episode_id"].unique().tolist()) == [0, 1]
    assert batch.batch_size[0] == sum(s.num_traces for s in stats)
    for s in stats:  # the session's reward (the task's check) sits on the batch, once per episode
        rows = batch["episode_id"] == s.episode_id
        assert float(batch["reward"][rows].sum()) == s.reward
        session = load_session(collector.gateway.recorder.path(f"episode-{s.episode_id}"))
        assert session.finished and len(session.calls) == s.steps
        assert {c.policy_version for c in session.calls} == {0}
        # the task is the one the env gives for that seed
        env = make_env_fns(ENV, split="train", count=1)[0]()
        env.reset(seed=s.task_seed)
        assert s.task_id == env.unwrapped.task.id
        env.close()
    assert collector.last_batch_stats["episodes"] == 2.0
    mask = batch["policy_mask"]
    with torch.no_grad():
        lp, _ = policy.log_prob(batch["tokens"], batch["attention_mask"])
    assert float((lp[mask] - batch["sample_log_prob"][mask]).abs().max()) < 1e-4
    for key in ("parent_trace", "spawn_position", "prev_trace"):
        assert batch[key].shape == (batch.batch_size[0],)

    # the next batch: new episodes and tasks, sampled by the next policy version; the state resumes it
    state = collector.state_dict()
    collector.update_policy_weights_(policy)
    assert collector.state_dict()["policy_version"] == 1
    collector.load_state_dict(state)
    assert collector.state_dict() == state
    collector.update_policy_weights_(policy)
    collector.next()
    later = collector.last_episode_stats
    assert [s.episode_id for s in later] == [2, 3]
    assert {s.task_seed for s in later}.isdisjoint({s.task_seed for s in stats})
    versions = {c.policy_version for s in later
                for c in load_session(collector.gateway.recorder.path(f"episode-{s.episode_id}")).calls}
    assert versions == {1}


def test_a_bad_batch_size_is_refused(policy):
    with pytest.raises(ValueError, match="episodes_per_batch"):
        AgentCollector(policy, lambda: None, EPISODE, episodes_per_batch=3, group_size=2)
