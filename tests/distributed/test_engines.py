"""Shared engine actors: the same episodes as in-process generation, published weights and versions,
an engine killed mid-batch, bounded waits, and the vLLM engine's weight path (without vLLM)."""

from __future__ import annotations

import functools
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import ray.cloudpickle
import torch

from compactrl.collectors import TraceCollector
from compactrl.distributed import RayCollector
from compactrl.policies.scripted.code import OraclePolicy
from compactrl.training import rollouts as T
from compactrl.training.config import override, preset

pytestmark = pytest.mark.timeout(240)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # actors cannot import the tests folder
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "policies"))  # the vLLM stand-ins of its tests

ENV = {"env.max_turns": 12, "env.context_budget.budget": 860, "env.context_budget.reserve": 64,
       "env.context_budget.tool_output_cap": 192}
SMALL = {"engine_num_cpus": 0.5, "worker_num_cpus": 0.5}  # 2 workers and an engine on the tests' 2 CPUs


def _cfg(**changes):
    return override(preset("smoke"), {**ENV, **changes})


def _oracle(index: int):
    return OraclePolicy(summary_quality=1.0)


def _single(env_fns, policy, *, episodes, seed=3, give_task=True):
    c = TraceCollector(env_fns, policy, episodes_per_batch=episodes, seed=seed, give_task_to_policy=give_task)
    try:
        return c.next()
    finally:
        c.shutdown()


def _rows(batch, episode_id: int) -> list[torch.Tensor]:
    """The token rows of one episode, in trace order, without padding."""
    rows = (batch["episode_id"] == episode_id).nonzero().flatten().tolist()
    return [batch["tokens"][i][batch["attention_mask"][i].bool()] for i in rows]


def _greedy_engine(cfg_json: str, index: int):
    from compactrl.policies.sampling import SamplingConfig

    policy = T.worker_policy(cfg_json, index)
    policy.sampling = SamplingConfig(temperature=0.0)  # greedy: an episode is a function of the weights
    return policy


@pytest.mark.slow
def test_engine_episodes_and_published_weights_equal_in_process_generation(ray_cluster):
    cfg = _cfg(**{"env.max_turns": 4})
    policy = _greedy_engine(cfg.to_json(), 0)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # weights the engine's own build lacks: they must come from the object store
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    env_fns = T.make_env_fns(cfg.env, split="train", count=2)
    rc = RayCollector(env_fns, None, num_workers=2, num_engines=1, episodes_per_batch=4, seed=3,
                      give_task_to_policy=False, weights=policy,
                      engine_fn=functools.partial(_greedy_engine, cfg.to_json()), **SMALL)
    try:
        for version in (0, 1):
            if version:
                with torch.no_grad():
                    for p in policy.parameters():
                        p.mul_(0.5)
                rc.update_policy_weights_(policy)
                fresh = np.random.default_rng(3).bit_generator.state  # the same tasks again
                rc.load_state_dict({**rc.state_dict(), "rng": fresh, "next_episode_id": 0, "next_group_id": 0})
            want = _single(env_fns, policy, episodes=4, give_task=False)
            got = rc.next()
            assert got["policy_version"].eq(version).all()
            for key in ("tokens", "policy_mask", "summary_mask", "reward", "episode_id", "trace_index"):
                assert torch.equal(got[key], want[key]), (version, key)
            assert torch.allclose(got["sample_log_prob"], want["sample_log_prob"], equal_nan=True)
        # both workers generated on the one engine, which never restarted and loaded each version once
        assert rc.engine_restarts == 0 and len(rc._engine_pids[0]) == 1
        assert rc.engine_stats()[0]["loads"] == 2
        assert rc.last_batch_stats["engines"] == 1.0
    finally:
        rc.shutdown()


def test_asynchronous_workers_on_a_shared_engine_stay_within_the_bound(ray_cluster):
    """``max_staleness=1`` with two workers generating on one engine actor: the workers keep going while
    versions are published, every batch's traces are at most 1 version old, no episode is in two batches,
    and the engine loads the newer versions as their requests arrive, without restarting."""
    cfg = _cfg(**{"env.max_turns": 4})
    policy = _greedy_engine(cfg.to_json(), 0)
    env_fns = T.make_env_fns(cfg.env, split="train", count=2)
    rc = RayCollector(env_fns, None, num_workers=2, num_engines=1, episodes_per_batch=4, seed=3,
                      give_task_to_policy=False, weights=policy, max_staleness=1,
                      engine_fn=functools.partial(_greedy_engine, cfg.to_json()), **SMALL)
    try:
        seen: set[int] = set()
        for _ in range(4):
            batch = rc.next()
            assert int(batch["policy_version"].min()) >= rc.policy_version - 1
            assert rc.last_batch_stats["staleness_max"] <= 1
            ids = set(batch["episode_id"].tolist())
            assert not ids & seen
            seen |= ids
            with torch.no_grad():
                for p in policy.parameters():
                    p.mul_(0.9)
            rc.update_policy_weights_(policy)
        assert rc.engine_restarts == 0 and rc.engine_stats()[0]["loads"] >= 2
    finally:
        rc.shutdown()


@pytest.mark.slow
def test_a_served_engine_gives_the_in_process_episodes_and_loads_published_weights(ray_cluster):
    from compactrl.distributed import served_engine

    cfg = _cfg(**{"env.max_turns": 4})
    policy = _greedy_engine(cfg.to_json(), 0)
    with torch.no_grad():  # weights the served model's own build lacks
        for p in policy.parameters():
            p.mul_(0.7)
    env_fns = T.make_env_fns(cfg.env, split="train", count=2)
    want = _single(env_fns, policy, episodes=4, give_task=False)
    engine_fn = functools.partial(served_engine, functools.partial(_greedy_engine, cfg.to_json()))
    rc = RayCollector(env_fns, None, num_workers=2, num_engines=1, episodes_per_batch=4, seed=3,
                      give_task_to_policy=False, weights=policy, engine_fn=engine_fn, **SMALL)
    try:  # through compactrl serve on the engine's loopback: token ids and log-probs as in process
        got = rc.next()
        for key in ("tokens", "policy_mask", "summary_mask", "episode_id", "trace_index"):
            assert torch.equal(got[key], want[key]), key
        assert torch.allclose(got["sample_log_prob"], want["sample_log_prob"], atol=1e-5, equal_nan=True)
        assert rc.engine_stats()[0]["loads"] == 1
    finally:
        rc.shutdown()


class _DieOnAct:
    """An oracle whose process dies at its second act call, once per marker file (the first engine there)."""

    def __init__(self, marker: str):
        self.marker, self.calls, self.policy = marker, 0, OraclePolicy(summary_quality=1.0)

    def act(self, requests):
        self.calls += 1
        if self.calls == 2:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os._exit(1)  # the engine dies with requests in flight, as a killed process does
        return self.policy.act(requests)


def _dying_engine(marker: str, index: int):
    return _DieOnAct(marker)


@pytest.mark.slow  # seen failing once under the CI command at load ~4: ray.wait in the driver raised Ray's own
# "SystemError: CoreWorker.wait returned a result with an exception set" as the engine died; passes alone.
# The driver now repeats such a wait (cluster.wait_one, tested on its own); slow until seen passing under load
def test_an_engine_killed_mid_batch_truncates_its_episodes_restarts_and_the_batch_fills(ray_cluster, tmp_path):
    env_fns = T.make_env_fns(_cfg().env, split="train", count=2)
    want = _single(env_fns, _oracle(0), episodes=6)
    marker = str(tmp_path / "died")
    rc = RayCollector(env_fns, None, num_workers=2, num_engines=1, episodes_per_batch=6, seed=3,
                      engine_fn=functools.partial(_dying_engine, marker), **SMALL)
    try:
        got = rc.next()
        assert os.path.exists(marker) and rc.engine_restarts == 1
        stats = rc.last_episode_stats
        ids = [s.episode_id for s in stats]
        assert ids == list(range(6)), "the batch holds every planned episode exactly once"
        lost = [s for s in stats if s.sandbox_error and "engine actor 0 lost" in s.sandbox_error]
        assert 1 <= len(lost) <= 4 and all(s.truncated and not s.terminated for s in lost)
        assert rc.last_batch_stats["engine_restarts"] == 1.0
        for s in stats:  # an episode's rows are the in-process episode's, never more, never twice
            mine, ref = _rows(got, s.episode_id), _rows(want, s.episode_id)
            if s in lost:
                assert len(mine) < len(ref)
                ref = ref[:len(mine)]
            assert len(mine) == len(ref) and all(torch.equal(a, b) for a, b in zip(mine, ref)), s.episode_id
        # the restarted engine serves the next batch
        rc.next()
        assert not any(s.sandbox_error for s in rc.last_episode_stats) and rc.engine_restarts == 1
    finally:
        rc.shutdown()


def test_an_engine_lost_for_good_stops_the_run_with_a_clear_error(ray_cluster, tmp_path):
    env_fns = T.make_env_fns(_cfg().env, split="train", count=1)
    rc = RayCollector(env_fns, None, num_workers=1, num_engines=1, episodes_per_batch=2, engine_max_restarts=0,
                      engine_fn=functools.partial(_dying_engine, str(tmp_path / "died")), **SMALL)
    try:
        with pytest.raises(RuntimeError, match="engine actor 0 was lost 1 times in a row"):
            rc.next()
    finally:
        rc.shutdown()


class _Stuck:
    """A policy whose generation never ends (a hung engine)."""

    def act(self, requests):
        threading.Event().wait(600)


def _stuck_engine(index: int):
    return _Stuck()


def test_an_engine_that_does_not_answer_stops_the_run_after_engine_timeout_s(ray_cluster):
    env_fns = T.make_env_fns(_cfg().env, split="train", count=1)
    rc = RayCollector(env_fns, None, num_workers=1, num_engines=1, episodes_per_batch=1, engine_fn=_stuck_engine,
                      engine_timeout_s=2.0, **SMALL)
    try:
        with pytest.raises(RuntimeError, match=r"engine actor 0 did not answer 1 requests within timeout_s=2.0s"):
            rc.next()
    finally:
        rc.shutdown()


def test_waiting_for_an_engine_is_bounded(ray_cluster):
    fns = T.make_env_fns(_cfg().env, split="train", count=1)
    rc = RayCollector(fns, _oracle, num_workers=1, num_engines=1, episodes_per_batch=1, engine_num_cpus=3,
                      start_timeout_s=1.0)
    with pytest.raises(RuntimeError, match=r"no engine actor started within start_timeout_s=1.0s"):
        rc.next()
    rc.shutdown()
    with pytest.raises(ValueError, match="num_engines"):
        RayCollector(fns, _oracle, num_workers=1, num_engines=-1, episodes_per_batch=1)


def test_engines_without_rollout_workers_are_a_config_error():
    from compactrl.training.config import DistributedConfig

    with pytest.raises(ValueError, match="distributed.num_engines"):
        DistributedConfig(num_engines=1)
    with pytest.raises(ValueError, match="distributed.num_engines"):
        DistributedConfig(num_rollout_workers=2, num_engines=-1)
    assert DistributedConfig(num_rollout_workers=2, num_engines=1).num_engines == 1


class _Echo:
    """Answers each request with its message; the first generation holds until released."""

    def __init__(self):
        self.sizes: list[int] = []
        self.release = threading.Event()

    def act(self, requests):
        self.sizes.append(len(requests))
        if len(self.sizes) == 1:
            assert self.release.wait(30)
        return [r.messages[0]["content"] for r in requests]


def test_an_engine_gathers_the_calls_that_wait_into_one_generation():
    from compactrl.distributed.engines import InferenceEngine
    from compactrl.types import PolicyRequest

    echo = _Echo()
    engine = InferenceEngine(lambda index: echo, 0, threads=1)

    def call(name: str, n: int):
        reqs = [PolicyRequest(messages=[{"role": "user", "content": f"{name}{i}"}]) for i in range(n)]
        answers[name] = engine.act(reqs, [None], 0)

    answers: dict = {}
    first = threading.Thread(target=call, args=("a", 1))
    first.start()
    with engine._cond:  # the first call is generating: the next two must wait, then go together
        assert engine._cond.wait_for(lambda: engine._generating, timeout=30)
    later = [threading.Thread(target=call, args=(name, n)) for name, n in (("b", 2), ("c", 1))]
    for t in later:
        t.start()
    with engine._cond:
        assert engine._cond.wait_for(lambda: len(engine._waiting) == 2, timeout=30)
    echo.release.set()
    for t in [first, *later]:
        t.join(30)
    assert echo.sizes == [1, 3], "the two waiting calls were not served by one generation"
    assert {k: v[2] for k, v in answers.items()} == {"a": ["a0"], "b": ["b0", "b1"], "c": ["c0"]}
    assert all(v[0] == 0 for v in answers.values())
    assert engine.stats()["calls"] == 3.0 and engine.stats()["generations"] == 2.0
