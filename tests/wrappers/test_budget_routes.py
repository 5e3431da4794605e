"""MoE routes through the context-budget wrapper: a response's routes cover its prompt and its sampled ids; a
trace keeps, per position, the route of the first call that computed it, through compactions."""

from __future__ import annotations

import numpy as np
from echo_env import EchoEnv

from compactrl.tokenizer import IM_END_ID, load_tokenizer
from compactrl.types import TokenResponse
from compactrl.wrappers import ContextBudget, ContextBudgetConfig

TOK = load_tokenizer()


def route(positions, call: int) -> np.ndarray:
    """A fake sampler's routes: position p goes to experts (p % 7, call) in both MoE layers."""
    p = np.asarray(positions)
    return np.stack([p % 7, np.full_like(p, call)], -1)[:, None, :].repeat(2, 1).astype(np.uint8)


def respond(info, text: str, call: int) -> TokenResponse:
    ids = [*TOK.encode(text), IM_END_ID]
    n = len(info["prompt_token_ids"]) + len(ids)
    routes = route(range(n), call)
    routes[-1] = 255  # the last sampled token is never fed back
    return TokenResponse(text, ids, [-0.5] * len(ids), finished=True, routed_experts=routes)


def test_trace_routes_come_from_the_first_call_that_computed_each_position():
    cfg = ContextBudgetConfig(budget=1200, reserve=64, tool_output_cap=200, max_compactions=2)
    env = ContextBudget(EchoEnv(max_turns=60, max_output_chars=600), cfg, tokenizer=TOK)
    obs, info = env.reset(seed=3)
    covered: list[tuple[int, int]] = []  # per call of the current trace: (first position, end) it covers
    traces, call = [], 0
    while len(traces) < 2:
        call += 1
        text = "Facts: LIMIT = 7." if info["compaction_required"] else "<tool>view a.py 1 40</tool>"
        resp = respond(info, text, call)
        covered.append((call, len(info["prompt_token_ids"]) + len(resp.token_ids)))
        obs, _, term, trunc, info = env.step(resp)
        assert not (term or trunc)
        if "trace" in info:
            traces.append((info["trace"], covered))
            covered = []
    for tr, calls in traces:
        r = tr.routed_experts
        assert r.dtype == np.uint8 and r.shape == (len(tr), 2, 2)
        start = 0
        for c, end in calls:
            # a call is the first to compute the positions from the previous call's last sampled token
            # (which that call never fed back) up to its own last sampled token, exclusive
            assert (r[max(start - 1, 0):end - 1, :, 1] == c).all()
            start = end
        assert (r[start - 1:] == 255).all()  # the last response's last token and the turn's footer
        assert np.array_equal(r[:start - 1, 0, 0], np.arange(start - 1) % 7)
    assert len(traces[1][1]) >= 1  # the second trace started from the summary with routes of its own
