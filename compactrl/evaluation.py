"""Evaluate a policy on an environment: ``evaluate(...)`` and ``compactrl eval``.

Episodes run on ``num_envs`` envs in lock-step, so a batched policy sees up to ``num_envs``
requests per call. Episode ``i`` starts with ``reset(seed=seed + i)``. For an env whose
observation is text (an unwrapped env), the loop builds the chat history itself (system, task,
then assistant/tool turns); an env whose observation is already a sequence of messages (the
context-budget wrapper) is used as is.

Every episode yields a dict of numbers (reward, success, turns, steps, format errors, and every
numeric entry of the final ``info``); the result aggregates each key ``k`` into ``mean_k``, so
wrappers that add counters to ``info`` get them reported without touching this file.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from compactrl.types import Message, Policy, PolicyRequest

log = logging.getLogger(__name__)

_SKIP_INFO = {"turn", "trace_index", "prompt_token_ids", "max_new_tokens", "compaction_required", "compacted",
              "clipped_tokens"}
# names the context-budget report uses for the wrapper's per-episode totals
_ALIASES = {"mean_traces": "mean_num_traces", "mean_compactions": "mean_num_compactions",
            "truncated_rate": "mean_truncated"}


@dataclass
class _Slot:
    env: gym.Env
    episode: int = -1
    obs: Any = None
    info: dict = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    reward: float = 0.0
    steps: int = 0


def _make_env_fn(env_fn_or_id: str | Callable[..., gym.Env], env_kwargs: dict | None) -> Callable[[], gym.Env]:
    kwargs = dict(env_kwargs or {})
    if isinstance(env_fn_or_id, str):
        import compactrl  # noqa: F401  (registers the ids)

        return lambda: gym.make(env_fn_or_id, **kwargs)
    return lambda: env_fn_or_id(**kwargs)


def evaluate(
    env_fn_or_id: str | Callable[..., gym.Env],
    policy: Policy,
    *,
    episodes: int,
    seed: int = 0,
    env_kwargs: dict[str, Any] | None = None,
    num_envs: int = 1,
    return_episodes: bool = False,
) -> dict[str, Any]:
    """Run ``episodes`` episodes and aggregate their stats (see the module docstring)."""
    if episodes < 1:
        raise ValueError(f"episodes: expected >= 1, got {episodes}")
    if num_envs < 1:
        raise ValueError(f"num_envs: expected >= 1, got {num_envs}")
    make = _make_env_fn(env_fn_or_id, env_kwargs)
    slots = [_Slot(make()) for _ in range(min(num_envs, episodes))]
    next_episode, results = 0, []
    started = time.perf_counter()
    for slot in slots:
        next_episode = _start(slot, next_episode, seed)
    try:
        while any(s.episode >= 0 for s in slots):
            active = [s for s in slots if s.episode >= 0]
            actions = policy.act([_request(s) for s in active])
            if len(actions) != len(active):
                raise ValueError(f"policy returned {len(actions)} actions for {len(active)} requests")
            for slot, action in zip(active, actions):
                if _step(slot, action, results):
                    slot.episode = -1
                    if next_episode < episodes:
                        next_episode = _start(slot, next_episode, seed)
    finally:
        for slot in slots:
            slot.env.close()
    results.sort(key=lambda r: r["episode"])
    summary = aggregate(results)
    summary["wall_s"] = time.perf_counter() - started
    if return_episodes:
        summary["per_episode"] = results
    return summary


def _start(slot: _Slot, episode: int, seed: int) -> int:
    slot.episode, slot.reward, slot.steps = episode, 0.0, 0
    slot.obs, slot.info = slot.env.reset(seed=seed + episode)
    if isinstance(slot.obs, str):
        slot.messages = [
            {"role": "system", "content": slot.env.unwrapped.system_prompt},
            {"role": "user", "content": slot.obs},
        ]
    return episode + 1


def _request(slot: _Slot) -> PolicyRequest:
    messages = slot.messages if isinstance(slot.obs, str) else list(slot.obs)
    return PolicyRequest(
        messages=messages,
        prompt_token_ids=slot.info.get("prompt_token_ids"),
        max_new_tokens=slot.info.get("max_new_tokens"),
        compaction_required=bool(slot.info.get("compaction_required", False)),
        task=getattr(slot.env.unwrapped, "task", None),
    )


def _step(slot: _Slot, action: str, results: list[dict]) -> bool:
    """Step one env; on the episode's end record its stats and return True."""
    obs, reward, terminated, truncated, info = slot.env.step(action)
    slot.steps += 1
    slot.reward += float(reward)
    if isinstance(obs, str):
        slot.messages += [{"role": "assistant", "content": str(action)}, {"role": "tool", "content": obs}]
    slot.obs, slot.info = obs, info
    if not (terminated or truncated):
        return False
    stats = {k: float(v) for k, v in info.items() if k not in _SKIP_INFO and _is_number(v)}
    stats.update(
        episode=slot.episode,
        reward=slot.reward,
        success=float(info.get("success", slot.reward > 0)),
        turns=float(info.get("turn", slot.steps)),
        steps=float(slot.steps),
        format_errors=float(info.get("format_errors", 0)),
        terminated=float(terminated),
        truncated=float(truncated),
    )
    results.append(stats)
    return True


def _is_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float)) and not (isinstance(value, float) and math.isnan(value))


def aggregate(results: list[dict[str, float]]) -> dict[str, Any]:
    """``mean_<key>`` of every numeric key over episodes, plus ``episodes`` and ``success_rate``."""
    keys = sorted({k for r in results for k in r if k != "episode"})
    out: dict[str, Any] = {"episodes": len(results)}
    for key in keys:
        values = [r[key] for r in results if key in r]
        out[f"mean_{key}"] = sum(values) / len(values)
    out["success_rate"] = out.get("mean_success", 0.0)
    out.update({alias: out[key] for alias, key in _ALIASES.items() if key in out})
    return out


# ----------------------------------------------------------------------------------------------
# CLI


def make_policy(name: str, *, seed: int = 0, summary_quality: float = 1.0) -> Policy:
    """A scripted policy by name: ``oracle`` or ``random``."""
    from compactrl.policies.scripted import OraclePolicy, RandomPolicy

    if name == "oracle":
        return OraclePolicy(summary_quality=summary_quality, seed=seed)
    if name == "random":
        return RandomPolicy(seed=seed)
    if name in ("gold", "noop"):
        from compactrl.policies.scripted_gold import GoldPolicy, NoopPolicy

        return GoldPolicy() if name == "gold" else NoopPolicy()
    raise ValueError(f"policy: expected 'oracle', 'random', 'gold' or 'noop', got {name!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default="CompactCode-v0", help="registered env id (default: CompactCode-v0)")
    parser.add_argument("--policy", default="oracle", choices=("oracle", "random", "gold", "noop"),
                        help="scripted policy (gold: the reference solution; noop: submit at once)")
    parser.add_argument("--episodes", type=int, default=20, help="number of episodes (default: 20)")
    parser.add_argument("--seed", type=int, default=0, help="episode i resets with seed + i (default: 0)")
    parser.add_argument("--env-kwargs", default="{}", help='JSON keyword arguments of the env, e.g. \'{"difficulty": "hard"}\'')
    parser.add_argument("--split", default=None, help="task split: train, val or test (default: the env's)")
    parser.add_argument("--difficulty", default=None, help="easy, default or hard (default: the env's)")
    parser.add_argument("--summary-quality", type=float, default=1.0, help="oracle: probability a fact survives a summary")
    parser.add_argument("--num-envs", type=int, default=1, help="envs stepped in lock-step (batched policy calls)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    from compactrl.task_eval import add_task_arguments

    add_task_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if getattr(args, "tasks", None):
        from compactrl.task_eval import run_tasks

        return run_tasks(args)
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"--env-kwargs: expected a JSON object, got {args.env_kwargs!r} ({exc})") from None
    if not isinstance(env_kwargs, dict):
        raise SystemExit(f"--env-kwargs: expected a JSON object, got {args.env_kwargs!r}")
    for name in ("split", "difficulty"):
        if getattr(args, name) is not None:
            env_kwargs[name] = getattr(args, name)
    policy = make_policy(args.policy, seed=args.seed, summary_quality=args.summary_quality)
    result = evaluate(args.env, policy, episodes=args.episodes, seed=args.seed, env_kwargs=env_kwargs, num_envs=args.num_envs)
    result.update(env=args.env, policy=args.policy, seed=args.seed, env_kwargs=env_kwargs)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        width = max(len(k) for k in result)
        for key in sorted(result):
            value = result[key]
            print(f"{key:<{width}}  {value:.4g}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    return 0
