"""Routes recorded inside the vLLM engine process (``VLLMEngineConfig.capture_routes``): the mapping of
each step's flattened tokens back to requests and positions is exact (concurrent requests of different
lengths, chunked prefill), the engine's choice equals the learner's router but at near ties, and the
routes reach ``VLLMPolicy`` results in the compact ``[prompt + output, moe_layers, k]`` form that
routing replay uses. One engine per (architecture, dtype), shared by the module."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
import torch

from compactrl.policies.routing import forward_routes, moe_routers, no_route, replay_routes
from compactrl.serving.vllm.policy import learner_log_probs

pytestmark = pytest.mark.timeout(900)
logger = logging.getLogger(__name__)
NEAR_TIE = 1e-4
"""A router top-k margin below this may flip between two float32 computations (engine vs learner)."""
CHUNK = 64
"""The engine's ``max_num_batched_tokens``: prompts longer than this are prefilled in chunks."""


class Served:
    """A float32 learner model and a route-capturing engine serving it (in ``dtype``)."""

    def __init__(self, arch: str, dtype: str, tokenizer, directory) -> None:
        from compactrl.policies.tiny_moe import tiny_moe
        from compactrl.serving.vllm.policy import VLLMPolicy

        self.model = tiny_moe(arch, vocab_size=len(tokenizer), seed=3, head_dim=64)
        self.policy = VLLMPolicy.from_model(
            self.model, tokenizer, directory, seed=0,
            engine={"dtype": dtype, "capture_routes": True, "enable_prefix_caching": False,
                    "max_model_len": 1024, "enable_chunked_prefill": True,
                    "extra": {"max_num_batched_tokens": CHUNK}})


@pytest.fixture(scope="module")
def served(tokenizer, tmp_path_factory):
    """``served(arch, dtype)``: the module's engine for them (started on first use)."""
    started: dict[tuple[str, str], Served] = {}

    def get(arch: str, dtype: str = "float32") -> Served:
        if (arch, dtype) not in started:
            started[arch, dtype] = Served(arch, dtype, tokenizer, tmp_path_factory.mktemp(f"routes-{arch}-{dtype}"))
        return started[arch, dtype]

    yield get
    for s in started.values():
        s.policy.close()


def _prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 4096, (n,), generator=g).tolist() for n in lengths]


def _generate(policy, prompts, budgets):
    # no per-request seed: vLLM 0.32's CPU runner fails a seeded request whose prefill is chunked
    # ("CPU Generator does not use offset"), which these prompts are
    return policy.generate(prompts, budgets, seeds=[None] * len(prompts))


def _learner_routes_and_margin(model, seq):
    """The learner's routes of ``seq`` ``[T, layers, k]`` and each token's smallest top-k margin over the
    layers (the gap between the k-th and the (k+1)-th expert's selection score)."""
    scores = []

    def hook(router, _inputs, output):
        logits = output[0].float()
        bias = getattr(router, "e_score_correction_bias", None)
        scores.append(logits.sigmoid() + bias.float() if bias is not None else logits.softmax(-1))

    routers = moe_routers(model)
    handles = [r.register_forward_hook(hook) for r in routers]
    try:
        tokens = torch.tensor([seq])
        routes = forward_routes(model, tokens, torch.ones_like(tokens))[0]
    finally:
        for h in handles:
            h.remove()
    k = routes.shape[-1]
    margins = torch.stack([s.topk(k + 1, dim=-1).values for s in scores], 1)  # [T, layers, k + 1]
    return routes, (margins[..., k - 1] - margins[..., k]).min(-1).values


def test_concurrent_requests_map_exactly(served):
    """Prompts of different lengths (several longer than one step's token budget: chunked prefill) in one
    ``generate`` call get, at every token, the routes the same engine gives each full sequence alone."""
    s = served("glm4_moe")
    lengths = (5, 150, 17, 70, 33, 2)
    prompts = _prompts(lengths, seed=1)
    budgets = [20, 6, 30, 1, 12, 25]
    t0 = time.perf_counter()
    gens = _generate(s.policy, prompts, budgets)
    logger.info("concurrent generate with capture: %.2f s", time.perf_counter() - t0)
    layers, k = len(moe_routers(s.model)), s.model.config.num_experts_per_tok
    for p, g in zip(prompts, gens):
        full = p + g.token_ids
        r = g.routed_experts
        assert r.shape == (len(full), layers, k) and r.dtype == np.uint8
        assert (r[-1] == no_route(r.dtype)).all()  # the last sampled token is never run
        assert (r[:-1] != no_route(r.dtype)).all()  # every other token was, prompt included
        (alone,) = _generate(s.policy, [full], 1)
        assert (alone.routed_experts[:len(full)] != no_route(r.dtype)).all()
        np.testing.assert_array_equal(r[:-1], alone.routed_experts[:len(full) - 1])


@pytest.mark.parametrize("arch", ["glm4_moe", "qwen3_moe"])
def test_engine_routes_equal_the_learners_but_at_near_ties(arch, served):
    s = served(arch)
    prompts = _prompts((9, 80, 24, 41), seed=2)
    gens = _generate(s.policy, prompts, [24, 10, 18, 30])
    compared = differ = near = 0
    for p, g in zip(prompts, gens):
        full = p + g.token_ids
        learner, margin = _learner_routes_and_margin(s.model, full)
        engine = torch.from_numpy(g.routed_experts[:-1].astype(np.int64))
        learner, margin = learner[:-1], margin[:-1]
        sets_differ = (engine.sort(-1).values != learner.sort(-1).values).any(-1).any(-1)
        compared += len(engine)
        differ += int(sets_differ.sum())
        near += int((margin < NEAR_TIE).sum())
        assert not bool((sets_differ & (margin >= NEAR_TIE)).any()), \
            f"{arch}: the engine routed {int((sets_differ & (margin >= NEAR_TIE)).sum())} tokens apart from the " \
            f"learner whose top-k margin is at least {NEAR_TIE}"
    logger.warning("%s: %d of %d tokens routed apart, %d near ties (margin < %g)", arch, differ, compared, near,
                   NEAR_TIE)
    assert near <= 0.02 * compared, f"{arch}: {near} of {compared} tokens are near ties"


def test_routes_reach_the_policy_and_replay_closes_the_bf16_gap(served):
    """A bf16 engine's routes differ from the float32 learner's at some tokens; replaying them makes the
    learner route every recorded token as the engine did and moves its log-probs towards the engine's."""
    s = served("glm4_moe", "bfloat16")
    prompts = _prompts((30, 60, 12, 45, 20, 90), seed=3)
    gens = _generate(s.policy, prompts, 40)
    differ_before = tokens = 0
    gap_own, gap_replay = [], []
    for p, g in zip(prompts, gens):
        full = p + g.token_ids
        r = g.routed_experts
        assert r.shape == (len(full), len(moe_routers(s.model)), s.model.config.num_experts_per_tok)
        routes = torch.from_numpy(r)[None]
        own = forward_routes(s.model, torch.tensor([full]), torch.ones(1, len(full)))[0, :-1]
        with replay_routes(s.model, routes):
            replayed = forward_routes(s.model, torch.tensor([full]), torch.ones(1, len(full)))[0, :-1]
            lp_replay = learner_log_probs(s.model, [full])[0][len(p) - 1:]
        lp_own = learner_log_probs(s.model, [full])[0][len(p) - 1:]
        engine = torch.from_numpy(r[:-1].astype(np.int64))
        differ_before += int((engine.sort(-1).values != own.sort(-1).values).any(-1).any(-1).sum())
        assert torch.equal(replayed, engine), "replay: the learner did not route as the engine recorded"
        tokens += len(engine)
        gap_own += [abs(a - b) for a, b in zip(lp_own, g.log_probs)]
        gap_replay += [abs(a - b) for a, b in zip(lp_replay, g.log_probs)]
    mean_own, mean_replay = float(np.mean(gap_own)), float(np.mean(gap_replay))
    logger.warning("bf16 engine vs float32 learner: %d of %d tokens routed apart; mean |dlogp| %.4g own routes, "
                   "%.4g replayed (max %.4g, %.4g)", differ_before, tokens, mean_own, mean_replay, max(gap_own),
                   max(gap_replay))
    assert differ_before > 0, "the bf16 engine routed every token as the learner: nothing for replay to fix"
    assert mean_replay < mean_own
