"""CompactCode-v0 through TorchRL: ``GymEnv``/``GymWrapper``, a scripted policy, ``env.rollout``.

    python examples/torchrl_env.py                  # 2 episodes, budget 1100 (forces compaction)
    python examples/torchrl_env.py --episodes 4 --budget 2048

TorchRL converts the env's spaces itself: the action (a ``UnicodeText``) and the observation (a
``ChatMessages`` tuple of ``{"role", "content"}`` dicts) both become ``NonTensor`` specs, so a
policy reads ``td["observation"]`` as the chat messages and writes a ``str`` to ``td["action"]``.
The info entries a policy needs (whether a summary is due, the trace index) come through an info
dict reader. The policy here is the scripted oracle, which reads the task it solves (a learned
policy must not); it writes summaries when asked, so an episode spans several traces.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import torch
from tensordict import TensorDictBase
from torchrl.data import Composite, Unbounded
from torchrl.envs import GymWrapper
from torchrl.envs.gym_like import BaseInfoDictReader

import compactrl  # noqa: F401  (registers CompactCode-v0)
from compactrl.policies.scripted.code import OraclePolicy
from compactrl.types import PolicyRequest

INFO_KEYS = {"compaction_required": torch.bool, "trace_index": torch.int64, "context_tokens": torch.int64}


class InfoReader(BaseInfoDictReader):
    """Copies the context-budget wrapper's scalar info entries into the tensordict."""

    def __call__(self, info: dict, tensordict: TensorDictBase) -> TensorDictBase:
        for key, dtype in INFO_KEYS.items():
            tensordict.set(key, torch.tensor(info[key], dtype=dtype))
        return tensordict

    @property
    def info_spec(self) -> Composite:
        return Composite({key: Unbounded((), dtype=dtype) for key, dtype in INFO_KEYS.items()}, shape=())


def make_env(budget: int, seed: int) -> tuple[GymWrapper, gym.Env]:
    """The TorchRL env and the Gymnasium env inside it (the oracle reads its task).

    ``torchrl.envs.GymEnv("CompactCode-v0", difficulty="easy", budget=...)`` builds the same env;
    wrapping our own ``gym.make`` keeps a handle on the task for the scripted oracle.
    """
    base = gym.make("CompactCode-v0", difficulty="easy", budget=budget, reserve=128,
                    tool_output_cap=192)
    env = GymWrapper(base)
    env.set_info_dict_reader(InfoReader())
    env.set_seed(seed)
    return env, base


def oracle_policy(base: gym.Env):
    """A TorchRL policy (tensordict in, tensordict with ``action`` out) around the scripted oracle."""
    oracle = OraclePolicy()

    def policy(td: TensorDictBase) -> TensorDictBase:
        request = PolicyRequest(messages=td["observation"], compaction_required=bool(td["compaction_required"]),
                                task=base.unwrapped.task)
        td["action"] = oracle.respond(request)
        return td

    return policy


def run(episodes: int = 2, budget: int = 1100, max_steps: int = 80, seed: int = 0) -> list[dict]:
    """Roll out ``episodes`` episodes; one summary dict per episode."""
    env, base = make_env(budget, seed)
    policy = oracle_policy(base)
    out = []
    for _ in range(episodes):
        rollout = env.rollout(max_steps, policy)
        nxt = rollout["next"]
        out.append({
            "steps": rollout.batch_size[0],
            "reward": float(nxt["reward"].sum()),
            "traces": int(nxt["trace_index"].max()) + 1,
            "summaries": int(rollout["compaction_required"].sum()),
            "max_context_tokens": int(nxt["context_tokens"].max()),
            "terminated": bool(nxt["terminated"][-1]),
        })
    env.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=2)
    p.add_argument("--budget", type=int, default=1100, help="context budget in tokens (small: more summaries)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    for i, ep in enumerate(run(args.episodes, args.budget, seed=args.seed)):
        print(f"episode {i}: " + ", ".join(f"{k} {v}" for k, v in ep.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
