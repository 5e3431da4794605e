"""The vLLM engine process against the learner, in float32, on tiny MoE models of three architectures:
log-probs of sampled and of given tokens agree within 1e-5, token ids round-trip exactly, a sync of
changed weights agrees again, a sync of unchanged weights changes nothing (the stale-expert
regression: without the CPU experts' repack it moves log-probs by ~0.1), and a corrupted engine is
caught by the post-sync probe check."""

from __future__ import annotations

import pytest
import torch

from compactrl.serving.vllm.policy import SyncCheckError, learner_log_probs, max_abs_diff
from compactrl.types import PolicyRequest

ARCHS = ("glm4_moe", "qwen3_moe", "mixtral")
TOL = 1e-5
pytestmark = pytest.mark.timeout(900)


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 4096, (int(k),), generator=g).tolist() for k in torch.randint(3, 40, (n,), generator=g)]


def _sampled_gap(policy, model, prompts, n=12, seeds=None) -> float:
    gens = policy.generate(prompts, n, seeds=seeds)
    gaps = []
    for p, g in zip(prompts, gens, strict=True):
        assert g.token_ids and len(g.token_ids) == len(g.log_probs) <= n
        ref = learner_log_probs(model, [p + g.token_ids])[0][len(p) - 1:]
        gaps += [abs(a - b) for a, b in zip(g.log_probs, ref, strict=True)]
    return max(gaps)


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_equals_learner_and_ids_round_trip(arch, engines):
    s = engines(arch)
    pol = s.policy
    pol.sync_weights(s.model)  # whatever an earlier test left: the learner's weights
    prompts = _prompts(5, seed=1)
    assert _sampled_gap(pol, s.model, prompts) < TOL
    assert max_abs_diff(pol.score(pol.probe), learner_log_probs(s.model, pol.probe))[0] < TOL
    # token ids round-trip exactly: the ids sampled are the ids returned, and scoring them gives back
    # the log-probs reported at sampling (no text, no re-tokenisation anywhere)
    a = pol.generate(prompts, 16, seeds=[11, 12, 13, 14, 15])
    b = pol.generate(prompts, 16, seeds=[11, 12, 13, 14, 15])
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    for p, g in zip(prompts, a):
        rescored = pol.score([p + g.token_ids])[0][len(p) - 1:]
        assert max(abs(x - y) for x, y in zip(rescored, g.log_probs)) < TOL
    responses = pol.act([PolicyRequest(messages=(), prompt_token_ids=tuple(p), max_new_tokens=8) for p in prompts])
    for p, r in zip(prompts, responses):
        assert all(isinstance(t, int) and 0 <= t < 4096 for t in r.token_ids) and len(r.token_ids) <= 8
        ref = learner_log_probs(s.model, [p + list(r.token_ids)])[0][len(p) - 1:]
        assert max(abs(x - y) for x, y in zip(r.log_probs, ref)) < TOL
    assert pol.last_version == pol.version


@pytest.mark.parametrize("arch", ARCHS)
def test_sync_of_unchanged_weights_changes_nothing(arch, engines):
    s = engines(arch)
    pol = s.policy
    pol.sync_weights(s.model)
    before = pol.score(pol.probe)
    row = pol.update_weights(s.model)
    assert max_abs_diff(pol.score(pol.probe), before)[0] < 1e-6
    assert row["engine/probe_max_abs_dlogp"] < TOL and row["engine/sync_version"] == pol.version
    # the regression this guards: vLLM's reload alone leaves the CPU experts in a stale layout
    with pytest.raises(SyncCheckError, match=rf"weight sync to version {pol.version + 1}\b"):
        pol.update_weights(s.model, repack_experts=False)
    assert max_abs_diff(pol.score(pol.probe), before)[0] > 1e-2
    pol.update_weights(s.model)
    assert max_abs_diff(pol.score(pol.probe), before)[0] < 1e-6


@pytest.mark.parametrize("arch", ARCHS)
def test_sync_of_changed_weights_agrees_again(arch, engines):
    s = engines(arch)
    pol = s.policy
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # an "update" large enough to move every log-prob
        for p in s.model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    old = pol.score(pol.probe)
    pol.sync_bucket_bytes = 1 << 20  # several buckets, staged in the engine and loaded at once
    try:
        row = pol.update_weights(s.model, version=pol.version + 7)
    finally:
        pol.sync_bucket_bytes = 64 << 20
    assert row["engine/sync_buckets"] > 1
    assert row["engine/probe_max_abs_dlogp"] < TOL
    assert max_abs_diff(pol.score(pol.probe), old)[0] > 1e-2  # the engine really has new weights
    assert _sampled_gap(pol, s.model, _prompts(4, seed=2)) < TOL
    assert pol.last_version == pol.version == int(row["engine/sync_version"])


@pytest.mark.parametrize("arch", ARCHS)
def test_a_corrupted_engine_is_caught_by_the_post_sync_check(arch, engines):
    s = engines(arch)
    pol = s.policy
    pol.update_weights(s.model)
    pol.engine.call("perturb", name_part="w2_weight", scale=0.05)  # the routed experts of a layer, in place
    with pytest.raises(SyncCheckError, match=rf"weight sync to version {pol.version}\b.*beyond sync_tolerance"):
        pol.check_sync(s.model)
    pol.update_weights(s.model)  # a fresh sync repairs it


def test_the_completions_server_over_the_engine(engines, tokenizer):
    """``compactrl serve --engine vllm``'s server (and the gateway's engine): token ids over HTTP, the
    engine's ids and log-probs back, equal to the learner's within 1e-5."""
    from compactrl.policies.openai_client import OpenAICompletionsPolicy
    from compactrl.serving.batching import PolicyEngine
    from compactrl.serving.server import EngineServer, ServeConfig

    s = engines("qwen3_moe")
    s.policy.sync_weights(s.model)
    server = EngineServer(PolicyEngine(s.policy, batch_wait_ms=20), ServeConfig(port=0, model_name="engine")).start()
    try:
        client = OpenAICompletionsPolicy(server.url, "engine", tokenizer=tokenizer, context_length=8192,
                                         max_new_tokens=12)
        try:
            for p in _prompts(3, seed=4):
                g = client.complete(p, 12, seed=5)
                assert g.token_ids and len(g.token_ids) == len(g.log_probs)
                ref = learner_log_probs(s.model, [p + list(g.token_ids)])[0][len(p) - 1:]
                assert max(abs(a - b) for a, b in zip(g.log_probs, ref)) < TOL
        finally:
            client.close()
    finally:
        server.stop()  # closes the PolicyEngine's thread, not the session's engine (it does not own it)
    assert s.policy.engine.alive()


def test_seeded_prompts_longer_than_a_step_budget_generate(engines):
    """Seeded requests whose prompts add up to more than vLLM's default 4096-token step budget: with
    chunked prefill on, vLLM 0.32's CPU runner fails them ("CPU Generator does not use offset"); the
    engine's default (``enable_chunked_prefill=False``) prefills each prompt whole, and a seed still
    fixes a request's sample."""
    policy = engines("glm4_moe").policy
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 4096, (1500,), generator=g).tolist() for _ in range(4)]
    first = policy.generate(prompts, 6, seeds=[11, 12, 13, 14])
    again = policy.generate(prompts[:1], 6, seeds=[11])
    assert [len(o.token_ids) for o in first] == [6] * 4
    assert again[0].token_ids == first[0].token_ids
