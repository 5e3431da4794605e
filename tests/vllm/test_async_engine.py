"""Asynchronous rollouts on the trainer's own vLLM engine (a :class:`ThreadCollector` generating on a thread
while "the learner" syncs a new version between two of its requests): an episode interrupted by the sync
goes on with the new weights, each token keeping the log-prob of the version that sampled it and each trace
the oldest version among its responses; the post-sync probe check runs on every sync. The session's
engine (one start, shared with the other engine tests)."""

from __future__ import annotations

import copy
import time

import pytest
import torch

from compactrl.distributed import ThreadCollector
from compactrl.serving.vllm.policy import learner_log_probs
from compactrl.training.config import override, preset
from compactrl.training.rollouts import make_env_fns

ENV = {"env.max_turns": 8, "env.context_budget.budget": 860, "env.context_budget.reserve": 64,
       "env.context_budget.tool_output_cap": 192}
TOL = 1e-4


def _token_sources(batch, old: tuple[int, torch.nn.Module], new: tuple[int, torch.nn.Module]) -> dict[int, set[int]]:
    """Per episode, the versions its tokens were sampled with; asserts every token is one version's and every
    trace labelled with its oldest."""
    sources: dict[int, set[int]] = {}
    for row in range(batch.batch_size[0]):
        att = batch["attention_mask"][row].bool()
        seq = batch["tokens"][row][att].tolist()
        mask = batch["policy_mask"][row][att].bool()[1:]
        got = batch["sample_log_prob"][row][att][1:][mask]
        m0, m1 = ((got - torch.tensor(learner_log_probs(m, [seq])[0])[mask]).abs() < TOL for _, m in (old, new))
        assert bool((m0 | m1).all())  # every token: the log-prob of one version's weights
        used = {old[0]} if bool((m0 & ~m1).any()) else set()
        used |= {new[0]} if bool((m1 & ~m0).any()) else set()
        if used:
            assert int(batch["policy_version"][row]) == min(used)
        sources.setdefault(int(batch["episode_id"][row]), set()).update(used)
    return sources


@pytest.mark.timeout(900)
def test_an_episode_goes_on_with_a_version_synced_mid_way_on_the_engine(engines):
    s = engines("qwen3_moe")
    pol = s.policy
    pol.update_weights(s.model)  # whatever an earlier test left: the learner's weights, checked
    v0, first = copy.deepcopy(s.model), pol.version
    cfg = override(preset("smoke"), ENV)
    tc = ThreadCollector(make_env_fns(cfg.env, split="train", count=2), pol, episodes_per_batch=2, seed=5,
                         max_staleness=4, give_task_to_policy=False)
    tc.policy_version = tc.sampler.version = first  # the engine's numbering, as a resumed run's
    saved = pol.max_new_tokens
    pol.max_new_tokens = 24
    try:
        tc.next()  # the thread's next share is running on the engine now
        g = torch.Generator().manual_seed(7)
        with torch.no_grad():  # the learner's update
            for p in s.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        t0 = time.perf_counter()
        tc.update_policy_weights_(s.model, version=first + 1)  # waits for the request in progress, then syncs
        assert time.perf_counter() - t0 < 120
        assert pol.version == first + 1 and pol.last_sync["engine/probe_max_abs_dlogp"] < pol.sync_tolerance
        spans, seen = False, set()
        for _ in range(4):
            batch = tc.next()
            ids = set(batch["episode_id"].tolist())
            assert not ids & seen
            seen |= ids
            assert int(batch["policy_version"].min()) >= first
            sources = _token_sources(batch, (first, v0), (first + 1, s.model))
            spans |= any(len(v) > 1 for v in sources.values())
            if spans:
                break
        assert spans, "no episode went on across the sync"
    finally:
        tc.shutdown()
        pol.max_new_tokens = saved
