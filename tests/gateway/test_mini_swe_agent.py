"""mini-swe-agent from PyPI, unmodified and offline, on CompactCode tasks in the local sandbox,
through the gateway: every call recorded, compacted contexts split into traces, ids re-score."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from compactrl.envs.generators.code import CodeTaskGenerator
from compactrl.envs.sandbox import SandboxError, make_sandbox
from compactrl.gateway.mini_swe import offline_environment, run_episode
from compactrl.gateway.recording import load_session
from compactrl.gateway.traces import build_tree, sessions_to_batch

offline_environment()  # before mini-swe-agent's first import: it reads its config dir then
pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (pip install -e '.[test]')")

CONTEXT = 1800  # tokens: mini.yaml's system + task take ~1470, so a few steps make the agent compact
TASKS = CodeTaskGenerator("default")


def _episode(gateway, seed: int, session: str, step_limit: int):
    task = TASKS.generate(seed)
    sandbox = make_sandbox("local", timeout_s=20.0)
    try:
        sandbox.start(task)
    except (SandboxError, OSError) as exc:
        sandbox.close()
        pytest.skip(f"the local sandbox needs bubblewrap or unshare with user namespaces: {exc}")
    try:
        return run_episode(gateway.url, "tiny", session, task, sandbox, gateway.fmt, context_tokens=CONTEXT,
                           step_limit=step_limit, max_tokens=48)
    finally:
        sandbox.close()


def _rescore(policy, batch) -> float:
    with torch.no_grad():
        lp, _ = policy.log_prob(batch["tokens"], batch["attention_mask"])
    mask = batch["policy_mask"]
    return float((lp[mask] - batch["sample_log_prob"][mask]).abs().max())


def _check_sessions(gateway, policy, results):
    sessions = [load_session(gateway.recorder.path(r.session)) for r in results]
    for r, s in zip(results, sessions):
        assert s.finished and s.reward == r.reward and len(s.calls) == r.calls
        assert all(c.route == "chat" and c.prompt_ids for c in s.calls)
        nodes = build_tree(s)
        # a call whose context is not the last one extended starts a trace: compactions (and the
        # responses mini-swe-agent drops after a format error) are such cuts
        assert len(nodes) >= 1 + r.compactions
        assert all(n.parent == -1 for n in nodes)  # one conversation: no sub-agents
    batch = sessions_to_batch(sessions)
    assert _rescore(policy, batch) < 1e-4
    return sessions, batch


@pytest.mark.timeout(300)
def test_one_mini_swe_agent_episode_through_the_gateway(gateway, policy):
    result = _episode(gateway, 0, "mswea-fast", step_limit=3)
    assert result.calls >= 3 and result.exit_status == "LimitsExceeded" and result.reward in (0.0, 1.0)
    _check_sessions(gateway, policy, [result])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_twenty_mini_swe_agent_episodes_compact_and_rescore(gateway, policy):
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: _episode(gateway, 100 + i, f"mswea-{i}", 6), range(20)))
    assert sum(r.compactions for r in results) >= 20  # the context limit made every episode compact
    sessions, batch = _check_sessions(gateway, policy, results)
    assert batch["episode_id"].unique().numel() == 20
    print(f"20 mini-swe-agent episodes: {sum(r.calls for r in results)} calls, "
          f"{sum(r.compactions for r in results)} compactions, {batch.shape[0]} traces, "
          f"success {sum(r.reward for r in results) / 20:.2f}")
