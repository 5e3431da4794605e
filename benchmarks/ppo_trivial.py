"""PPO with the tiny MoE policy on a trivial task: does reward go up within a minute on a CPU?

The task is a one-step bandit whose reward depends only on the first sampled token: 1.0 when the
token's text starts with a digit, else 0.0. A randomly initialised model picks such a token with
the probability mass it happens to put on them (a few percent), so any working policy-gradient
pipeline must raise it quickly. Everything on the path is the product's own: the env emits a
:class:`~compactrl.types.Trace` per episode like the ContextBudget wrapper does,
:class:`~compactrl.collectors.TraceCollector` batches generation, the critic computes values,
:func:`~compactrl.algos.gae.trace_gae` the advantages, and :class:`~compactrl.algos.losses.CriticPPOLoss`
(or GRPO) the update through :class:`compactrl.training.update.Updater`.

Run::

    python benchmarks/ppo_trivial.py                 # PPO, 60 s budget
    python benchmarks/ppo_trivial.py --algo grpo --seconds 30

Prints reward per iteration and the reference it is judged against: reward after <= 60 s must
clearly exceed the initial rate (it typically goes from a few percent to > 0.5).
"""

from __future__ import annotations

import argparse
import logging
import time

import gymnasium as gym
import torch

from compactrl.types import TokenResponse, Trace

log = logging.getLogger("ppo_trivial")


class FirstTokenBandit(gym.Env):
    """One step: reward 1.0 iff the response's first token id is in ``good_ids``.

    Follows the ContextBudget ``info`` contract (``prompt_token_ids``, ``max_new_tokens``, and the
    finished ``trace`` with the reward on the response's last policy token).
    """

    def __init__(self, prompt_ids: list[int], good_ids: set[int], max_new_tokens: int = 1) -> None:
        self.prompt_ids, self.good_ids, self.max_new_tokens = list(prompt_ids), set(good_ids), max_new_tokens
        self.observation_space = gym.spaces.Text(max_length=1000)
        self.action_space = gym.spaces.Text(max_length=1000)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return ({"role": "user", "content": "Say a number."},), self._info()

    def _info(self, **extra):
        return {"prompt_token_ids": list(self.prompt_ids), "max_new_tokens": self.max_new_tokens,
                "compaction_required": False, **extra}

    def step(self, action):
        if not isinstance(action, TokenResponse) or not action.token_ids:
            raise ValueError("FirstTokenBandit needs TokenResponse actions with at least one token id")
        ids = list(action.token_ids)
        reward = 1.0 if ids[0] in self.good_ids else 0.0
        n = len(self.prompt_ids)
        lps = list(action.log_probs) if action.log_probs is not None else [float("nan")] * len(ids)
        trace = Trace(self.prompt_ids + ids, [False] * n + [True] * len(ids), [False] * (n + len(ids)),
                      [float("nan")] * n + lps, {n + len(ids) - 1: reward})
        return (), reward, True, False, self._info(trace=trace, success=reward > 0)


def digit_token_ids(tokenizer) -> set[int]:
    return {i for tok, i in tokenizer.get_vocab().items()
            if tokenizer.convert_tokens_to_string([tok]).lstrip()[:1].isdigit()}


def run(algo: str = "ppo", seconds: float = 60.0, episodes: int = 64, seed: int = 0, lr: float = 3e-3,
        max_iterations: int = 1000) -> list[dict]:
    from compactrl.collectors import TraceCollector
    from compactrl.policies.critic import ValueModel
    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.policies.transformers_policy import TransformersPolicy
    from compactrl.tokenizer import load_tokenizer
    from compactrl.training.config import override, preset
    from compactrl.training.update import Updater

    torch.manual_seed(seed)
    tok = load_tokenizer()
    good = digit_token_ids(tok)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Say a number."}], add_generation_prompt=True,
                                     tokenize=True)
    prompt = list(prompt["input_ids"] if not isinstance(prompt, list) else prompt)
    cfg = override(preset("main"), {
        "rl.algo": algo, "rl.lr": lr, "rl.critic_lr": 1e-2, "rl.epochs": 4, "rl.minibatches": 2,
        "rl.critic_pretrain_steps": 0, "rl.episodes_per_iter": episodes, "rl.group_size": 8, "rl.lmbda": 1.0,
        "rl.whiten_advantages": True,
    })
    policy = TransformersPolicy(tiny_moe("glm4_moe", seed=seed), tok, temperature=1.0, max_new_tokens=1, seed=seed)
    critic = ValueModel.from_policy(policy) if algo == "ppo" else None
    updater = Updater(cfg.rl, policy, critic, seed=seed)
    collector = TraceCollector([lambda: FirstTokenBandit(prompt, good)] * episodes, policy, episodes_per_batch=episodes,
                               group_size=cfg.rl.group_size if algo == "grpo" else 1, seed=seed,
                               pad_id=tok.pad_token_id or 0, give_task_to_policy=False)
    rows, t0 = [], time.perf_counter()
    for it in range(max_iterations):
        batch = collector.next()
        reward = collector.last_batch_stats["reward_mean"]
        updater.update(updater.advantages(batch))
        rows.append({"iteration": it, "reward": reward, "elapsed_s": time.perf_counter() - t0})
        log.info("iteration %d reward %.3f (%.1f s)", it, reward, rows[-1]["elapsed_s"])
        if rows[-1]["elapsed_s"] >= seconds:
            break
    collector.shutdown()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algo", choices=("ppo", "grpo"), default="ppo")
    p.add_argument("--seconds", type=float, default=60.0, help="wall-clock budget of the training loop")
    p.add_argument("--episodes", type=int, default=64, help="episodes per iteration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = run(args.algo, args.seconds, args.episodes, args.seed)
    first = rows[0]["reward"]
    last = sum(r["reward"] for r in rows[-3:]) / min(3, len(rows))
    print(f"{args.algo}: {len(rows)} iterations in {rows[-1]['elapsed_s']:.1f} s; reward first batch "  # noqa: T201
          f"{first:.3f} -> mean of last 3 batches {last:.3f}  (reference: must clearly rise within 60 s)")


if __name__ == "__main__":
    main()
