"""Any ``str`` action is an observation, never an exception: lone surrogates, control characters,
invalid UTF-8 decoded with ``surrogateescape``, inside and outside tool calls, on both registered
envs behind the context-budget wrapper and bare."""

from __future__ import annotations

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactrl  # noqa: F401  (registers the ids)
from compactrl.tokenizer import VOCAB_SIZE
from compactrl.wrappers.chat_format import valid_unicode

pytestmark = pytest.mark.timeout(300)

# Every unicode category, surrogates (Cs) included, plus arbitrary bytes decoded as a shell's
# output would be (surrogateescape) and a few control characters on their own.
ANY_CHARS = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=120)
ESCAPED_BYTES = st.binary(max_size=60).map(lambda b: b.decode("utf-8", "surrogateescape"))
CONTROLS = st.text(alphabet=st.sampled_from("\x00\x01\x07\x08\x1b\x7f\r\t\n\u2028\ufeff\ud800\udfff"), max_size=20)
HOSTILE = st.one_of(ANY_CHARS, ESCAPED_BYTES, CONTROLS)
TOOL_CALLS = (
    "{}",
    "<tool>view {}</tool>",
    "<tool>search {}</tool>",
    "<tool>shell echo {}</tool>",
    "<tool>create notes/{}.txt\n<content>\n{}\n</content>\n</tool>",
    "<tool>create README.md\n<content>\n{}\n</content>\n</tool>",
    "<tool>replace README.md\n<old>\n{}\n</old>\n<new>\n{}\n</new>\n</tool>",
)
ACTIONS = st.builds(lambda form, text: form.format(text, text), st.sampled_from(TOOL_CALLS), HOSTILE)
ENVS = {
    "CompactCode-v0": gym.make("CompactCode-v0", difficulty="easy", max_turns=8),
    "CompactTerminal-v0": gym.make("CompactTerminal-v0", difficulty="easy", max_turns=8),
    # small budget and cap: summaries are requested (and written with hostile text) within a few steps
    "CompactCode-v0 small budget": gym.make("CompactCode-v0", difficulty="easy", max_turns=8, budget=1000,
                                            reserve=64, tool_output_cap=64),
}
BARE = {name: gym.make(name, context_budget=None, difficulty="easy", max_turns=8)
        for name in ("CompactCode-v0", "CompactTerminal-v0")}


def _play(env, actions, seed):
    obs, info = env.reset(seed=seed)
    steps = []
    for action in actions:
        assert env.action_space.contains(action)
        obs, reward, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs)
        assert reward in (0.0, 1.0)
        steps.append((obs, info))
        if terminated or truncated:
            break
    return steps


@pytest.mark.parametrize("name", sorted(ENVS))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=st.lists(ACTIONS, min_size=1, max_size=8), seed=st.integers(0, 2**31 - 1))
def test_any_str_action_is_an_observation_behind_the_wrapper(name, actions, seed):
    env = ENVS[name]
    budget = env.get_wrapper_attr("config").budget
    for obs, info in _play(env, actions, seed):
        # what the wrapper shows is what its ids encode: valid unicode, ids inside the vocabulary
        assert all(valid_unicode(m["content"]) == m["content"] for m in obs)
        assert "trace" in info or (info["context_tokens"] <= budget
                                   and all(0 <= i < VOCAB_SIZE for i in info["prompt_token_ids"]))


@pytest.mark.parametrize("name", sorted(BARE))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=st.lists(ACTIONS, min_size=1, max_size=8), seed=st.integers(0, 2**31 - 1))
def test_any_str_action_is_an_observation_on_the_bare_env(name, actions, seed):
    for _, info in _play(BARE[name], actions, seed):
        assert info["turn"] >= 1


@pytest.mark.parametrize("text", ["\ud800", "a\udcffb", "\ud83d\ude00", b"\xff\xfe<tool>".decode("utf-8", "surrogateescape")])
def test_lone_surrogates_become_replacement_characters_in_the_context(text):
    env = ENVS["CompactCode-v0"]
    env.reset(seed=0)
    obs, *_ = env.step(text)
    said = obs[-2]["content"]
    assert obs[-2]["role"] == "assistant" and said == valid_unicode(text)
    assert "\ufffd" in said or said == "\U0001f600"  # a surrogate pair is joined into its character


def test_a_hostile_summary_starts_the_next_trace():
    env = ENVS["CompactCode-v0 small budget"]
    env.reset(seed=1)
    view = f"<tool>view {env.unwrapped.task.metadata['bug_file']}</tool>"
    info = {"compaction_required": False}
    for _ in range(6):
        if info["compaction_required"]:
            break
        *_, info = env.step(view)
    assert info["compaction_required"], "seed 1 no longer fills this budget in 6 views: pick another seed"
    obs, _, _, _, info = env.step("kept: \ud800 and \udcff")
    assert info["compacted"] and info["trace"].ends_with_summary
    assert obs[2]["content"].endswith("kept: \ufffd and \ufffd")
