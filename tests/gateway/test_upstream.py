"""The gateway in front of an upstream ``/v1/completions`` engine (``compactrl serve``) by URL."""

from __future__ import annotations

import socket

import openai
import pytest
from gateway_helpers import rescore_error

from compactrl.gateway import Gateway, GatewayConfig, UpstreamEngine
from compactrl.gateway.recording import load_session
from compactrl.serving.server import ServeConfig, make_server


@pytest.mark.timeout(180)
def test_chat_through_an_upstream_engine_records_exact_ids(policy, tmp_path):
    with make_server(policy, ServeConfig(port=0, model_name="upstream", threads=1)) as upstream:
        engine = UpstreamEngine(upstream.url, "upstream", policy.tokenizer, context_length=policy.context_length)
        config = GatewayConfig(serve=ServeConfig(port=0, model_name="tiny"), record_dir=str(tmp_path))
        with Gateway(engine, config) as gw:
            c = openai.OpenAI(base_url=f"{gw.url}/s/up/v1", api_key="none", max_retries=0)
            msgs = [{"role": "user", "content": "hello"}]
            r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8, n=2, logprobs=True)
            assert len(r.choices) == 2
            msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "go"}]
            c.chat.completions.create(model="tiny", messages=msgs, max_tokens=8)
            with pytest.raises(openai.BadRequestError, match="not forwarded"):
                c.chat.completions.create(model="tiny", messages=msgs, max_tokens=2, logprobs=True, top_logprobs=2)
            gw.finish_session("up", 1.0)
            session = load_session(gw.recorder.path("up"))
    assert [len(call.choices) for call in session.calls] == [2, 1]
    for call in session.calls:
        for ch in call.choices:
            assert rescore_error(policy, call.prompt_ids, ch.token_ids, ch.log_probs) < 1e-4
    # the second prompt extends the first prompt + the sampled ids of the choice the client kept
    first = session.calls[0]
    kept = first.prompt_ids + first.choices[0].token_ids
    assert session.calls[1].prompt_ids[:len(kept)] == kept


@pytest.mark.timeout(120)
def test_without_upstream_model_the_one_served_model_is_picked_and_said(policy, capsys):
    from compactrl.gateway.app import upstream_model

    with make_server(policy, ServeConfig(port=0, model_name="upstream", threads=1)) as upstream:
        assert upstream_model(upstream.url, policy.tokenizer) == "upstream"
        assert f"--upstream-model upstream (the one model {upstream.url} lists)" in capsys.readouterr().out
    with socket.socket() as closed:  # bound, never listening: connections are refused, and the port stays ours
        closed.bind(("127.0.0.1", 0))
        with pytest.raises(ValueError, match="--upstream-model: not given, and .* did not list its models"):
            upstream_model(f"http://127.0.0.1:{closed.getsockname()[1]}", policy.tokenizer)
