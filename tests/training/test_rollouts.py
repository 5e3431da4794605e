"""The rollout sources behind one protocol: each satisfies :class:`Rollouts`, and :func:`make_rollouts`
picks it from the config (the trainer never asks which source it has)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from compactrl.training import rollouts as R
from compactrl.training.config import override, preset
from compactrl.training.rollouts import (
    CollectorRollouts,
    EngineRollouts,
    Rollouts,
    SummaryRouter,
    make_rollouts,
)


def _cfg(**changes):
    return override(preset("smoke"), changes)


def _policy(cfg):
    from compactrl.tokenizer import shared_tokenizer

    policy, _ = R.build_policy(cfg, shared_tokenizer())
    return policy


class _FakeEngine:
    """What :class:`EngineRollouts` reads of a :class:`~compactrl.serving.vllm.policy.VLLMPolicy`; acts
    like the learner (a TraceCollector can step envs with it)."""

    def __init__(self, learner, *, lagging: bool = False):
        self.learner, self.lagging = learner, lagging
        self.version, self.last_version, self.closed = 0, 0, 0
        self.last_sync = {"engine/start_s": 0.5}

    def act(self, requests):
        return self.learner.act(requests)

    def update_weights(self, model, version=None, **kwargs):
        if not self.lagging:
            self.version = self.last_version = version
        self.last_sync = {"engine/sync_version": float(self.version)}

    def close(self):
        self.closed += 1


def test_every_source_satisfies_the_protocol():
    for cls in (CollectorRollouts, EngineRollouts):
        for name in ("next", "update_weights", "state_dict", "load_state_dict", "close", "last_sync",
                     "last_batch_stats"):
            assert hasattr(cls, name), (cls.__name__, name)


def test_the_factory_picks_the_in_process_collector():
    from compactrl.collectors.trace_collector import TraceCollector

    cfg = _cfg()
    policy = _policy(cfg)
    rollouts = make_rollouts(cfg, policy, pad_id=0)
    try:
        assert isinstance(rollouts, Rollouts) and type(rollouts) is CollectorRollouts
        assert isinstance(rollouts.collector, TraceCollector) and rollouts.policy is policy
        assert rollouts.collector.episodes_per_batch == cfg.rl.episodes_per_iter
        assert rollouts.last_sync == {} and rollouts.last_batch_metrics == {}
        assert rollouts.state_dict()["frozen_summarizer"] is None
        assert rollouts.state_dict()["collector"]["seed"] == cfg.seed + 1
    finally:
        rollouts.close()
        rollouts.close()  # idempotent


def test_the_factory_routes_summaries_to_a_frozen_copy():
    cfg = _cfg(**{"rl.frozen_summarizer": True})
    policy = _policy(cfg)
    rollouts = make_rollouts(cfg, policy, pad_id=0)
    try:
        assert isinstance(rollouts.policy, SummaryRouter) and rollouts.policy.policy is policy
        frozen = rollouts.summarizer
        assert frozen is rollouts.policy.summarizer and frozen is not policy
        assert not any(p.requires_grad for p in frozen.parameters())
        state = rollouts.state_dict()
        assert set(state) == {"frozen_summarizer", "collector"}
        with torch.no_grad():
            next(iter(frozen.parameters())).add_(1.0)
        rollouts.load_state_dict(state, version=0)  # a resumed run gets the checkpoint's summariser back
        assert all(torch.equal(a, b) for a, b in zip(frozen.state_dict().values(), state["frozen_summarizer"].values()))
    finally:
        rollouts.close()


def test_held_out_evaluation_summarises_with_the_frozen_copy_greedily():
    """With ``rl.frozen_summarizer`` the run is evaluated as it was trained: summaries by a greedy twin of
    the frozen copy, every other response by the policy's greedy twin; without one, the twin alone."""
    from compactrl.tokenizer import shared_tokenizer

    cfg = _cfg(**{"rl.frozen_summarizer": True})
    policy, eval_policy = R.build_policy(cfg, shared_tokenizer())
    assert R.evaluation_policy(cfg, eval_policy) is eval_policy
    rollouts = make_rollouts(cfg, policy, pad_id=0)
    try:
        routed = R.evaluation_policy(cfg, eval_policy, rollouts.summarizer)
        assert isinstance(routed, SummaryRouter) and routed.policy is eval_policy
        assert routed.summarizer.model is rollouts.summarizer.model and routed.summarizer.model is not policy.model
        assert routed.summarizer.sampling == eval_policy.sampling  # greedy, as the policy's evaluation
    finally:
        rollouts.close()


def test_the_factory_picks_the_ray_collector_from_the_worker_count():
    pytest.importorskip("ray")
    from compactrl.distributed import RayCollector

    cfg = _cfg(**{"distributed.num_rollout_workers": 2, "distributed.envs_per_worker": 1})
    policy = _policy(cfg)
    rollouts = make_rollouts(cfg, policy, pad_id=0)  # workers start at the first batch: no Ray needed here
    try:
        assert isinstance(rollouts, Rollouts) and type(rollouts) is CollectorRollouts
        assert isinstance(rollouts.collector, RayCollector) and rollouts.collector.num_workers == 2
        assert rollouts.last_sync == {}
    finally:
        rollouts.close()


def test_the_factory_picks_the_agent_collector_from_the_source():
    from compactrl.gateway.collector import AgentCollector

    cfg = _cfg(**{"rollout.source": "mini_swe_agent", "env.backend": "local"})
    policy = _policy(cfg)
    rollouts = make_rollouts(cfg, policy, pad_id=0)
    try:
        assert isinstance(rollouts, Rollouts) and type(rollouts) is CollectorRollouts
        assert isinstance(rollouts.collector, AgentCollector)
    finally:
        rollouts.close()


def test_the_factory_picks_the_engine_and_syncs_it(monkeypatch):
    from compactrl.collectors.trace_collector import TraceCollector

    cfg = _cfg(**{"rollout.engine": "vllm"})
    policy = _policy(cfg)
    engine = _FakeEngine(policy)
    monkeypatch.setattr(R, "start_engine", lambda cfg, policy, run: engine)
    rollouts = make_rollouts(cfg, policy, pad_id=0)
    try:
        assert isinstance(rollouts, Rollouts) and type(rollouts) is EngineRollouts
        assert isinstance(rollouts.collector, TraceCollector) and rollouts.policy is engine
        assert rollouts.last_sync == {"engine/start_s": 0.5}  # the start's report, for row 0
        batch = rollouts.next()
        assert rollouts.last_batch_metrics["engine/version"] == 0.0
        assert set(rollouts.last_batch_metrics) >= {"mismatch/k3", "mismatch/max_abs_dlogp"}
        assert rollouts.last_batch_metrics["mismatch/max_abs_dlogp"] < 1e-4  # it acts with the learner itself
        assert rollouts.last_batch_metrics["mismatch/route_disagree_all"] == 0.0  # and routes with its experts
        assert batch["policy_version"].tolist() == [0] * batch.batch_size[0]
        rollouts.update_weights(policy, version=1)
        assert engine.version == 1 and rollouts.last_sync == {"engine/sync_version": 1.0}
        engine.lagging = True
        with pytest.raises(RuntimeError, match="did not sync the vLLM engine to version 2"):
            rollouts.update_weights(policy, version=2)
    finally:
        rollouts.close()
    assert engine.closed == 1


def test_a_failing_source_closes_the_engine_it_started(monkeypatch):
    cfg = _cfg(**{"rollout.engine": "vllm"})
    policy = _policy(cfg)
    engine = _FakeEngine(policy)
    monkeypatch.setattr(R, "start_engine", lambda cfg, policy, run: engine)

    def broken(*args, **kwargs):
        raise OSError("no envs")

    monkeypatch.setattr(R, "in_process_collector", broken)
    with pytest.raises(OSError, match="no envs"):
        make_rollouts(cfg, policy, pad_id=0)
    assert engine.closed == 1


def test_the_trainer_does_not_ask_which_source_it_has():
    source = (Path(R.__file__).parent / "trainer.py").read_text()
    for name in ("rollout.source", "rollout.engine", "num_rollout_workers", "RayCollector", "AgentCollector",
                 "VLLMPolicy"):
        assert name not in source, name
    assert not [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute) and n.attr == "engine"]
