"""smolagents' ``ToolCallingAgent`` from PyPI, unmodified, through the gateway: its calls ask for
``tool_choice="required"``, every answer is a call of a tool it offered (or cut by the token limit),
and every call is recorded with the sampled ids and their log-probs under the masked distribution."""

from __future__ import annotations

import logging

import pytest
from gateway_helpers import masked_log_probs

from compactrl.gateway.recording import load_session

smolagents = pytest.importorskip("smolagents", reason="smolagents is not installed (pip install -e '.[test]')")


@smolagents.tool
def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: the text whose words are counted.
    """
    return len(text.split())


@pytest.mark.timeout(300)
def test_tool_calling_agent_runs_through_the_gateway(gateway, policy):
    model = smolagents.OpenAIServerModel(model_id="tiny", api_base=f"{gateway.url}/s/smolagents/v1",
                                         api_key="none", max_tokens=128, temperature=1.0)
    agent = smolagents.ToolCallingAgent(tools=[word_count], model=model, max_steps=3, verbosity_level=0)
    logging.getLogger("smolagents").setLevel(logging.ERROR)
    agent.run("How many words are in 'the quick brown fox'?")  # random answers: errors are observations
    steps = [s for s in agent.memory.steps if isinstance(s, smolagents.ActionStep)]
    # every call was answered (an HTTP error would be an AgentGenerationError); random arguments may
    # fail as tool calls, which the agent sees as observations
    assert steps and not any(isinstance(s.error, smolagents.utils.AgentGenerationError) for s in steps)
    assert all(s.token_usage is not None and s.token_usage.output_tokens > 0 for s in steps)

    gateway.finish_session("smolagents", 0.0)
    calls = load_session(gateway.recorder.path("smolagents")).calls
    constrained = [c for c in calls if c.sampling.get("tool_choice") == "required"]
    # three action steps asked for a call; the last, after the step limit, asks for a plain final answer
    assert len(calls) == len(steps) == 4 and len(constrained) == 3
    assert all(c.sampling["constrained"] == "masked" for c in constrained)
    (masks,) = gateway.engine._masks.values()  # the one tool set this module offered
    assert set(masks.grammar.choice.names) == set(agent.tools)
    grammar = masks.grammar
    fmt = gateway.fmt
    for call in constrained:
        (choice,) = call.choices
        state = grammar.feed(grammar.start, fmt.decode(choice.token_ids[:-1] if choice.finished else choice.token_ids))
        assert state is not None  # the text stays inside the tool-call language, whole when finished
        assert grammar.accepting(state) == choice.finished
        want = masked_log_probs(policy, masks, call.prompt_ids, choice.token_ids)
        assert max(abs(a - b) for a, b in zip(want, choice.log_probs)) < 1e-4
    for step in steps:  # the calls the agent ran (random arguments: they may fail, as observations)
        assert all(tc.name in agent.tools for tc in step.tool_calls or [])
