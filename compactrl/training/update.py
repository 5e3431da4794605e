"""The update step: advantages, minibatches, micro-batch gradient accumulation, critic steps, diagnostics.

:class:`Updater` holds what an update needs across iterations (the loss module built from
``RLConfig``, the policy and critic optimisers, the minibatch generator) and offers the three
things the trainer does with a collected batch:

* :meth:`Updater.advantages`: critic values at every token (PPO), then the advantage estimator of
  :func:`~compactrl.algos.losses.advantage_estimator` on the whole batch;
* :meth:`Updater.update`: ``epochs`` passes, each split into ``minibatches`` disjoint row sets of
  near-equal policy-token counts; per minibatch ``critic_updates`` critic steps, then one policy
  step. Each step accumulates gradients over micro-batches packed under ``micro_batch_tokens``;
  the loss terms are normalised by the minibatch's whole token counts
  (:func:`~compactrl.algos.losses.add_loss_normalizers`), so the split into micro-batches does
  not change the gradient;
* :meth:`Updater.update` with ``train_policy=False``: critic steps only (pre-training), at most
  ``max_critic_steps`` of them.

Diagnostics are means over the optimiser steps: ``loss/<term>``, ``policy/<diagnostic>``,
``critic/<diagnostic>`` and each module's ``grad_norm``.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

from compactrl.algos.losses import add_loss_normalizers, advantage_estimator, build_losses
from compactrl.algos.packing import micro_batches, pack_rows, row_lengths

__all__ = ["Updater", "critic_values", "split_minibatches", "optimizer_step"]


@torch.no_grad()
def critic_values(critic, batch: TensorDict, micro_batch_tokens: int) -> torch.Tensor:
    """``V`` at every position of ``batch``, computed over packed micro-batches."""
    out = torch.zeros(batch["tokens"].shape, dtype=torch.float32)
    lengths = row_lengths(batch["attention_mask"])
    for rows in pack_rows(lengths, micro_batch_tokens):
        width = max(int(lengths[rows].max()), 1)
        tokens, mask = batch["tokens"][rows, :width], batch["attention_mask"][rows, :width]
        out[rows, :width] = critic.value(tokens, mask).float()
    return out


def split_minibatches(batch: TensorDict, count: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Random disjoint row sets of near-equal policy-token counts (whole traces)."""
    n = batch.batch_size[0]
    order = torch.randperm(n, generator=generator)
    count = min(count, n)
    tokens = batch["policy_mask"].sum(-1)
    parts: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for i in order.tolist():  # greedy: next trace goes to the lightest part
        k = loads.index(min(loads))
        parts[k].append(i)
        loads[k] += int(tokens[i])
    return [torch.tensor(p) for p in parts if p]


def optimizer_step(mb: TensorDict, loss_fn, opt: torch.optim.Optimizer, module: torch.nn.Module, *,
                   name: str, micro_batch_tokens: int, max_grad_norm: float) -> dict[str, float]:
    """One optimiser step of ``loss_fn`` over ``mb``, gradients accumulated over packed micro-batches.

    ``mb`` must carry its whole token counts (``add_loss_normalizers``), so the accumulated
    gradient does not depend on the packing. Diagnostics are weighted by the micro-batch's share of
    policy tokens; loss terms are summed (each is already a share of the minibatch's loss).
    """
    opt.zero_grad(set_to_none=True)
    stats: dict[str, float] = {}
    total = float(mb["policy_mask"].sum().clamp(min=1))
    for part in micro_batches(mb, micro_batch_tokens):
        out = loss_fn(part)
        sum(v for k, v in out.items() if k.startswith("loss_")).backward()
        weight = float(part["policy_mask"].sum()) / total
        for k, v in out.items():
            if k == "num_loss_tokens_micro":
                continue
            key = f"loss/{k[5:]}" if k.startswith("loss_") else f"{name}/{k}"
            stats[key] = stats.get(key, 0.0) + float(v.detach()) * (1.0 if k.startswith("loss_") else weight)
    stats[f"{name}/grad_norm"] = float(torch.nn.utils.clip_grad_norm_(module.parameters(), max_grad_norm))
    opt.step()
    return stats


class _Means:
    """Running means of diagnostics over optimiser steps."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def add(self, stats: dict[str, float]) -> None:
        for k, v in stats.items():
            self.sums[k] = self.sums.get(k, 0.0) + v
            self.counts[k] = self.counts.get(k, 0) + 1

    def result(self) -> dict[str, float]:
        return {k: v / self.counts[k] for k, v in self.sums.items()}


class Updater:
    """The update step of critic PPO or GRPO over trace batches, configured by an ``RLConfig``."""

    def __init__(self, rl, policy, critic=None, *, seed: int = 0) -> None:
        if (rl.algo == "ppo") != (critic is not None):
            raise ValueError(f"rl.algo={rl.algo!r}: a critic is needed for ppo and only for ppo")
        self.rl, self.policy, self.critic = rl, policy, critic
        self.loss = build_losses(rl, policy, critic)
        self.estimate = advantage_estimator(rl)
        self.opt = torch.optim.AdamW(policy.parameters(), lr=rl.lr, weight_decay=0.0)
        self.critic_opt = torch.optim.AdamW(critic.parameters(), lr=rl.critic_lr, weight_decay=0.0) \
            if critic is not None else None
        self.generator = torch.Generator().manual_seed(seed)

    def advantages(self, batch: TensorDict) -> TensorDict:
        """Critic values (PPO) and advantages (and value targets) over the whole batch, in place."""
        if self.critic is not None:
            batch["value"] = critic_values(self.critic, batch, self.rl.micro_batch_tokens)
        return self.estimate(batch)

    def update(self, batch: TensorDict, *, train_policy: bool = True, max_critic_steps: int | None = None,
               minibatches: int | None = None) -> dict[str, float]:
        """``epochs`` x ``minibatches`` steps on ``batch`` (which has advantages); mean diagnostics.

        ``minibatches`` overrides ``rl.minibatches`` (critic pre-training splits its pool of several
        batches into proportionally more, so that a step costs what it costs on one batch)."""
        rl, means, critic_steps = self.rl, _Means(), 0
        step = dict(micro_batch_tokens=rl.micro_batch_tokens, max_grad_norm=rl.max_grad_norm)
        for _ in range(rl.epochs):
            for rows in split_minibatches(batch, minibatches or rl.minibatches, self.generator):
                mb = add_loss_normalizers(batch[rows], train_summaries=rl.loss.train_summaries)
                for _ in range(rl.critic_updates if self.critic is not None else 0):
                    if max_critic_steps is not None and critic_steps >= max_critic_steps:
                        return means.result()
                    means.add(optimizer_step(mb, self.loss.critic_loss, self.critic_opt, self.critic,
                                             name="critic", **step))
                    critic_steps += 1
                if train_policy:
                    means.add(optimizer_step(mb, self.loss.actor_loss, self.opt, self.policy, name="policy", **step))
        return means.result()

    def steps_per_batch(self) -> int:
        """Critic optimiser steps one :meth:`update` takes on a batch of at least ``minibatches`` traces."""
        return self.rl.epochs * self.rl.minibatches * self.rl.critic_updates

    # -- checkpoints -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"opt": self.opt.state_dict(),
                "critic_opt": self.critic_opt.state_dict() if self.critic_opt is not None else None,
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.opt.load_state_dict(state["opt"])
        if self.critic_opt is not None:
            self.critic_opt.load_state_dict(state["critic_opt"])
        self.generator.set_state(state["generator"])
