"""mini-swe-agent from PyPI, unmodified and offline, on CompactCode tasks in the local sandbox,
through the gateway: every call recorded, compacted contexts split into traces, ids re-score."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from compactrl.gateway.mini_swe import offline_environment, run_episode
from compactrl.gateway.recording import load_session
from compactrl.gateway.traces import build_tree, sessions_to_batch
from compactrl.sandbox import SandboxError, make_sandbox
from compactrl.tasksets.generators.code import CodeTaskGenerator

offline_environment()  # before mini-swe-agent's first import: it reads its config dir then
pytest.importorskip("minisweagent", reason="mini-swe-agent is not installed (pip install -e '.[test]')")

CONTEXT = 1700  # tokens: default.yaml's system + task take ~1170, so a few steps make the agent compact
FIRST_LINE = r"\A\s*([^\n]+)"
"""mini-swe-agent's text model with its ``action_regex`` option set to a response's first line: the tiny
random model cannot write the fenced block, and with its own regex every response would be a format
error that mini-swe-agent drops from the history; this way its responses act (in the sandbox) and its
history grows as a real agent's does."""
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
                           step_limit=step_limit, max_tokens=48, config_name="default.yaml",
                           action_regex=FIRST_LINE, command_timeout_s=3.0)  # random text may wait
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
        # one conversation: each call extends the trace until the agent compacts, then a new trace
        # continues it (the summary call itself still extends the old one)
        assert len(nodes) == 1 + r.compactions
        assert [(n.prev, n.parent) for n in nodes] == [(i - 1, -1) for i in range(len(nodes))]
        assert sum(len(n.calls) for n in nodes) == r.calls
    batch = sessions_to_batch(sessions)
    assert _rescore(policy, batch) < 1e-4
    return sessions, batch


@pytest.mark.timeout(300)
def test_one_mini_swe_agent_episode_through_the_gateway(gateway, policy):
    result = _episode(gateway, 0, "mswea-fast", step_limit=7)
    assert result.exit_status in ("LimitsExceeded", "Submitted") and result.reward in (0.0, 1.0)
    (session,), _ = _check_sessions(gateway, policy, [result])
    assert result.compactions >= 1 and len(build_tree(session)[0].calls) >= 3


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_twenty_mini_swe_agent_episodes_compact_and_rescore(gateway, policy):
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: _episode(gateway, 100 + i, f"mswea-{i}", 8), range(20)))
    assert all(r.compactions >= 1 for r in results)  # the context limit made every episode compact
    sessions, batch = _check_sessions(gateway, policy, results)
    assert batch["episode_id"].unique().numel() == 20
    print(f"20 mini-swe-agent episodes: {sum(r.calls for r in results)} calls, "
          f"{sum(r.compactions for r in results)} compactions, {batch.shape[0]} traces, "
          f"success {sum(r.reward for r in results) / 20:.2f}")
