"""The registered envs through TorchRL: ``GymEnv`` converts their spaces, steps them, and the
example's scripted rollout solves tasks across compactions."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gymnasium as gym
import pytest
import torchrl.envs as torchrl_envs
from torchrl.data import NonTensor
from torchrl.envs.utils import check_env_specs

import compactrl  # noqa: F401  (registers the ids)

pytestmark = pytest.mark.timeout(120)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torchrl_env.py"


@pytest.mark.parametrize("env_id", ["CompactCode-v0", "CompactTerminal-v0"])
def test_gym_env_converts_the_spaces_and_steps(env_id):
    env = torchrl_envs.GymEnv(env_id)
    assert isinstance(env.observation_spec["observation"], NonTensor)
    assert isinstance(env.full_action_spec["action"], NonTensor)
    check_env_specs(env, seed=0)
    td = env.reset()
    messages = td["observation"]
    assert [m["role"] for m in messages] == ["system", "user"]
    td["action"] = "<tool>view README.md</tool>"
    nxt = env.step(td)["next"]
    assert nxt["observation"][-2] == {"role": "assistant", "content": "<tool>view README.md</tool>"}
    assert nxt["observation"][-1]["role"] == "tool" and not bool(nxt["done"])


def test_torchrl_observations_equal_gymnasium_ones():
    """Same seed, same actions: TorchRL's rollout sees exactly the messages Gymnasium returns."""
    actions = ["<tool>view README.md</tool>", "\ud800 not a call", "<tool>test</tool>", "<tool>submit</tool>"]
    env = torchrl_envs.GymEnv("CompactCode-v0")
    start = env.reset(seed=3)
    rollout = env.rollout(len(actions), _replay(actions), auto_reset=False, tensordict=start)
    plain = gym.make("CompactCode-v0")
    expected = [plain.reset(seed=3)[0]] + [plain.step(a)[0] for a in actions]
    assert list(rollout["observation"]) == expected[:-1]
    assert list(rollout["next", "observation"]) == expected[1:]
    assert bool(rollout["next", "terminated"][-1])


def _replay(actions):
    it = iter(actions)

    def policy(td):
        td["action"] = next(it)
        return td

    return policy


def test_example_solves_tasks_across_compactions():
    spec = importlib.util.spec_from_file_location("torchrl_env_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    episodes = example.run(episodes=2, seed=0)
    assert [ep["reward"] for ep in episodes] == [1.0, 1.0]
    assert all(ep["terminated"] for ep in episodes)
    assert max(ep["traces"] for ep in episodes) >= 2  # the budget forced at least one summary
    assert all(ep["summaries"] == ep["traces"] - 1 for ep in episodes)
    assert all(ep["max_context_tokens"] <= 1100 for ep in episodes)
