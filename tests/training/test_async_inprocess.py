"""Asynchronous rollouts in the trainer's process (``distributed.max_staleness > 0``, no rollout workers).

Invariants: staleness 0 is today's synchronous collector; on the thread, without updates, the batches are
the synchronous ones row for row (a scripted policy); whatever the sampler's speed, the learner's and the
episodes' lengths, no admitted trace is more than ``max_staleness`` versions older than the newest and no
episode is handed out twice; an episode interrupted by a published version goes on with it, each token
keeping the log-prob of the weights that sampled it (the thread's own copy, never the learner's module);
a failing sampler truncates its round's episodes, not the collector; a resumed collector drops what was
in flight; ``compactrl train`` runs end to end and resumes after a kill.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from async_helpers import SlowPolicy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compactrl.collectors import TraceCollector
from compactrl.distributed import ThreadCollector
from compactrl.policies.scripted.code import OraclePolicy
from compactrl.training.config import override, preset
from compactrl.training.rollouts import (
    CollectorRollouts,
    build_policy,
    make_env_fns,
    make_rollouts,
    worker_policy,
)
from compactrl.training.run_dir import RunDir

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
ENV = {"env.max_turns": 12, "env.context_budget.budget": 860, "env.context_budget.reserve": 64,
       "env.context_budget.tool_output_cap": 192}
KEYS = ("tokens", "policy_mask", "reward", "episode_id", "group_id", "trace_index", "sample_log_prob")


def _cfg(**changes):
    return override(preset("smoke"), {**ENV, **changes})


class _Failing:
    """A scripted policy whose ``fail_at``-th call raises (an engine lost mid-request)."""

    def __init__(self, fail_at: int) -> None:
        self.inner, self.calls, self.fail_at = OraclePolicy(summary_quality=1.0), 0, fail_at

    def act(self, requests):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("engine died")
        return self.inner.act(requests)


def test_staleness_zero_is_the_synchronous_collector_in_process():
    cfg = _cfg()
    policy, _ = build_policy(cfg, _tokenizer())
    rollouts = make_rollouts(cfg, policy, pad_id=0)
    try:
        assert type(rollouts.collector) is TraceCollector and rollouts.collector.policy is policy
    finally:
        rollouts.close()
    env_fns = make_env_fns(cfg.env, split="train", count=2)
    sync = TraceCollector(env_fns, OraclePolicy(summary_quality=1.0), episodes_per_batch=4, group_size=2, seed=3)
    thread = ThreadCollector(env_fns, OraclePolicy(summary_quality=1.0), episodes_per_batch=4, group_size=2, seed=3,
                             max_staleness=1)
    try:  # no update published: the thread's batches are the synchronous ones, row for row
        for _ in range(3):
            a, b = sync.next(), thread.next()
            for key in ("tokens", "policy_mask", "reward", "episode_id", "group_id", "trace_index"):
                assert torch.equal(a[key], b[key]), key
            assert b["policy_version"].eq(0).all()
    finally:
        sync.shutdown()
        thread.shutdown()


def test_max_staleness_is_checked_where_it_cannot_apply():
    with pytest.raises(ValueError, match="distributed.max_staleness"):
        _cfg(**{"distributed.max_staleness": -1})
    with pytest.raises(ValueError, match="distributed.max_staleness"):  # the black box collects batch by batch
        _cfg(**{"rollout.source": "mini_swe_agent", "env.backend": "local", "distributed.max_staleness": 1})
    assert _cfg(**{"distributed.max_staleness": 1}).distributed.num_rollout_workers == 0  # in process: allowed
    with pytest.raises(ValueError, match="max_staleness"):
        ThreadCollector([lambda: None], OraclePolicy(), episodes_per_batch=1, max_staleness=0)


def _tokenizer():
    from compactrl.tokenizer import shared_tokenizer

    return shared_tokenizer()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(1, 2), seed=st.integers(0, 1000), scale=st.sampled_from([0.0, 0.005, 0.02]),
       learner_s=st.lists(st.sampled_from([0.0, 0.01, 0.05]), min_size=4, max_size=4),
       max_turns=st.sampled_from([3, 12]))
def test_no_admitted_trace_is_older_than_the_bound_in_process(k, seed, scale, learner_s, max_turns):
    """Heavy-tailed act times; the learner takes a random time per update; short or long episodes."""
    env_fns = make_env_fns(_cfg(**{"env.max_turns": max_turns}).env, split="train", count=2)
    tc = ThreadCollector(env_fns, SlowPolicy(OraclePolicy(summary_quality=1.0), seed, scale), episodes_per_batch=4,
                         group_size=2, seed=seed, max_staleness=k)
    try:
        seen: set[int] = set()
        for pause in learner_s:
            batch = tc.next()
            assert int(batch["policy_version"].min()) >= tc.policy_version - k
            assert tc.last_batch_stats["staleness_max"] <= k
            ids = set(batch["episode_id"].tolist())
            assert not ids & seen  # no episode in two batches
            seen |= ids
            time.sleep(pause)  # "the learner" trains while the thread goes on
            tc.update_policy_weights_(None)
        for key in ("wait_s", "staleness_mean", "staleness_max", "stale_dropped", "episodes_in_flight"):
            assert key in tc.last_batch_stats
    finally:
        tc.shutdown()


def test_an_episode_goes_on_with_weights_published_mid_way_in_process():
    """The thread's own copy loads a published version at its next round; each token's sampling log-prob is
    that of the version that sampled it, each trace labelled with its oldest; the published weights are a
    copy (the learner changing its tensors afterwards does not reach the sampler)."""
    cfg = _cfg()
    policy, _ = build_policy(cfg, _tokenizer())
    v1 = copy.deepcopy(policy)
    with torch.no_grad():
        v1.model.lm_head.weight.add_(0.3 * torch.randn_like(v1.model.lm_head.weight))
    v1_published = copy.deepcopy(v1)
    env_fns = make_env_fns(cfg.env, split="train", count=2)
    tc = ThreadCollector(env_fns, policy_fn=lambda i: SlowPolicy(worker_policy(cfg.to_json(), i), i, 0.05),
                         weights=policy, episodes_per_batch=2, seed=5, max_staleness=4, give_task_to_policy=False)
    try:
        tc.next()  # the thread's next share is running now, with version 0
        assert tc._workers[0].policy.inner is not policy
        time.sleep(0.3)
        tc.update_policy_weights_(v1)  # loaded before the thread's next round
        with torch.no_grad():  # the learner's next update, in place
            v1.model.lm_head.weight.add_(1.0)
        spans, seen = False, set()
        for _ in range(4):
            batch = tc.next()
            ids = batch["episode_id"].tolist()
            assert not set(ids) & seen
            seen |= set(ids)
            spans |= _check_versions(batch, policy, v1_published)
            if spans:
                break
        assert spans, "no episode went on across the weight update"
    finally:
        tc.shutdown()


def _check_versions(batch, v0, v1) -> bool:
    """Every token's log-prob is one version's; each trace is labelled with its oldest. Whether an episode
    spans both versions."""
    sources: dict[int, set[int]] = {}
    for row in range(batch.batch_size[0]):
        mask = batch["policy_mask"][row]
        tokens, att = batch["tokens"][row][None], batch["attention_mask"][row][None]
        got = batch["sample_log_prob"][row][mask]
        m0 = (got - v0.log_prob(tokens, att)[0][0][mask]).abs() < 1e-4
        m1 = (got - v1.log_prob(tokens, att)[0][0][mask]).abs() < 1e-4
        assert bool((m0 | m1).all())  # every token: the log-prob of one version's weights
        only0, only1 = bool((m0 & ~m1).any()), bool((m1 & ~m0).any())
        label = int(batch["policy_version"][row])
        if only0:
            assert label == 0
        elif only1:
            assert label == 1
        ep = sources.setdefault(int(batch["episode_id"][row]), set())
        ep |= ({0} if only0 else set()) | ({1} if only1 else set())
    return any(len(v) > 1 for v in sources.values())


def test_a_failing_sampler_truncates_its_rounds_episodes_not_the_collector():
    env_fns = make_env_fns(_cfg().env, split="train", count=2)
    tc = ThreadCollector(env_fns, _Failing(fail_at=3), episodes_per_batch=4, group_size=2, seed=1, max_staleness=1)
    try:
        errors = []
        for _ in range(3):
            assert tc.next() is not None
            errors += [(s.sandbox_error, s.truncated) for s in tc.last_episode_stats]
        lost = [e for e in errors if "engine died" in (e[0] or "")]
        assert len(lost) == 2 and all(truncated for _, truncated in lost)  # the round's two episodes, only
        assert tc.restarts == 0  # the worker lived on
    finally:
        tc.shutdown()


def test_a_resumed_in_process_collector_drops_what_was_in_flight_and_counts_nothing_twice():
    env_fns = make_env_fns(_cfg().env, split="train", count=2)
    tc = ThreadCollector(env_fns, SlowPolicy(OraclePolicy(summary_quality=1.0), 0, 0.01), episodes_per_batch=4,
                         group_size=2, seed=9, max_staleness=1)
    try:
        handed = set(tc.next()["episode_id"].tolist())
        tc.update_policy_weights_(None)
        state = tc.state_dict()
        in_flight = {eid for _, share, _ in tc._inflight.values() for eid, _ in share}
        assert in_flight
    finally:
        tc.shutdown()
    assert not tc._inflight and all(w is None for w in tc._workers)
    again = ThreadCollector(env_fns, OraclePolicy(summary_quality=1.0), episodes_per_batch=4, group_size=2, seed=9,
                            max_staleness=1)
    try:
        again.load_state_dict(state)
        assert again.policy_version == 1
        ids = set(again.next()["episode_id"].tolist())
        assert not ids & (handed | in_flight)
        assert min(ids) > max(handed | in_flight)
    finally:
        again.shutdown()


def test_make_rollouts_runs_the_thread_on_a_copy_of_the_policy():
    cfg = _cfg(**{"distributed.max_staleness": 2})
    policy, _ = build_policy(cfg, _tokenizer())
    rollouts = make_rollouts(cfg, policy, pad_id=0)
    try:
        assert isinstance(rollouts, CollectorRollouts) and isinstance(rollouts.collector, ThreadCollector)
        batch = rollouts.next()
        assert rollouts.collector._workers[0].policy is not policy
        assert batch["policy_version"].eq(0).all()
        rollouts.update_weights(policy, version=1)
        assert rollouts.collector.policy_version == 1
    finally:
        rollouts.close()


def _rows(out: Path) -> list[dict]:
    return RunDir(out).rows() if (out / "metrics.jsonl").exists() else []


@pytest.mark.timeout(600)
def test_smoke_run_in_process_with_staleness_one_resumes_after_a_kill(tmp_path):
    """``compactrl train --preset smoke --distributed.max_staleness 1``: the async metrics in every RL row,
    within the bound; SIGKILLed after iteration 2's row, resumed to two iterations past its checkpoint."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "compactrl.cli", "train", "--preset", "smoke", "--out", str(out), "--no-progress",
           "--distributed.max_staleness", "1", "--rl.iterations", "1000", "--eval.every", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and proc.poll() is None and len(_rows(out)) < 4:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert len(_rows(out)) >= 4, "no row for iteration 3 within 300 s"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    killed = _rows(out)
    covered = RunDir(out).load_checkpoint()["rows"]
    target = covered + 1
    resumed = subprocess.run([sys.executable, "-m", "compactrl.cli", "train", "--resume", "--out", str(out),
                              "--no-progress", "--rl.iterations", str(target)],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = _rows(out)
    assert [r["iteration"] for r in rows] == list(range(target + 1))
    assert rows[:covered] == killed[:covered]
    for r in rows[1:]:
        for key in ("wait_s", "staleness_mean", "staleness_max", "stale_dropped", "episodes_in_flight"):
            assert f"train/{key}" in r, key
        assert r["train/staleness_max"] <= 1
    assert json.loads((out / "config.json").read_text())["distributed"]["max_staleness"] == 1
