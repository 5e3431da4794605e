"""ContextBudget hands out a step's prompt ids as a read-only view: the same values as the copies it made
before, stable as the trace grows, plain data across processes, and a per-step cost that does not grow
with the context."""

from __future__ import annotations

import copy
import pickle
import statistics
import time

import gymnasium as gym
import pytest
from budget_checks import TOK, Move, check_episode, run
from echo_env import EchoEnv
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.envs.spaces import UnicodeText
from compactrl.wrappers import ContextBudget, ContextBudgetConfig
from compactrl.wrappers.context_views import PromptIds

pytestmark = pytest.mark.timeout(120)


class CopyingContextBudget(ContextBudget):
    """The wrapper as it was: a fresh list of the prompt ids and fresh message dicts built every step."""

    def _observation(self):
        return tuple({"role": m["role"], "content": m["content"]} for m in self._messages)

    def _info(self, inner_info, **extra):
        info = super()._info(inner_info, **extra)
        info["prompt_token_ids"] = [*self._trace.ids, *self.fmt.generation_prompt]
        return info


def _plain(log):
    """Each step's observation and prompt ids as plain data, read after the episode has ended."""
    return [(list(map(dict, s["obs"])), list(s["info"]["prompt_token_ids"]), s["reward"], s["term"], s["trunc"],
             s["next_info"].get("trace")) for s in log]


MOVES = st.lists(st.sampled_from([Move(kind="str", text="<tool>view a.py 1 40</tool>"),
                                  Move(kind="str", text="Summary: LIMIT is 7 in app/config.py."),
                                  Move(kind="tokens", ids=(11, 12, 13, 14) * 5, stop=True),
                                  Move(kind="tokens", ids=(21, 22, 23), stop=False),
                                  Move(kind="submit")]), min_size=1, max_size=8)


@settings(max_examples=25, deadline=None)
@given(MOVES, st.integers(0, 2**31 - 1), st.integers(0, 3))
def test_views_equal_the_copies_the_wrapper_made_before(moves, seed, compactions):
    cfg = ContextBudgetConfig(budget=900, reserve=40, tool_output_cap=120, max_compactions=compactions)
    new_env = ContextBudget(EchoEnv(), cfg, tokenizer=TOK)
    old_env = CopyingContextBudget(EchoEnv(), cfg, tokenizer=TOK)
    new, old = run(new_env, seed, moves), run(old_env, seed, moves)
    check_episode(new_env, new)
    assert _plain(new) == _plain(old)  # every view still shows its step's context after the trace grew
    for s in new:
        ids = s["info"]["prompt_token_ids"]
        assert isinstance(ids, PromptIds) and ids == list(ids) and ids[-3:] == list(ids)[-3:]
        assert ids[2:9] == list(ids)[2:9] and ids[::-2] == list(ids)[::-2] and ids[-1] == list(ids)[-1]
        assert new_env.observation_space.contains(s["obs"])
        assert not {id(m) for m in s["obs"]} & {id(m) for m in s["next_obs"]}  # new dicts each step


def test_prompt_ids_are_a_stable_view_and_plain_data_across_processes():
    ids = [5, 6, 7, 8]
    view = PromptIds(ids, 3, (1, 2))
    ids.append(9)  # the owner appends: the view keeps its length
    assert view == [5, 6, 7, 1, 2] and len(view) == 5 and list(view) == [5, 6, 7, 1, 2] and view[3] == 1
    assert view != [5, 6, 7, 1] and view[1:4] == [6, 7, 1] and view[4:1] == []
    with pytest.raises(IndexError):
        view[5]
    for clone in (pickle.loads(pickle.dumps(view)), copy.deepcopy(view), copy.copy(view)):
        assert type(clone) is list and clone == [5, 6, 7, 1, 2]


class GrowingEnv(gym.Env):
    """Tool outputs of ``lines`` lines, so that one episode reaches a long context in a few steps."""

    metadata = {"render_modes": []}
    observation_space = action_space = UnicodeText(1 << 22)
    system_prompt = "You read code."
    lines = 100

    def reset(self, *, seed=None, options=None):
        return "Read everything.", {"task_id": "grow"}

    def step(self, action):
        out = "\n".join(f"{i:>5}  total = sum(p for p in prices)" for i in range(self.lines))
        return out, 0.0, False, False, {}


def test_a_steps_cost_does_not_grow_with_the_context(wrapper=ContextBudget):
    inner = GrowingEnv()
    env = wrapper(inner, ContextBudgetConfig(budget=700_000, reserve=64, tool_output_cap=60_000,
                                                   max_compactions=0), tokenizer=TOK)
    _, info = env.reset(seed=0)

    def median_step_us(steps=15):
        inner.lines, times = 10, []
        for _ in range(steps):
            t0 = time.perf_counter()
            env.step("<tool>view a.py</tool>")
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)

    short = median_step_us()
    inner.lines = 3_000
    while env.step("<tool>view a.py</tool>")[4]["context_tokens"] < 500_000:
        pass
    long = median_step_us()
    # copying the context each step made a step ~30x dearer at 500k tokens than at 1k; allow noise
    assert long < 4 * short + 500, (short, long)
