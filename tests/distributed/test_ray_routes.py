"""MoE routes through Ray: recorded by the policy on a shared engine actor, carried back to the rollout
worker in its responses, kept by the worker's wrapper per trace and stacked into the batch unchanged."""

from __future__ import annotations

import functools
import sys

import pytest
import ray.cloudpickle
import torch

from compactrl.distributed import RayCollector
from compactrl.policies.routing import forward_routes
from compactrl.training import rollouts as T
from compactrl.training.config import override, preset

pytestmark = pytest.mark.timeout(300)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ENV = {"env.max_turns": 3, "env.context_budget.budget": 860, "env.context_budget.reserve": 64,
       "env.context_budget.tool_output_cap": 192}


@pytest.mark.slow
def test_routes_from_an_engine_actor_reach_the_batch_and_equal_the_learners(ray_cluster):
    cfg = override(preset("smoke"), ENV)
    policy = T.worker_policy(cfg.to_json(), 0)
    env_fns = T.make_env_fns(cfg.env, split="train", count=1)
    rc = RayCollector(env_fns, None, num_workers=1, num_engines=1, episodes_per_batch=1, seed=3,
                      give_task_to_policy=False, weights=policy, engine_num_cpus=0.5, worker_num_cpus=0.5,
                      engine_fn=functools.partial(T.worker_policy, cfg.to_json()))
    try:
        batch = rc.next()
    finally:
        rc.shutdown()
    routes = batch["routed_experts"]
    have = (routes != 255).all(-1).all(-1)
    assert bool(have[:, 0].all()) and int(have.sum()) > 0.9 * int(batch["attention_mask"].sum()) - 20
    assert not bool((have & ~batch["attention_mask"].bool()).any())
    learner = forward_routes(policy.model, batch["tokens"], batch["attention_mask"])
    assert torch.equal(routes.long()[have], learner[have])
    assert T.route_mismatch(policy, batch)["mismatch/route_disagree_all"] == 0.0
