"""RayCollector: the single-process collector's episodes from Ray rollout workers, through faults."""

from __future__ import annotations

import functools
import os
import sys

import gymnasium as gym
import pytest
import ray.cloudpickle
import torch

from compactrl.collectors import TraceCollector
from compactrl.distributed import RayCollector
from compactrl.policies.scripted.code import OraclePolicy
from compactrl.training import trainer as T
from compactrl.training.config import override, preset
from compactrl.training.rollouts import build_policy, make_env_fns, worker_policy

pytestmark = pytest.mark.timeout(240)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import the tests folder

# the main job's env: long enough for compactions, so episodes have several traces
ENV = {"env.max_turns": 12, "env.context_budget.budget": 860, "env.context_budget.reserve": 64,
       "env.context_budget.tool_output_cap": 192}


def _cfg(**changes):
    return override(preset("smoke"), {**ENV, **changes})


def _oracle(index: int):
    return OraclePolicy(summary_quality=1.0)


def _same_batch(a, b) -> None:
    assert a.batch_size == b.batch_size
    for key in ("tokens", "policy_mask", "summary_mask", "reward", "episode_id", "group_id", "trace_index"):
        assert torch.equal(a[key], b[key]), key
    assert torch.allclose(a["sample_log_prob"], b["sample_log_prob"], equal_nan=True)


def _single(env_fns, policy, *, episodes, group_size=1, seed=3, batches=1, give_task=True):
    c = TraceCollector(env_fns, policy, episodes_per_batch=episodes, group_size=group_size, seed=seed,
                       give_task_to_policy=give_task)
    try:
        return [c.next() for _ in range(batches)], c
    finally:
        c.shutdown()


def test_scripted_episodes_equal_the_single_process_ones_group_by_group(ray_cluster):
    env_fns = make_env_fns(_cfg().env, split="train", count=2)
    singles, single = _single(env_fns, _oracle(0), episodes=8, group_size=2, batches=2)
    rc = RayCollector(env_fns, _oracle, num_workers=2, episodes_per_batch=8, group_size=2, seed=3)
    try:
        for want in singles:
            got = rc.next()
            _same_batch(got, want)
            assert got["policy_version"].eq(0).all()
        assert rc.state_dict()["next_episode_id"] == single.state_dict()["next_episode_id"] == 16
        assert rc.state_dict()["rng"] == single.state_dict()["rng"]
        assert [s.task_seed for s in rc.last_episode_stats] == [s.task_seed for s in single.last_episode_stats]
        assert (got["num_traces"] > 1).any(), "no episode compacted: the test would not see trace order"
    finally:
        rc.shutdown()


def _greedy(policy):
    from compactrl.policies.sampling import SamplingConfig

    policy.sampling = SamplingConfig(temperature=0.0)  # greedy: an episode is a function of the weights
    return policy


def _greedy_worker(cfg_json: str, index: int):
    return _greedy(worker_policy(cfg_json, index))


def _perturbed_policy(cfg):
    from compactrl.tokenizer import shared_tokenizer

    policy, _ = build_policy(cfg, shared_tokenizer())
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return policy


def test_tiny_model_episodes_and_published_weights_equal_the_single_process_ones(ray_cluster):
    cfg = _cfg(**{"env.max_turns": 2})  # equality does not depend on the episodes' length: 2 turns each
    policy = _greedy(_perturbed_policy(cfg))  # weights the workers' own build does not have: they must come from the store
    env_fns = make_env_fns(cfg.env, split="train", count=2)
    (want,), _ = _single(env_fns, policy, episodes=4, give_task=False)
    rc = RayCollector(env_fns, functools.partial(_greedy_worker, cfg.to_json()), num_workers=2, episodes_per_batch=4,
                      seed=3, give_task_to_policy=False, weights=policy)
    try:
        _same_batch(rc.next(), want)
        with torch.no_grad():
            for p in policy.parameters():
                p.mul_(0.5)
        rc.update_policy_weights_(policy)
        (want2,), _ = _single(env_fns, policy, episodes=4, seed=3, give_task=False)
        rc.load_state_dict({**rc.state_dict(), **_fresh_stream(rc, seed=3)})
        got = rc.next()
        assert got["policy_version"].eq(1).all()
        assert torch.equal(got["tokens"], want2["tokens"])
    finally:
        rc.shutdown()


def _fresh_stream(rc, seed):
    import numpy as np

    return {"rng": np.random.default_rng(seed).bit_generator.state, "next_episode_id": 0, "next_group_id": 0}


class _DieOnce(gym.Wrapper):
    """Kills its worker process at the episode's second step, once per marker file (the first env to get there)."""

    def __init__(self, env, marker):
        super().__init__(env)
        self.marker, self.steps = marker, 0

    def reset(self, **kw):
        self.steps = 0
        return self.env.reset(**kw)

    def step(self, action):
        self.steps += 1
        if self.steps == 2:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os._exit(1)  # the process dies mid-episode, as a killed worker does
        return self.env.step(action)


def test_a_worker_killed_mid_episode_is_restarted_and_its_episodes_rerun_once(ray_cluster, tmp_path):
    base = make_env_fns(_cfg().env, split="train", count=2)
    marker = str(tmp_path / "died")
    dying = [functools.partial(lambda fn: _DieOnce(fn(), marker), fn) for fn in base]
    (want,), _ = _single(base, _oracle(0), episodes=6)
    rc = RayCollector(dying, _oracle, num_workers=2, episodes_per_batch=6, seed=3)
    try:
        got = rc.next()
        assert os.path.exists(marker) and rc.restarts == 1
        _same_batch(got, want)  # full batch, every episode once, none of the dead worker's traces twice
        ids = [s.episode_id for s in rc.last_episode_stats]
        assert ids == sorted(set(ids)) and len(ids) == 6
    finally:
        rc.shutdown()


def _broken(index: int):
    raise RuntimeError("no model here")


def test_a_worker_that_cannot_start_is_a_clear_error(ray_cluster):
    fns = make_env_fns(_cfg().env, split="train", count=1)
    rc = RayCollector(fns, _broken, num_workers=1, episodes_per_batch=1, start_timeout_s=60)
    with pytest.raises(RuntimeError, match="(?s)could not be started.*no model here"):
        rc.next()
    rc.shutdown()


def test_waiting_for_a_worker_is_bounded(ray_cluster):
    fns = make_env_fns(_cfg().env, split="train", count=1)
    # more CPUs than the cluster has: the worker can never be placed
    rc = RayCollector(fns, _oracle, num_workers=1, episodes_per_batch=1, worker_num_cpus=3, start_timeout_s=1.0)
    with pytest.raises(RuntimeError, match="no rollout worker started within start_timeout_s=1.0s"):
        rc.next()
    rc.shutdown()


def test_bad_arguments_name_the_field():
    fns = make_env_fns(_cfg().env, split="train", count=1)
    with pytest.raises(ValueError, match="num_workers"):
        RayCollector(fns, _oracle, num_workers=0, episodes_per_batch=2)
    with pytest.raises(ValueError, match="episodes_per_batch"):
        RayCollector(fns, _oracle, num_workers=1, episodes_per_batch=3, group_size=2)


def test_the_trainer_builds_a_ray_collector_from_the_config_and_refuses_a_frozen_summariser():
    from compactrl.tokenizer import shared_tokenizer

    cfg = _cfg(**{"distributed.num_rollout_workers": 3, "distributed.envs_per_worker": 2})
    policy, _ = build_policy(cfg, shared_tokenizer())
    r = T.Run(cfg, None, policy, None, pad_id=0)
    T.start_rollouts(r)  # workers start at the first batch: no Ray needed to build it
    c = r.rollouts.collector
    assert isinstance(c, RayCollector) and (c.num_workers, c.envs_per_worker) == (3, 2)
    assert c.episodes_per_batch == cfg.rl.episodes_per_iter and c.state_dict()["seed"] == cfg.seed + 1
    with pytest.raises(ValueError, match="rl.frozen_summarizer"):
        T.start_rollouts(T.Run(override(cfg, {"rl.frozen_summarizer": True}), None, policy, None, pad_id=0))


def test_token_count_batches_equal_the_single_process_ones(ray_cluster):
    env_fns = make_env_fns(_cfg().env, split="train", count=1)
    single = TraceCollector(env_fns, _oracle(0), tokens_per_batch=2000, seed=3)
    try:
        want = single.next()
    finally:
        single.shutdown()
    rc = RayCollector(env_fns, _oracle, num_workers=1, tokens_per_batch=2000, seed=3)
    try:  # one worker with one env plans as one process with one env does: an episode at a time
        _same_batch(rc.next(), want)
        assert rc.state_dict()["next_episode_id"] == single.state_dict()["next_episode_id"] >= 2
    finally:
        rc.shutdown()


def test_token_count_batches_on_several_workers_hold_whole_groups_of_the_same_episodes(ray_cluster):
    env_fns = make_env_fns(_cfg().env, split="train", count=2)
    rc = RayCollector(env_fns, _oracle, num_workers=2, tokens_per_batch=5000, group_size=2, seed=3)
    try:
        got = rc.next()
        stats = rc.last_episode_stats
    finally:
        rc.shutdown()
    assert sum(s.trace_tokens for s in stats) >= 5000
    assert [s.episode_id for s in stats] == list(range(len(stats))) and len(stats) % 2 == 0
    assert all([s.group_id for s in stats].count(s.group_id) == 2 for s in stats), "a group was split"
    (want,), _ = _single(env_fns, _oracle(0), episodes=len(stats), group_size=2)
    _same_batch(got, want)  # the same task seeds in the same order, whichever worker ran them
    with pytest.raises(ValueError, match="exactly one"):
        RayCollector(env_fns, _oracle, num_workers=1)
    with pytest.raises(ValueError, match="tokens_per_batch"):
        RayCollector(env_fns, _oracle, num_workers=1, tokens_per_batch=0)


class _BrokenSandbox(gym.Wrapper):
    """Every reset fails as a lost sandbox does (an infrastructure error, survived per episode)."""

    def reset(self, **kw):
        raise OSError("sandbox gone")


def test_a_token_count_batch_whose_envs_all_fail_stops_with_an_error_not_a_hang(ray_cluster):
    base = make_env_fns(_cfg().env, split="train", count=1)
    broken = [functools.partial(lambda fn: _BrokenSandbox(fn()), fn) for fn in base]
    rc = RayCollector(broken, _oracle, num_workers=1, tokens_per_batch=1000)
    try:
        with pytest.raises(RuntimeError, match="ended without a finished trace"):
            rc.next()
    finally:
        rc.shutdown()
