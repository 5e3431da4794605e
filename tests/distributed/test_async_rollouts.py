"""Asynchronous rollouts on Ray (``max_staleness > 0``): bounded staleness, partial rollouts, clean resume.

Invariants: staleness 0 is the synchronous collector, batch for batch; no admitted trace is more than
``max_staleness`` versions older than the newest, whatever the workers' speeds and episode lengths;
an episode interrupted by a weight update goes on with the new weights, each of its tokens carrying the
log-prob of the weights that sampled it and each trace the oldest version among its responses; a
resumed collector never hands out an episode id twice.
"""

from __future__ import annotations

import copy
import sys
import time

import pytest
import ray.cloudpickle
import torch
from async_helpers import SlowPolicy
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.collectors import TraceCollector
from compactrl.collectors.episodes import EpisodeStats
from compactrl.distributed import RayCollector
from compactrl.distributed.collector import ThreadCollector
from compactrl.policies.scripted.code import OraclePolicy
from compactrl.training.config import override, preset
from compactrl.training.rollouts import build_policy, make_env_fns, worker_policy

pytestmark = pytest.mark.timeout(300)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import the tests folder
ray.cloudpickle.register_pickle_by_value(sys.modules[SlowPolicy.__module__])

ENV = {"env.max_turns": 12, "env.context_budget.budget": 860, "env.context_budget.reserve": 64,
       "env.context_budget.tool_output_cap": 192}


def _cfg(**changes):
    return override(preset("smoke"), {**ENV, **changes})


def _slow_oracle(scale: float, index: int):
    return SlowPolicy(OraclePolicy(summary_quality=1.0), seed=index, scale=scale)


def _slow_model(cfg_json: str, scale: float, index: int):
    return SlowPolicy(worker_policy(cfg_json, index), seed=index, scale=scale)


def test_staleness_zero_is_the_synchronous_collector(ray_cluster):
    env_fns = make_env_fns(_cfg().env, split="train", count=2)
    single = TraceCollector(env_fns, OraclePolicy(summary_quality=1.0), episodes_per_batch=4, group_size=2, seed=3)
    rc = RayCollector(env_fns, lambda i: OraclePolicy(summary_quality=1.0), num_workers=2, episodes_per_batch=4,
                      group_size=2, seed=3, max_staleness=0)
    try:
        for _ in range(2):
            a, b = single.next(), rc.next()
            for key in ("tokens", "policy_mask", "reward", "episode_id", "group_id", "trace_index"):
                assert torch.equal(a[key], b[key]), key
            rc.update_policy_weights_(None)
        assert not rc._inflight  # nothing runs between batches
    finally:
        single.shutdown()
        rc.shutdown()


def _ready(groups: list[tuple[int, list[list[int]]]]):
    out = []
    eid = 0
    for gid, episodes in groups:
        for versions in episodes:
            out.append((EpisodeStats(episode_id=eid, group_id=gid, task_seed=0), [object()] * len(versions), versions))
            eid += 1
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3), st.integers(0, 8), st.lists(st.tuples(
    st.integers(0, 5), st.lists(st.lists(st.integers(0, 8), min_size=0, max_size=4), min_size=1, max_size=3)),
    min_size=0, max_size=8))
def test_dropping_keeps_exactly_the_groups_within_the_bound(k, newest, groups):
    groups = [(i, eps) for i, (_, eps) in enumerate(groups)]  # unique group ids
    rc = RayCollector([lambda: None], lambda i: None, num_workers=1, episodes_per_batch=1, max_staleness=max(k, 1))
    rc.max_staleness, rc.policy_version = k, newest
    rc._ready = _ready(groups)
    before = len(rc._ready)
    rc._drop_stale()
    kept = {r[0].group_id for r in rc._ready}
    for gid, eps in groups:
        fresh = all(min(vs) >= newest - k for vs in eps if vs)
        assert (gid in kept) == fresh
    assert all(v >= newest - k for _, _, vs in rc._ready for v in vs)
    assert rc.stale_dropped == before - len(rc._ready)


@pytest.mark.parametrize("k,seed", [(1, 0), (2, 1)])
def test_no_admitted_trace_is_older_than_the_bound(ray_cluster, k, seed):
    """Heavy-tailed act times per worker; updates published between batches; every batch within the bound."""
    env_fns = make_env_fns(_cfg().env, split="train", count=2)
    rc = RayCollector(env_fns, lambda i: _slow_oracle(0.01, 7 * seed + i), num_workers=2, episodes_per_batch=4,
                      group_size=2, seed=seed, max_staleness=k)
    try:
        seen = set()
        for _ in range(5):
            batch = rc.next()
            assert int(batch["policy_version"].min()) >= rc.policy_version - k
            ids = set(batch["episode_id"].tolist())
            assert not ids & seen  # no episode in two batches
            seen |= ids
            assert rc.last_batch_stats["staleness_max"] <= k
            rc.update_policy_weights_(None)
        assert rc._inflight  # the workers kept going while "the learner" ran
    finally:
        rc.shutdown()


def _poll(collector, seconds: float) -> list[tuple[int, int]]:
    """(ready, outstanding) episodes every 20 ms for ``seconds``: what the workers do while "the learner" trains."""
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with collector._cond:
            seen.append((len(collector._ready), collector._outstanding()))
        time.sleep(0.02)
    return seen


@pytest.mark.parametrize("on_ray", [False, True])
@pytest.mark.parametrize("k", [1, 2])
def test_workers_run_ahead_while_the_learner_trains_by_at_most_k_batches(request, on_ray, k):
    """Between two ``next()`` calls the workers finish ``k`` batches' worth of episodes and then wait: the next
    batch is ready when the learner asks, nothing is dropped as stale, nothing runs further ahead."""
    env_fns = make_env_fns(_cfg().env, split="train", count=2)
    if on_ray:
        request.getfixturevalue("ray_cluster")
        col = RayCollector(env_fns, lambda i: OraclePolicy(summary_quality=1.0), num_workers=2, episodes_per_batch=4,
                           group_size=2, seed=11, max_staleness=k)
    else:
        col = ThreadCollector(env_fns, OraclePolicy(summary_quality=1.0), episodes_per_batch=4, group_size=2,
                              seed=11, max_staleness=k)
    try:
        for _ in range(3):
            assert col.next() is not None
            seen = _poll(col, 4.0 if on_ray else 1.5)  # "the learner" trains on the batch
            assert max(out for _, out in seen) <= k * 4  # at most k batches ahead of the one being trained on
            assert seen[-1][0] == k * 4  # ... and all of them finished while it trained
            col.update_policy_weights_(None)
        assert col.stale_dropped == 0
        assert col.last_batch_stats["staleness_max"] <= k
    finally:
        col.shutdown()


def test_an_episode_goes_on_with_weights_published_mid_way(ray_cluster):
    """Each token's sampling log-prob is that of the weights that sampled it; an episode spans two versions."""
    from compactrl.policies.transformers_policy import TransformersPolicy  # noqa: F401 - the workers' policy type
    from compactrl.tokenizer import shared_tokenizer

    cfg = _cfg()
    policy, _ = build_policy(cfg, shared_tokenizer())
    v1 = copy.deepcopy(policy)
    with torch.no_grad():
        v1.model.lm_head.weight.add_(0.3 * torch.randn_like(v1.model.lm_head.weight))
    env_fns = make_env_fns(cfg.env, split="train", count=2)
    rc = RayCollector(env_fns, lambda i: _slow_model(cfg.to_json(), 0.05, i), num_workers=1, episodes_per_batch=2,
                      seed=5, weights=policy, max_staleness=4, give_task_to_policy=False)
    try:
        rc.next()  # the worker's next share is running now, with version 0
        time.sleep(0.3)
        rc.update_policy_weights_(v1)  # taken before the worker's next round
        spans = False
        for _ in range(3):
            batch = rc.next()
            sources: dict[int, set[int]] = {}
            for row in range(batch.batch_size[0]):
                mask = batch["policy_mask"][row]
                tokens, att = batch["tokens"][row][None], batch["attention_mask"][row][None]
                got = batch["sample_log_prob"][row][mask]
                m0 = (got - policy.log_prob(tokens, att)[0][0][mask]).abs() < 1e-4
                m1 = (got - v1.log_prob(tokens, att)[0][0][mask]).abs() < 1e-4
                assert bool((m0 | m1).all())  # every token: the log-prob of one version's weights
                only0, only1 = bool((m0 & ~m1).any()), bool((m1 & ~m0).any())
                label = int(batch["policy_version"][row])
                if only0:
                    assert label == 0  # a trace is labelled with the oldest version among its responses
                elif only1:
                    assert label == 1
                ep = sources.setdefault(int(batch["episode_id"][row]), set())
                ep |= {0} if only0 else set()
                ep |= {1} if only1 else set()
            spans |= any(len(v) > 1 for v in sources.values())
            if spans:
                break
        assert spans, "no episode went on across the weight update"
    finally:
        rc.shutdown()


def test_a_resumed_collector_drops_what_was_in_flight_and_counts_nothing_twice(ray_cluster):
    env_fns = make_env_fns(_cfg().env, split="train", count=2)
    rc = RayCollector(env_fns, lambda i: _slow_oracle(0.01, i), num_workers=2, episodes_per_batch=4, group_size=2,
                      seed=9, max_staleness=1)
    try:
        handed = set(rc.next()["episode_id"].tolist())
        state = rc.state_dict()
        in_flight = {eid for _, share, _ in rc._inflight.values() for eid, _ in share}
        assert in_flight
    finally:
        rc.shutdown()
    again = RayCollector(env_fns, lambda i: _slow_oracle(0.01, i), num_workers=2, episodes_per_batch=4,
                         group_size=2, seed=9, max_staleness=1)
    try:
        again.load_state_dict(state)
        ids = set(again.next()["episode_id"].tolist())
        assert not ids & (handed | in_flight)
        assert min(ids) > max(handed | in_flight)
    finally:
        again.shutdown()
