"""The gateway through the official ``openai`` SDK: chat, tools, streaming, n > 1, logprobs, errors,
and what it records."""

from __future__ import annotations

import json

import openai
import pytest
import requests
import torch
from gateway_helpers import rescore_error

from compactrl.algos.tree_gae import tree_gae
from compactrl.gateway.chat import (
    ChatRequest,
    SampledTurns,
    assistant_key,
    parse_tool_calls,
    prompt_ids,
    render_tool_calls,
)
from compactrl.gateway.recording import load_session
from compactrl.gateway.traces import build_tree, sessions_to_batch

BASH = {"type": "function", "function": {"name": "bash", "description": "run a command",
                                         "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


def client(gw, session: str, **headers) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/s/{session}/v1", api_key="none", max_retries=0,
                         default_headers=headers or None)


def finished(gw, session: str, reward: float = 1.0):
    gw.finish_session(session, reward)
    return load_session(gw.recorder.path(session))


@pytest.mark.timeout(120)
def test_chat_logprobs_and_n_are_recorded_exactly(gateway, policy):
    c = client(gateway, "chat-n")
    r = c.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "be brief"},
                                                          {"role": "user", "content": "hello"}],
                                  n=3, max_tokens=12, logprobs=True, top_logprobs=2, temperature=0.8)
    assert len(r.choices) == 3 and r.usage.completion_tokens == sum(len(ch.logprobs.content) for ch in r.choices)
    for ch in r.choices:
        for entry in ch.logprobs.content:
            assert len(entry.top_logprobs) == 2 and entry.logprob <= 0
    session = finished(gateway, "chat-n")
    (call,) = session.calls
    assert call.route == "chat" and len(call.choices) == 3 and call.policy_version == 0
    assert call.sampling["temperature"] == 0.8
    tok = policy.tokenizer
    assert tok.decode(call.prompt_ids).endswith("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    for ch, sampled in zip(r.choices, call.choices):
        assert [e.logprob for e in ch.logprobs.content] == pytest.approx(sampled.log_probs, abs=1e-6)
        # recorded ids re-score to recorded log-probs under the sampling temperature
        assert rescore_error(policy, call.prompt_ids, sampled.token_ids, sampled.log_probs, temperature=0.8) < 1e-4


@pytest.mark.timeout(120)
def test_recorded_ids_rescore_and_multi_turn_history_extends_one_trace(gateway, policy):
    c = client(gateway, "turns")
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    for turn in range(3):
        r = c.chat.completions.create(model="tiny", messages=messages, max_tokens=10)
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": f"observation {turn}"}]
    session = finished(gateway, "turns", 0.0)
    with pytest.raises(openai.ConflictError, match="finished"):  # a finished session takes no more calls
        c.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    for call in session.calls:
        ch = call.choices[0]
        assert rescore_error(policy, call.prompt_ids, ch.token_ids, ch.log_probs) < 1e-4
    (trace,) = build_tree(session)  # every prompt extends the previous prompt + sampled ids
    assert sum(trace.policy_mask) == sum(len(call.choices[0].token_ids) for call in session.calls)
    assert trace.token_ids[:len(session.calls[-1].prompt_ids)] == session.calls[-1].prompt_ids


@pytest.mark.timeout(120)
def test_streaming_matches_the_recorded_response(gateway, policy):
    c = client(gateway, "stream")
    chunks = list(c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=15, stream=True, logprobs=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    lps = [e.logprob for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert chunks[-1].usage is not None and len(reasons) == 1
    (call,) = finished(gateway, "stream").calls
    ch = call.choices[0]
    body = ch.token_ids[:-1] if ch.finished else ch.token_ids
    assert text == policy.tokenizer.decode(body) and lps == pytest.approx(ch.log_probs, abs=1e-6)
    assert chunks[-1].usage.completion_tokens == len(ch.token_ids)


def test_tool_format_parses_renders_and_keeps_malformed_calls_as_content():
    text = 'let me look\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "let me look" and calls[0]["function"]["name"] == "bash"
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": "ls -la"}
    assert parse_tool_calls(render_tool_calls([("bash", '{"command": "ls -la"}')]))[1][0]["function"]["name"] == "bash"
    broken = "<tool_call>{not json}</tool_call>"
    assert parse_tool_calls(broken) == (broken, [])


@pytest.mark.timeout(120)
def test_tools_in_the_prompt_and_tool_calls_in_the_history(gateway, policy):
    c = client(gateway, "tools")
    history = [{"role": "user", "content": "list files"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"}]
    r = c.chat.completions.create(model="tiny", messages=history, tools=[BASH], max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    (call,) = finished(gateway, "tools").calls
    prompt = policy.tokenizer.decode(call.prompt_ids)
    assert '<tools>\n{"type": "function", "function": {"name": "bash"' in prompt
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>' \
        in prompt and "<|im_start|>tool\na.py\nb.py<|im_end|>" in prompt
    # a tool call the model itself produced comes back as its sampled ids, not re-tokenised text
    turns = SampledTurns()
    req = ChatRequest(messages=[{"role": "user", "content": "x"}], tools=[BASH])
    turns.put(assistant_key(None, [("bash", '{"command":"ls"}')]), [11, 12, 13, 2], True)
    follow = ChatRequest(messages=[*req.messages, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]}],
        tools=[BASH])
    ids = prompt_ids(gateway.fmt, follow, turns)
    base = prompt_ids(gateway.fmt, req, turns)
    assert ids[:len(base) + 4] == [*base, 11, 12, 13, 2]


@pytest.mark.parametrize("kwargs,error,word", [
    (dict(model="nope"), openai.NotFoundError, "does not exist"),
    (dict(messages=[]), openai.BadRequestError, "'messages'"),
    (dict(temperature=-1), openai.BadRequestError, "'temperature'"),
    (dict(n=9), openai.BadRequestError, "'n' must be at most 4"),
    (dict(max_tokens=100_000), openai.BadRequestError, "maximum context length"),
    (dict(top_logprobs=3), openai.BadRequestError, "needs 'logprobs'"),
    (dict(tool_choice="required"), openai.BadRequestError, "`tools` must be set"),
    (dict(tool_choice={"type": "function", "function": {"name": "ls"}}, tools=[BASH]), openai.BadRequestError,
     "does not match any of the specified `tools`"),
    (dict(tool_choice="any", tools=[BASH]), openai.BadRequestError, "Invalid value for `tool_choice`"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     openai.BadRequestError, "text content parts"),
])
@pytest.mark.timeout(60)
def test_errors_are_4xx_with_a_message(gateway, kwargs, error, word):
    args = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4) | kwargs
    with pytest.raises(error) as info:
        client(gateway, "errors").chat.completions.create(**args)
    assert word in info.value.message


@pytest.mark.timeout(60)
def test_malformed_bodies_do_not_kill_the_server(gateway):
    url = f"{gateway.url}/v1/chat/completions"
    assert requests.post(url, data=b"{oops", headers={"Content-Type": "application/json"}, timeout=10).status_code == 400
    assert requests.post(url, json=[1, 2], timeout=10).status_code == 400
    assert requests.post(url, json={"messages": [{"role": "wizard", "content": "x"}]}, timeout=10).status_code == 400
    assert requests.post(url, json={"messages": [{"role": "user", "content": "x" * 300_000}]}, timeout=10).status_code == 413
    assert requests.post(f"{gateway.url}/s/..%2Fetc/v1/chat/completions", json={"messages": [
        {"role": "user", "content": "x"}]}, timeout=10).status_code in (400, 404)
    ok = requests.post(url, json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
                       headers={"X-Session-Id": "after-errors"}, timeout=30)
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["role"] == "assistant"
    assert requests.get(f"{gateway.url}/health", timeout=5).status_code == 200


@pytest.mark.timeout(120)
def test_compaction_and_a_sub_agent_become_a_trace_tree(gateway, policy):
    main = client(gateway, "tree")
    sub = client(gateway, "tree")
    task = [{"role": "system", "content": "main agent"}, {"role": "user", "content": "fix the bug"}]
    r1 = main.chat.completions.create(model="tiny", messages=task, max_tokens=6)
    # a sub-agent: another conversation root, called while the main agent waits
    s1 = sub.chat.completions.create(model="tiny", messages=[{"role": "system", "content": "sub agent"},
                                                             {"role": "user", "content": "find the file"}], max_tokens=6)
    history = task + [{"role": "assistant", "content": r1.choices[0].message.content},
                      {"role": "tool", "content": f"sub-agent says: {s1.choices[0].message.content}"}]
    main.chat.completions.create(model="tiny", messages=history, max_tokens=6)
    # the main agent compacts: system + task + summary, no longer an extension
    main.chat.completions.create(model="tiny", messages=task + [{"role": "user", "content": "summary: done x"}],
                                 max_tokens=6)
    session = finished(gateway, "tree", 1.0)
    nodes = build_tree(session)
    assert [(n.parent, n.prev, len(n.calls)) for n in nodes] == [(-1, -1, 2), (0, -1, 1), (-1, 0, 1)]
    assert nodes[1].spawn_position == len(session.calls[0].prompt_ids) + len(session.calls[0].choices[0].token_ids) - 1
    batch = sessions_to_batch([session])
    assert batch["parent_trace"].tolist() == [-1, 0, -1] and batch["prev_trace"].tolist() == [-1, -1, 0]
    assert float(batch["reward"][2].sum()) == 1.0 and bool(batch["terminated"].all())
    for row, node in enumerate(nodes):  # the batch holds the exact recorded ids and log-probs
        assert batch["tokens"][row, :len(node.token_ids)].tolist() == node.token_ids
        recorded = [lp for c in session.calls if c.index in node.calls for lp in c.choices[0].log_probs]
        assert batch["sample_log_prob"][row][batch["policy_mask"][row]].tolist() == pytest.approx(recorded, abs=1e-6)
    batch.set("value", torch.zeros(batch["tokens"].shape))
    adv = tree_gae(batch, gamma=1.0, lmbda=1.0)["advantage"]
    assert bool((adv[batch["policy_mask"]] == 1.0).all())
