"""The update step: advantages, minibatches, micro-batch gradient accumulation, critic steps, diagnostics.

:class:`Updater` holds what an update needs across iterations (the loss module built from
``RLConfig``, the policy and critic optimisers, the minibatch generator) and offers the three
things the trainer does with a collected batch:

* :meth:`Updater.advantages`: critic values at every token (PPO), then the advantage estimator of
  :func:`~compactrl.algos.losses.advantage_estimator` on the whole batch (and, with TIS or MIS on, the
  learner's own log-probs as ``old_log_prob``);
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

Data parallelism (:class:`Shard`): on each of N learner ranks the same :class:`Updater` runs on the
same batch with the same minibatch generator, so every rank draws the same minibatches; each rank
then takes its own rows of a minibatch (:func:`rank_rows`), after the minibatch's whole token counts
were written, so the loss of every rank is its share of the *global* per-token loss and the ranks'
gradients sum to one process's gradient, however unevenly the tokens fall. FSDP averages gradients
over the ranks, so each rank's loss is scaled by N before its backward. Every rank runs the same
number of forward/backward passes (ranks with fewer micro-batches run zero-weight ones), since each
pass of a sharded module is a collective. With one rank (:data:`SINGLE`) every step is exactly the
single-process computation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDict

from compactrl.algos.losses import advantage_estimator, build_losses
from compactrl.algos.packing import micro_batches, pack_rows, row_lengths
from compactrl.policies.routing import batch_replay, critic_routers

__all__ = ["Updater", "Shard", "SINGLE", "critic_values", "learner_log_probs", "split_minibatches", "optimizer_step",
           "rank_rows"]


@dataclass(frozen=True)
class Shard:
    """This process's place among the learner's data-parallel ranks (``group``: its process group)."""

    rank: int = 0
    world: int = 1
    group: Any = None

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the ranks, in place (itself with one rank)."""
        if self.world > 1:
            import torch.distributed as dist

            y = x.to(self._comm_device())
            dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
            x.copy_(y)
        return x

    def max_count(self, n: int) -> int:
        """The largest ``n`` over the ranks."""
        if self.world == 1:
            return n
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.int64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t)

    def _comm_device(self) -> torch.device:
        """Where the collectives' tensors must live: the current CUDA device under NCCL, else the CPU."""
        import torch.distributed as dist

        if dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


SINGLE = Shard()
"""One process: no collectives, no split."""


def rank_rows(weights: torch.Tensor, shard: Shard) -> torch.Tensor:
    """The row indices rank ``shard.rank`` takes: rows dealt greedily (heaviest first, ties by index) to
    the lightest rank, so every rank computes the same deal. With one rank: every row, in order."""
    n = weights.shape[0]
    if shard.world == 1:
        return torch.arange(n)
    order = sorted(range(n), key=lambda i: (-float(weights[i]), i))
    loads, mine = [0.0] * shard.world, []
    for i in order:
        k = loads.index(min(loads))
        loads[k] += float(weights[i])
        if k == shard.rank:
            mine.append(i)
    return torch.tensor(sorted(mine), dtype=torch.long)


def _idle_part(batch: TensorDict) -> TensorDict:
    """One row of ``batch`` with no policy token: a forward/backward that adds nothing (a rank with fewer
    micro-batches than another runs these, because each pass of a sharded module is a collective)."""
    width = batch["attention_mask"].shape[-1]
    part = batch[:1].apply(lambda t: t[:, :2] if t.dim() >= 2 and t.shape[1] == width else t).clone()
    part["policy_mask"] = torch.zeros_like(part["policy_mask"])
    return part


def _padded(parts: list, batch: TensorDict, shard: Shard) -> list:
    """``parts`` followed by idle parts up to the largest part count over the ranks."""
    return parts + [_idle_part(batch)] * (shard.max_count(len(parts)) - len(parts))


@torch.no_grad()
def critic_values(critic, batch: TensorDict, micro_batch_tokens: int, shard: Shard = SINGLE, *,
                  routing_replay: bool = False) -> torch.Tensor:
    """``V`` at every position of ``batch``, computed over packed micro-batches (each rank its share of the
    rows, the whole result summed over the ranks); the batch's routes replayed as in the critic loss when
    ``routing_replay``."""
    def forward(tokens, mask, rows=None):  # rows None: an idle pass
        part = {"tokens": tokens, "routed_experts": _rows_of(batch, "routed_experts", rows)}
        with batch_replay(critic_routers(critic), part, routing_replay):
            return critic.value(tokens, mask)

    return _packed_forward(forward, batch, micro_batch_tokens, shard)


@torch.no_grad()
def learner_log_probs(policy, batch: TensorDict, micro_batch_tokens: int, shard: Shard = SINGLE, *,
                      routing_replay: bool = False) -> torch.Tensor:
    """The learner's log-probs of ``batch``'s policy tokens under its current weights (0 elsewhere), over
    packed micro-batches (the batch's routes replayed when ``routing_replay``, as in the policy loss):
    before an update, the ``old_log_prob`` the importance corrections compare with the sampler's
    ``sample_log_prob``."""
    def forward(tokens, mask, rows=None):  # rows None: an idle pass, nothing selected
        select = torch.zeros_like(mask).bool() if rows is None else batch["policy_mask"][rows, :tokens.shape[1]].bool()
        part = {"tokens": tokens, "routed_experts": _rows_of(batch, "routed_experts", rows)}
        with batch_replay(policy, part, routing_replay):
            return policy.log_prob(tokens, mask, select=select)[0].masked_fill(~select, 0.0)

    return _packed_forward(forward, batch, micro_batch_tokens, shard)


def _rows_of(batch: TensorDict, key: str, rows: torch.Tensor | None) -> torch.Tensor | None:
    value = batch.get(key, None)
    return None if value is None or rows is None else value[rows]


def _packed_forward(fn, batch: TensorDict, micro_batch_tokens: int, shard: Shard) -> torch.Tensor:
    """``fn(tokens, mask, rows)`` at every position of ``batch`` over packed micro-batches, each rank its rows
    (``fn(tokens, mask)`` for a rank's idle passes)."""
    out = torch.zeros(batch["tokens"].shape, dtype=torch.float32, device=batch["tokens"].device)
    lengths = row_lengths(batch["attention_mask"])
    mine = rank_rows(lengths, shard)
    packs = [mine[rows] for rows in pack_rows(lengths[mine], micro_batch_tokens)] if mine.numel() else []
    for rows in packs + [None] * (shard.max_count(len(packs)) - len(packs)):
        if rows is None:  # idle pass: this rank has no rows left
            fn(batch["tokens"][:1, :1], batch["attention_mask"][:1, :1])
            continue
        width = max(int(lengths[rows].max()), 1)
        tokens, mask = batch["tokens"][rows, :width], batch["attention_mask"][rows, :width]
        out[rows, :width] = fn(tokens, mask, rows).float()
    return shard.all_sum(out)


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
                   name: str, micro_batch_tokens: int, max_grad_norm: float, shard: Shard = SINGLE,
                   ) -> dict[str, float]:
    """One optimiser step of ``loss_fn`` over ``mb``, gradients accumulated over packed micro-batches.

    ``mb`` must carry its whole token counts (``add_loss_normalizers``), so the accumulated
    gradient does not depend on the packing (nor on the ranks: each takes its rows of ``mb``).
    Diagnostics are weighted by the micro-batch's share of the minibatch's policy tokens; loss terms
    are summed (each is already a share of the minibatch's loss); both are summed over the ranks.
    """
    opt.zero_grad(set_to_none=True)
    stats: dict[str, float] = {}
    total = float(mb["policy_mask"].sum().clamp(min=1))
    mine = mb[rank_rows(mb["policy_mask"].sum(-1), shard)] if shard.world > 1 else mb
    parts = micro_batches(mine, micro_batch_tokens) if mine.batch_size[0] else []
    for part in _padded(parts, mb, shard):
        out = loss_fn(part)
        loss = sum(v for k, v in out.items() if k.startswith("loss_"))
        (loss * shard.world if shard.world > 1 else loss).backward()  # FSDP averages over the ranks
        weight = float(part["policy_mask"].sum()) / total
        for k, v in out.items():
            if k == "num_loss_tokens_micro":
                continue
            key = f"loss/{k[5:]}" if k.startswith("loss_") else f"{name}/{k}"
            stats[key] = stats.get(key, 0.0) + float(v.detach()) * (1.0 if k.startswith("loss_") else weight)
    if shard.world > 1:
        keys = sorted(stats)
        summed = shard.all_sum(torch.tensor([stats[k] for k in keys], dtype=torch.float64))
        stats = dict(zip(keys, summed.tolist()))
    norm = torch.nn.utils.clip_grad_norm_(module.parameters(), max_grad_norm)
    stats[f"{name}/grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
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

    def __init__(self, rl, policy, critic=None, *, seed: int = 0, shard: Shard = SINGLE) -> None:
        if (rl.algo == "ppo") != (critic is not None):
            raise ValueError(f"rl.algo={rl.algo!r}: a critic is needed for ppo and only for ppo")
        self.rl, self.policy, self.critic, self.shard = rl, policy, critic, shard
        self.loss = build_losses(rl, policy, critic)
        self.estimate = advantage_estimator(rl)
        self.opt = torch.optim.AdamW(policy.parameters(), lr=rl.lr, weight_decay=0.0)
        self.critic_opt = torch.optim.AdamW(critic.parameters(), lr=rl.critic_lr, weight_decay=0.0) \
            if critic is not None else None
        self.generator = torch.Generator().manual_seed(seed)

    def advantages(self, batch: TensorDict) -> TensorDict:
        """Critic values (PPO) and advantages (and value targets) over the whole batch, in place; with an
        importance correction on (``tis_cap``, ``mis_high``) and no ``old_log_prob`` in the batch, the
        learner's log-probs before the update are written there."""
        loss = self.rl.loss
        if (loss.tis_cap is not None or loss.mis_high is not None) and "old_log_prob" not in batch.keys():
            batch["old_log_prob"] = learner_log_probs(self.policy, batch, self.rl.micro_batch_tokens, self.shard,
                                                      routing_replay=self.loss.routing_replay)
        if self.critic is not None:
            batch["value"] = critic_values(self.critic, batch, self.rl.micro_batch_tokens, self.shard,
                                           routing_replay=self.loss.routing_replay)
        return self.estimate(batch)

    def update(self, batch: TensorDict, *, train_policy: bool = True, max_critic_steps: int | None = None,
               minibatches: int | None = None) -> dict[str, float]:
        """``epochs`` x ``minibatches`` steps on ``batch`` (which has advantages); mean diagnostics.

        ``minibatches`` overrides ``rl.minibatches`` (critic pre-training splits its pool of several
        batches into proportionally more, so that a step costs what it costs on one batch)."""
        rl, means, critic_steps = self.rl, _Means(), 0
        step = dict(micro_batch_tokens=rl.micro_batch_tokens, max_grad_norm=rl.max_grad_norm, shard=self.shard)
        for _ in range(rl.epochs):
            for rows in split_minibatches(batch, minibatches or rl.minibatches, self.generator):
                mb = self.loss.add_normalizers(batch[rows])  # whole-minibatch counts (MIS's kept tokens)
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
