"""MoE routes: recorded at sampling (prompt and generated tokens), carried into the trace batch, replayed in
the learner's forward, and the expert-disagreement metric."""

import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from policy_helpers import cached_tiny, right_padded

import compactrl  # noqa: F401  (registers the env ids)
from compactrl.policies.routing import (
    decode_routes,
    encode_routes,
    forward_routes,
    moe_routers,
    replay_routes,
    replay_weights,
    route_disagreement,
    route_mismatch_metrics,
)
from compactrl.policies.sampling import SamplingConfig
from compactrl.policies.transformers_policy import TransformersPolicy, generate_tokens

PROMPTS = [[5, 9, 300, 41, 7, 88, 1200, 3, 17], [12, 13, 14], [20, 21, 2200, 23, 24, 25]]
BUDGETS = [7, 10, 5]
KW = dict(num_layers=3, num_experts=8, experts_per_token=2)


def _model(arch):
    return cached_tiny(arch, **KW)


def _sample(model, *, seed=0, stop_ids=(-1,)):
    g = torch.Generator().manual_seed(seed)
    return generate_tokens(model, PROMPTS, BUDGETS, sampling=SamplingConfig(), stop_ids=stop_ids, pad_id=0,
                           generator=g)


def _as_long(routes):
    return torch.from_numpy(np.asarray(routes).astype(np.int64))


@pytest.mark.parametrize("arch", ["glm4_moe", "qwen3_moe", "mixtral"])
def test_recorded_routes_equal_a_full_forward_over_prompt_and_generated_tokens(arch):
    model = _model(arch)
    layers = len(moe_routers(model))
    assert layers == (2 if arch == "glm4_moe" else 3)  # glm4_moe's first layer is dense
    stops = range(3, 4096, 4)  # a quarter of the ids stop a row: rows leave the batch at different steps
    gens = [*_sample(model), *_sample(model, seed=1, stop_ids=stops), *_sample(model, seed=2, stop_ids=stops)]
    assert len({len(g.token_ids) for g in gens}) > 3
    for prompt, gen in zip(PROMPTS * 3, gens):
        seq = torch.tensor([prompt + gen.token_ids])
        full = forward_routes(model, seq, torch.ones_like(seq))[0]
        routes = gen.routed_experts
        assert routes.dtype == np.uint8 and routes.shape == (seq.shape[1], layers, 2)
        have = (routes != 255).all(-1).all(-1)
        assert have[:-1].all()  # every token has its route but perhaps the last one, never fed back
        assert torch.equal(_as_long(routes)[torch.from_numpy(have)], full[torch.from_numpy(have)])


def _bias_sampler(model):
    """glm4_moe: the correction bias chooses experts and plays no part in the gate weights, so a perturbed
    bias changes routes only."""
    sampler = copy.deepcopy(model)
    g = torch.Generator().manual_seed(3)
    for router in moe_routers(sampler):
        router.e_score_correction_bias.copy_(0.05 * torch.randn(router.e_score_correction_bias.shape, generator=g))
    return sampler


def _noisy_choice_sampler(model):
    """softmax routers: the experts chosen from noised probabilities, the weights as the router computes them
    for those experts (a sampler whose choice differs and nothing else)."""
    sampler = copy.deepcopy(model)
    g = torch.Generator().manual_seed(3)

    def hook(router, _inputs, output):
        logits = output[0]
        noisy = torch.softmax(logits.float(), -1) + 0.05 * torch.randn(logits.shape, generator=g)
        ids = noisy.topk(router.top_k, dim=-1).indices
        return logits, replay_weights(router, logits, ids), ids

    for router in moe_routers(sampler):
        router.register_forward_hook(hook)
    return sampler


def _learner_log_probs(learner, seqs, routes=None):
    tokens, mask = right_padded(seqs)
    batch_routes = None
    if routes is not None:
        width = tokens.shape[1]
        batch_routes = torch.full((len(seqs), width, *routes[0].shape[1:]), 255, dtype=torch.uint8)
        for i, r in enumerate(routes):
            batch_routes[i, :len(r)] = torch.from_numpy(r)
    with torch.no_grad(), replay_routes(learner.model, batch_routes):
        lp, _ = learner.log_prob(tokens, mask)
    return lp, tokens, mask


@pytest.mark.parametrize("arch", ["glm4_moe", "qwen3_moe", "mixtral"])
def test_with_replay_the_learner_reproduces_the_samplers_log_probs(arch, tokenizer):
    model = _model(arch)
    sampler = _bias_sampler(model) if arch == "glm4_moe" else _noisy_choice_sampler(model)
    gens = _sample(sampler, seed=1)
    learner = TransformersPolicy(model, tokenizer)
    seqs = [p + g.token_ids for p, g in zip(PROMPTS, gens)]
    routes = [g.routed_experts for g in gens]
    replayed, tokens, mask = _learner_log_probs(learner, seqs, routes)
    own, _, _ = _learner_log_probs(learner, seqs)
    dev_replay, dev_own = [], []
    for i, (p, g) in enumerate(zip(PROMPTS, gens)):
        sampled = torch.tensor(g.log_probs)
        dev_replay.append((replayed[i, len(p):len(p) + len(g.token_ids)] - sampled).abs().max())
        dev_own.append((own[i, len(p):len(p) + len(g.token_ids)] - sampled).abs().max())
    assert max(dev_replay) < 1e-5
    assert max(dev_own) > 1e-3
    learner_routes = forward_routes(model, tokens, mask)
    sampled_routes = torch.full(learner_routes.shape, 255, dtype=torch.uint8)
    for i, r in enumerate(routes):
        sampled_routes[i, :len(r)] = torch.from_numpy(r)
    differ, count = route_disagreement(sampled_routes, learner_routes, mask)
    assert count > 0 and differ / count > 0.1  # the routes did differ without replay


def test_router_weights_get_gradients_under_replay(tokenizer):
    model = copy.deepcopy(_model("glm4_moe"))
    gens = _sample(_bias_sampler(model), seed=2)
    learner = TransformersPolicy(model, tokenizer)
    seqs = [p + g.token_ids for p, g in zip(PROMPTS, gens)]
    tokens, mask = right_padded(seqs)
    routes = torch.full((*tokens.shape, 2, 2), 255, dtype=torch.uint8)
    for i, g in enumerate(gens):
        routes[i, :len(seqs[i])] = torch.from_numpy(g.routed_experts)
    with replay_routes(model, routes):
        lp, _ = learner.log_prob(tokens, mask)
    lp.sum().backward()
    for router in moe_routers(model):
        assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_the_critic_replays_only_through_a_shared_trunk(tokenizer):
    from compactrl.policies.critic import ValueModel
    from compactrl.policies.routing import batch_replay, critic_routers

    model = _model("glm4_moe")
    gens = _sample(_bias_sampler(model), seed=5)
    seqs = [p + g.token_ids for p, g in zip(PROMPTS, gens)]
    tokens, mask = right_padded(seqs)
    routes = torch.full((*tokens.shape, 2, 2), 255, dtype=torch.uint8)
    for i, g in enumerate(gens):
        routes[i, :len(seqs[i])] = torch.from_numpy(g.routed_experts)
    batch = {"tokens": tokens, "routed_experts": routes}
    policy = TransformersPolicy(model, tokenizer)
    for share in (True, False):
        critic = ValueModel.from_policy(policy, share_trunk=share, head_init_std=0.5)
        assert (critic_routers(critic) is critic.trunk) == share
        with torch.no_grad():
            plain = critic.value(tokens, mask)
            with batch_replay(critic_routers(critic), batch):
                replayed = critic.value(tokens, mask)
        assert torch.equal(plain, replayed) != share  # a separate critic's routers are its own


def test_replay_of_the_learners_own_routes_changes_nothing(tokenizer):
    model = _model("qwen3_moe")
    learner = TransformersPolicy(model, tokenizer)
    tokens, mask = right_padded([p + [7, 8] for p in PROMPTS])
    routes = forward_routes(model, tokens, mask)
    with torch.no_grad():
        plain, _ = learner.log_prob(tokens, mask)
        with replay_routes(model, routes):  # -1 at padding: the router's own choice stands there
            replayed, _ = learner.log_prob(tokens, mask)
    assert torch.equal(plain, replayed)


def test_routes_encode_and_decode_exactly():
    rng = np.random.default_rng(0)
    small = rng.integers(0, 8, (11, 3, 2)).astype(np.uint8)
    small[-1] = 255
    big = rng.integers(0, 300, (5, 2, 4)).astype(np.int16)
    big[0, 1] = -1
    for arr in (small, big):
        back = decode_routes(encode_routes(arr))
        assert back.dtype == arr.dtype and np.array_equal(back, arr)
    assert encode_routes(None) is None and decode_routes(None) is None


def test_an_engines_routes_take_the_in_process_shape():
    from compactrl.policies.routing import prompt_and_output_routes

    vllm_like = [[[1, 2]], [[3, 0]], [[2, 1]]]  # [seq_len, layers, k]: prompt of 2 + output of 2, the last never run
    got = prompt_and_output_routes(vllm_like, 4)
    assert got.dtype == np.uint8 and got.tolist() == [[[1, 2]], [[3, 0]], [[2, 1]], [[255, 255]]]
    with pytest.raises(ValueError, match="routed_experts"):
        prompt_and_output_routes(vllm_like, 2)


def test_an_engines_per_decoder_layer_routes_keep_the_moe_layers(tmp_path):
    from compactrl.policies.routing import checkpoint_moe_layers, moe_layer_indices, prompt_and_output_routes

    glm = _model("glm4_moe")  # 3 decoder layers, the first dense
    assert moe_layer_indices(glm) == [1, 2] and moe_layer_indices(_model("qwen3_moe")) == [0, 1, 2]
    glm.save_pretrained(tmp_path / "glm")
    assert checkpoint_moe_layers(str(tmp_path / "glm")) == [1, 2]
    per_decoder_layer = [[[0, 0], [1, 2], [3, 4]], [[0, 0], [5, 6], [7, 0]]]  # vLLM: dense layer 0 left at 0
    got = prompt_and_output_routes(per_decoder_layer, 3, [1, 2])
    assert got.tolist() == [[[1, 2], [3, 4]], [[5, 6], [7, 0]], [[255, 255], [255, 255]]]


# -- through the wrapper, the collector and the metrics ------------------------------------------------

RESERVE, CAP = 24, 64


def _env(tokenizer):
    kw = dict(max_turns=5, reserve=RESERVE, tool_output_cap=CAP, tokenizer=tokenizer)
    probe = gym.make("CompactCode-v0", budget=8192, **kw)
    _, info = probe.reset(seed=0)
    budget = len(info["prompt_token_ids"]) + 2 * RESERVE + CAP + 250
    return gym.make("CompactCode-v0", budget=budget, max_compactions=2, **kw)


@pytest.fixture(scope="module")
def collected(tokenizer):
    from compactrl.collectors.trace_collector import TraceCollector

    model = cached_tiny("glm4_moe", **KW)
    policy = TransformersPolicy(model, tokenizer, max_new_tokens=RESERVE, seed=0)
    collector = TraceCollector([lambda: _env(tokenizer)], policy, episodes_per_batch=1, seed=5, pad_id=0,
                               give_task_to_policy=False)
    try:
        batch = collector.next()
    finally:
        collector.shutdown()
    return policy, batch


@pytest.mark.slow  # an episode of the tiny model with compactions: ~35 s on 2 loaded cores
def test_routes_survive_into_the_trace_batch_and_equal_the_learners(collected):
    policy, batch = collected
    routes = batch["routed_experts"]
    assert routes.dtype == torch.uint8 and routes.shape == (*batch["tokens"].shape, 2, 2)
    assert bool((batch["num_traces"] > 1).any())  # an episode compacted: routes cross a segment boundary
    have = (routes != 255).all(-1).all(-1)
    real = batch["attention_mask"].bool()
    assert not bool((have & ~real).any())  # padding has no route
    # every policy token has its route but perhaps a trace's last one (the sampler never fed it back)
    pmask = batch["policy_mask"].bool()
    last = pmask.long().cumsum(-1) == pmask.sum(-1, keepdim=True)
    assert bool((have | ~pmask | last).all())
    assert bool(have[:, 0].all())  # prompts too
    learner = forward_routes(policy.model, batch["tokens"], batch["attention_mask"])
    assert torch.equal(routes.long()[have], learner[have])


@pytest.mark.slow
def test_every_mismatch_metric_is_zero_when_sampler_and_learner_are_one_computation(collected):
    from compactrl.training.rollouts import engine_mismatch, route_mismatch

    policy, batch = collected
    routes = route_mismatch(policy, batch)
    assert routes["mismatch/route_tokens"] > 0
    assert {k: v for k, v in routes.items() if "disagree" in k} == {
        k: 0.0 for k in routes if "disagree" in k} and "mismatch/route_disagree_task" in routes
    m = engine_mismatch(policy, batch)
    assert m["mismatch/k3"] < 1e-10 and m["mismatch/max_abs_dlogp"] < 1e-4
    assert all(m[k] == 0.0 for k in m if "disagree" in k) and "mismatch/route_disagree_all" in m


def test_the_disagreement_is_split_by_summary_and_task_tokens():
    tokens = torch.zeros(1, 4, dtype=torch.long)
    batch = {"tokens": tokens, "attention_mask": torch.ones(1, 4, dtype=torch.bool),
             "policy_mask": torch.tensor([[False, True, True, True]]),
             "summary_mask": torch.tensor([[False, False, True, True]]),
             "routed_experts": torch.tensor([[[[0, 1]], [[2, 3]], [[1, 0]], [[4, 5]]]], dtype=torch.uint8)}
    learner = torch.tensor([[[[1, 0]], [[2, 4]], [[0, 1]], [[4, 5]]]])  # token 1 differs; order never counts
    m = route_mismatch_metrics(batch, learner)
    assert m == {"mismatch/route_disagree_task": 1.0, "mismatch/route_disagree_summary": 0.0,
                 "mismatch/route_disagree_all": 0.25, "mismatch/route_tokens": 4.0}


def test_the_routing_replay_setting_changes_the_update(tokenizer):
    from compactrl.training.config import RLConfig
    from compactrl.training.update import Updater

    base = _model("glm4_moe")
    gens = _sample(_bias_sampler(base), seed=4)
    seqs = [p + g.token_ids for p, g in zip(PROMPTS, gens)]
    tokens, mask = right_padded(seqs)
    routes = torch.full((*tokens.shape, 2, 2), 255, dtype=torch.uint8)
    policy_mask = torch.zeros_like(mask)
    sample_lp = torch.zeros(tokens.shape)
    for i, (p, g) in enumerate(zip(PROMPTS, gens)):
        routes[i, :len(seqs[i])] = torch.from_numpy(g.routed_experts)
        policy_mask[i, len(p):len(seqs[i])] = True
        sample_lp[i, len(p):len(seqs[i])] = torch.tensor(g.log_probs)
    from tensordict import TensorDict

    batch = TensorDict({"tokens": tokens, "attention_mask": mask, "policy_mask": policy_mask,
                        "summary_mask": torch.zeros_like(mask), "sample_log_prob": sample_lp,
                        "advantage": policy_mask.float(), "routed_experts": routes}, batch_size=[len(seqs)])
    out = {}
    for replay in (False, True):
        policy = TransformersPolicy(copy.deepcopy(base), tokenizer)
        rl = RLConfig(algo="grpo", episodes_per_iter=4, group_size=2, routing_replay=replay, epochs=1,
                      minibatches=1)
        upd = Updater(rl, policy, None)
        assert upd.loss.routing_replay is replay
        stats = upd.update(batch)
        out[replay] = (stats["policy/ratio_mean"], torch.cat([p.detach().flatten() for p in policy.parameters()]))
    assert abs(out[True][0] - 1.0) < 1e-5  # replayed: the learner's log-probs are the sampler's
    assert abs(out[False][0] - 1.0) > 1e-4
    assert not torch.equal(out[True][1], out[False][1])
    with pytest.raises(ValueError, match="rl.routing_replay"):
        RLConfig(routing_replay="yes")
    assert math.isfinite(out[True][0])
