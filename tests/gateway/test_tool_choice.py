"""``tool_choice``: validation as vLLM's server does it, the tool-call grammar, the masked sampler,
and the rejection path for engines without logits."""

from __future__ import annotations

import json
from concurrent.futures import Future

import openai
import pytest
from gateway_helpers import masked_log_probs
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.gateway import Gateway, GatewayConfig
from compactrl.gateway.chat import parse_tool_calls
from compactrl.gateway.constrain import (
    TokenMasks,
    ToolCallGrammar,
    constrained_generate,
    parse_tool_choice,
)
from compactrl.gateway.recording import load_session
from compactrl.policies.sampling import Generated, SamplingConfig
from compactrl.serving.completions import RequestError
from compactrl.serving.server import ServeConfig

ANSWER = {"type": "function", "function": {"name": "final_answer", "parameters": {
    "type": "object", "properties": {"answer": {"type": "string"}, "n": {"type": "integer"}}, "required": ["answer"]}}}
BASH = {"type": "function", "function": {"name": "bash", "parameters": {}}}
COUNT = {"type": "function", "function": {"name": "count", "parameters": {  # short answers: a boolean
    "type": "object", "properties": {"up": {"type": "boolean"}}, "required": ["up"]}}}
TOOLS = [ANSWER, BASH]


def call_text(*calls: tuple[str, dict]) -> str:
    return "\n".join("<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>" for n, a in calls)


def accepts(grammar: ToolCallGrammar, text: str) -> bool:
    state = grammar.feed(grammar.start, text)
    return state is not None and grammar.accepting(state)


# -- validation -----------------------------------------------------------------------------------


def test_tool_choice_values():
    assert parse_tool_choice(None, TOOLS) is None and parse_tool_choice("auto", None) is None
    assert parse_tool_choice("none", TOOLS) is None
    req = parse_tool_choice("required", TOOLS)
    assert req.names == ("final_answer", "bash") and req.multiple and req.label == "required"
    named = parse_tool_choice({"type": "function", "function": {"name": "bash"}}, TOOLS)
    assert named.names == ("bash",) and not named.multiple and named.label == "function:bash"


@pytest.mark.parametrize("choice,tools,word", [
    ("required", None, "`tools` must be set"),
    ("required", [], "`tools` must be set"),
    ({"type": "function", "function": {"name": "bash"}}, None, "`tools` must be set"),
    ({"type": "function", "function": {"name": "ls"}}, TOOLS, "does not match any of the specified `tools`"),
    ({"type": "function", "function": {}}, TOOLS, "Invalid `tool_choice`"),
    ({"type": "web_search"}, TOOLS, "Invalid `tool_choice`"),
    ("any", TOOLS, "Invalid value for `tool_choice`"),
])
def test_bad_tool_choice_is_a_400_naming_the_field(choice, tools, word):
    with pytest.raises(RequestError) as info:
        parse_tool_choice(choice, tools)
    assert info.value.status == 400 and info.value.param == "tool_choice" and word in str(info.value)


# -- the grammar ----------------------------------------------------------------------------------

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                           | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)


@settings(max_examples=40, deadline=None)
@given(answer=st.text(max_size=12), n=st.none() | st.integers(), bash_args=st.dictionaries(st.text(max_size=4),
       json_values, max_size=3), both=st.booleans())
def test_the_grammar_accepts_calls_of_offered_tools_and_all_their_prefixes(answer, n, bash_args, both):
    grammar = ToolCallGrammar(parse_tool_choice("required", TOOLS))
    args = {"answer": answer} | ({"n": n} if n is not None else {})
    calls = [("final_answer", args)] + ([("bash", bash_args)] if both else [])
    text = call_text(*calls)
    assert accepts(grammar, text)
    state = grammar.start
    for ch in text:  # every prefix is inside the language (what the masks rely on)
        state = grammar.step(state, ch)
        assert state is not None
    content, parsed = parse_tool_calls(text)
    assert content == "" and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed] == \
        [(name, json.loads(json.dumps(a))) for name, a in calls]


@pytest.mark.parametrize("text", [
    call_text(("ls", {})),                                                  # not offered
    call_text(("final_answer", {})),                                        # a required key missing
    call_text(("final_answer", {"answer": 1})),                             # wrong type
    call_text(("final_answer", {"answer": "a", "n": 1.5})),                 # integer expected
    call_text(("final_answer", {"answer": "a", "x": 1})),                   # undeclared key
    call_text(("final_answer", {"answer": "a"}))[:-1],                      # unfinished
    call_text(("bash", {})) + "\n",                                         # a dangling separator
    call_text(("bash", {})).replace('": ', '":'),                           # other separators
    call_text(("bash", {"a": 1})).replace("1", "01"),                       # not JSON
    "hello " + call_text(("bash", {})),                                     # text before the call
])
def test_the_grammar_rejects(text):
    assert not accepts(ToolCallGrammar(parse_tool_choice("required", TOOLS)), text)


def test_a_named_function_is_one_call_of_it():
    grammar = ToolCallGrammar(parse_tool_choice({"type": "function", "function": {"name": "bash"}}, TOOLS))
    assert accepts(grammar, call_text(("bash", {"cmd": "ls"})))
    assert not accepts(grammar, call_text(("final_answer", {"answer": "x"})))
    assert not accepts(grammar, call_text(("bash", {}), ("bash", {})))


# -- the masked sampler ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.7), SamplingConfig(temperature=0.0)])
def test_constrained_samples_stay_in_the_grammar_with_masked_log_probs(policy, gateway, sampling):
    import torch

    choice = parse_tool_choice({"type": "function", "function": {"name": "count"}}, [COUNT, BASH])
    masks = TokenMasks(ToolCallGrammar(choice), policy.tokenizer, policy.stop_token_ids,
                       policy.tokenizer.all_special_ids)
    prompt = gateway.fmt.prefix("You count.", "Count to three.")
    for seed in range(1 if sampling.greedy else 2):
        gen = constrained_generate(policy.model, prompt, 100, masks=masks, sampling=sampling, report=sampling,
                                   stop_ids=policy.stop_token_ids, generator=torch.Generator().manual_seed(seed))
        assert gen.finished, gateway.fmt.decode(gen.token_ids)
        text = gateway.fmt.decode(gen.token_ids[:-1])
        _, calls = parse_tool_calls(text)
        assert [c["function"]["name"] for c in calls] == ["count"]
        assert isinstance(json.loads(calls[0]["function"]["arguments"])["up"], bool)
        want = masked_log_probs(policy, masks, prompt, gen.token_ids, temperature=sampling.logprob_temperature)
        assert max(abs(a - b) for a, b in zip(want, gen.log_probs)) < 1e-4
        assert all(lp <= 1e-6 for lp in gen.log_probs)


@pytest.mark.timeout(120)
def test_a_named_function_through_the_gateway_is_a_recorded_call(gateway):
    client = openai.OpenAI(base_url=f"{gateway.url}/s/named/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "count"}], tools=[COUNT, BASH], max_tokens=100, seed=1,
        tool_choice={"type": "function", "function": {"name": "count"}}, logprobs=True, extra_body={
            "return_token_ids": True})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and [c.function.name for c in choice.message.tool_calls] == ["count"]
    gateway.finish_session("named", 0.0)
    (call,) = load_session(gateway.recorder.path("named")).calls
    assert call.sampling["tool_choice"] == "function:count" and call.sampling["constrained"] == "masked"
    assert call.choices[0].token_ids == choice.token_ids
    assert call.choices[0].log_probs == pytest.approx([e.logprob for e in choice.logprobs.content][:len(
        call.choices[0].log_probs)], abs=1e-6)


# -- engines without logits: rejection ------------------------------------------------------------


class CannedEngine:
    """An engine without ``submit_constrained`` that answers the given texts in turn."""

    def __init__(self, tokenizer, texts: list[str]) -> None:
        from compactrl.wrappers.chat_format import chat_format

        self.tokenizer, self.context_length = tokenizer, 4096
        self.fmt = chat_format(tokenizer)
        self.stop_ids = tuple(sorted(self.fmt.stop_ids))
        self.texts, self.submitted = list(texts), 0

    def submit(self, jobs):
        out = []
        for _ in jobs:
            ids = self.fmt.encode(self.texts.pop(0)) + [self.fmt.end_of_turn]
            f: Future = Future()
            f.set_result(Generated(ids, [-0.5] * len(ids), True))
            out.append(f)
            self.submitted += 1
        return out

    def close(self) -> None:
        pass


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tries,answers_call", [(4, True), (2, False)])
def test_rejection_keeps_the_first_sample_that_is_a_call(policy, tmp_path, tries, answers_call):
    call = call_text(("bash", {"cmd": "ls"}))
    engine = CannedEngine(policy.tokenizer, ["not a call", call_text(("ls", {})), call])
    config = GatewayConfig(serve=ServeConfig(port=0, model_name="tiny"), record_dir=str(tmp_path),
                           tool_choice_tries=tries)
    with Gateway(engine, config) as gw:
        r = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="none", max_retries=0).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice="required")
        gw.finish_session("default", 0.0)
        (record,) = load_session(gw.recorder.path("default")).calls
    msg = r.choices[0].message
    assert record.sampling["constrained"] == "rejection" and engine.submitted == min(tries, 3)
    if answers_call:
        assert [c.function.name for c in msg.tool_calls] == ["bash"]
        assert record.choices[0].token_ids == engine.fmt.encode(call) + [engine.fmt.end_of_turn]
    else:  # out of tries: the last sample is the answer, as it came
        assert msg.tool_calls is None or [c.function.name for c in msg.tool_calls] == ["ls"]
