"""MoE routes through the gateway: each call's record holds the routes of its prompt and sampled ids (written
to the session file and read back), and the traces of the session (continued calls, a sub-agent, a
compaction) carry them per position into the batch, equal to the learner's own routes."""

from __future__ import annotations

import openai
import pytest
import torch

from compactrl.gateway.recording import load_session
from compactrl.gateway.traces import build_tree, sessions_to_batch
from compactrl.policies.routing import decode_routes, forward_routes


def client(gw, session: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/s/{session}/v1", api_key="none", max_retries=0)


@pytest.mark.timeout(120)
def test_routes_are_recorded_per_call_and_reach_every_trace_of_the_session(gateway, policy):
    main, sub = client(gateway, "routes"), client(gateway, "routes")
    task = [{"role": "system", "content": "main agent"}, {"role": "user", "content": "fix the bug"}]
    r1 = main.chat.completions.create(model="tiny", messages=task, max_tokens=6)
    s1 = sub.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "sub agent"},
                                                             {"role": "user", "content": "find the file"}], max_tokens=6)
    history = task + [{"role": "assistant", "content": r1.choices[0].message.content},
                      {"role": "tool", "content": f"sub-agent says: {s1.choices[0].message.content}"}]
    main.chat.completions.create(model="tiny", messages=history, max_tokens=6)
    main.chat.completions.create(model="tiny", messages=task + [{"role": "user", "content": "summary: done x"}],
                                 max_tokens=6)
    gateway.finish_session("routes", 1.0)
    session = load_session(gateway.recorder.path("routes"))  # the routes went through the session file
    for call in session.calls:
        routes = decode_routes(call.choices[0].routed_experts)
        seq = torch.tensor([call.prompt_ids + call.choices[0].token_ids])
        full = forward_routes(policy.model, seq, torch.ones_like(seq))[0]
        have = torch.from_numpy((routes != 255).all(-1).all(-1))
        assert routes.shape == (seq.shape[1], 1, 2) and bool(have[:-1].all())
        assert torch.equal(torch.from_numpy(routes.astype("int64"))[have], full[have])
    nodes = build_tree(session)
    assert [(n.parent, n.prev, len(n.calls)) for n in nodes] == [(-1, -1, 2), (0, -1, 1), (-1, 0, 1)]
    batch = sessions_to_batch([session])
    routes = batch["routed_experts"]
    have = (routes != 255).all(-1).all(-1)
    assert bool(have[:, 0].all()) and not bool((have & ~batch["attention_mask"].bool()).any())
    # within the continued trace, the second call filled the first response's last token
    first = session.calls[0]
    assert bool(have[0, len(first.prompt_ids) + len(first.choices[0].token_ids) - 1])
    learner = forward_routes(policy.model, batch["tokens"], batch["attention_mask"])
    assert torch.equal(routes.long()[have], learner[have])
