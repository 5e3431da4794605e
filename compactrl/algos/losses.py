"""Critic PPO and GRPO losses over trace batches (TorchRL ``LossModule`` subclasses).

Both read a trace batch (``compactrl.collectors.batch``) with an ``advantage`` entry and return a
``TensorDict`` of ``loss_*`` terms (sum them for ``backward``) plus detached diagnostics.

Normalisation is per token over the *whole* batch: each term is a sum over the loss tokens of the
(micro-)batch divided by the number of loss tokens of the full batch. Call
:func:`add_loss_normalizers` on the full batch before splitting it; the counts then travel with
every row, so gradients accumulated over any split equal the full batch's gradient. Without those
entries the (micro-)batch normalises by its own counts.

The actor exposes ``log_prob(tokens, attention_mask, select) -> (logp, entropy)`` (values are read
only where ``select``, the loss's tokens, is set; an actor may leave the rest 0) and the critic
``value(tokens, attention_mask) -> value``, all ``[N, L]`` and aligned with ``tokens``
(``out[:, t]`` is about ``tokens[t]`` given ``tokens[:t]``). Each loss owns its options:
the dataclasses of :mod:`compactrl.algos.loss_config` (the training config's ``RLConfig.ppo`` /
``RLConfig.grpo`` nest them as they are).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.objectives import LossModule

from compactrl.algos.loss_config import CriticPPOConfig, GRPOConfig, PolicyLossConfig
from compactrl.policies.routing import batch_replay, critic_routers

__all__ = [
    "PolicyLossConfig",
    "CriticPPOConfig",
    "GRPOConfig",
    "CriticPPOLoss",
    "GRPOLoss",
    "loss_mask",
    "add_loss_normalizers",
    "grpo_advantage",
    "whiten_advantages",
    "build_losses",
    "advantage_estimator",
]


# -- masks, normalisers and advantages (pure functions over trace batches) ----------------------------


def loss_mask(batch: TensorDictBase, *, train_summaries: bool = True) -> torch.Tensor:
    """Tokens the policy loss covers: policy tokens, minus summary tokens unless ``train_summaries``."""
    mask = batch["policy_mask"]
    if "attention_mask" in batch.keys():
        mask = mask & batch["attention_mask"]
    if not train_summaries:
        mask = mask & ~batch["summary_mask"]
    return mask


def add_loss_normalizers(batch: TensorDictBase, *, train_summaries: bool = True) -> TensorDictBase:
    """Write the whole batch's ``num_loss_tokens``, ``num_loss_traces`` and ``num_value_tokens``.

    Each is an ``[N]`` int64 entry repeating the same count, so it survives any row split.
    """
    mask = loss_mask(batch, train_summaries=train_summaries)
    value_mask = loss_mask(batch, train_summaries=True)
    n = batch.shape[0]
    for key, count in (
        ("num_loss_tokens", mask.sum()),
        ("num_loss_traces", mask.any(-1).sum()),
        ("num_value_tokens", value_mask.sum()),
    ):
        batch.set(key, count.to(torch.int64).expand(n).clone())
    return batch


def _count(td: TensorDictBase, key: str, fallback: torch.Tensor) -> torch.Tensor:
    if key in td.keys():
        return td[key][0].to(torch.float32).clamp(min=1)
    return fallback.sum().to(torch.float32).clamp(min=1)


def grpo_advantage(batch: TensorDictBase, *, scale_by_std: bool = True, eps: float = 1e-6,
                   trace_advantage: str = "broadcast") -> TensorDictBase:
    """Group-relative outcome advantage, given to every policy token of every trace.

    Each episode (not each trace) counts once in its group (``group_id``): ``A = (R - mean_g R)``,
    divided by the group's unbiased std plus ``eps`` when ``scale_by_std``. A group of one episode
    gets advantage 0. ``trace_advantage``: ``broadcast`` gives every trace of the episode ``A``;
    ``split`` gives each of its ``K`` traces ``A / K`` (``K``: the batch's ``num_traces`` entry, else
    the episode's rows in the batch). Writes ``advantage`` ([N, L] float32, 0 off policy tokens).
    """
    if trace_advantage not in ("broadcast", "split"):
        raise ValueError(f"trace_advantage: expected broadcast|split, got {trace_advantage!r}")
    episode, group = batch["episode_id"], batch["group_id"]
    ep_ids, row_ep = torch.unique(episode, return_inverse=True)
    reward = torch.zeros(ep_ids.numel(), dtype=torch.float64).index_put_(
        (row_ep,), batch["episode_reward"].to(torch.float64)
    )
    ep_group = torch.zeros(ep_ids.numel(), dtype=torch.long).index_put_((row_ep,), group)
    g_ids, ep_g = torch.unique(ep_group, return_inverse=True)
    size = torch.zeros(g_ids.numel(), dtype=torch.float64).index_add_(0, ep_g, torch.ones_like(reward))
    mean = torch.zeros_like(size).index_add_(0, ep_g, reward) / size
    centred = reward - mean[ep_g]
    adv = centred
    if scale_by_std:
        var = torch.zeros_like(size).index_add_(0, ep_g, centred**2) / (size - 1).clamp(min=1)
        adv = centred / (var.sqrt()[ep_g] + eps)
    adv = torch.where(size[ep_g] > 1, adv, torch.zeros_like(adv))
    per_row = adv[row_ep].to(torch.float32)
    if trace_advantage == "split":
        per_row = per_row / _traces_per_row(batch, row_ep).to(torch.float32)
    batch.set("advantage", per_row[:, None] * batch["policy_mask"].to(torch.float32))
    return batch


def _traces_per_row(batch: TensorDictBase, row_ep: torch.Tensor) -> torch.Tensor:
    """Each row's episode's trace count: ``num_traces`` where the batch has it, else its rows in the batch."""
    if "num_traces" in batch.keys():
        return batch["num_traces"].to(torch.float64).clamp(min=1)
    rows = torch.zeros(int(row_ep.max()) + 1 if row_ep.numel() else 0, dtype=torch.float64)
    return rows.index_add_(0, row_ep, torch.ones_like(row_ep, dtype=torch.float64))[row_ep]


def whiten_advantages(batch: TensorDictBase, *, eps: float = 1e-8, mask: torch.Tensor | None = None):
    """Shift and scale ``advantage`` to mean 0, std 1 over ``mask`` (default: policy tokens) of the batch.

    Whiten the whole batch before splitting it: statistics of a micro-batch would break the
    equivalence of micro-batching.
    """
    mask = batch["policy_mask"] if mask is None else mask
    adv = batch["advantage"]
    sel = adv[mask].to(torch.float64)
    if sel.numel() < 2:
        return batch
    white = (adv - sel.mean().to(adv.dtype)) / (sel.std().to(adv.dtype) + eps)
    batch.set("advantage", torch.where(mask, white, torch.zeros_like(adv)))
    return batch


# -- the losses --------------------------------------------------------------------------------------


def _masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (_masked(x, mask).sum() / mask.sum().clamp(min=1)).detach()


class _PolicyLoss(LossModule):
    """The clipped policy objective with entropy, KL and the importance corrections (TIS, MIS).

    Both corrections read the learner/sampler ratio ``exp(old_log_prob - sample_log_prob)``, a property
    of the batch (not of the weights being trained): TIS weights each token by it, capped; MIS drops the
    tokens outside its bounds from the policy loss, numerator and denominator (as verl's rollout
    rejection and slime's MIS: the kept tokens are averaged among themselves). Call
    :meth:`add_normalizers` on the whole batch before splitting it, so the kept-token counts are the
    whole batch's and micro-batching still leaves the gradient unchanged.
    """

    routing_replay: bool = False
    """Replay the batch's ``routed_experts`` in the forward (``RLConfig.routing_replay``;
    :func:`compactrl.policies.routing.replay_routes`)."""

    def __init__(self, actor: nn.Module, config: PolicyLossConfig):
        super().__init__()
        self.actor = actor
        self.config = config
        keys = ["tokens", "attention_mask", "policy_mask", "sample_log_prob", "advantage"]
        keys += [] if config.train_summaries else ["summary_mask"]
        keys += [config.kl_ref_key] if config.kl_coef > 0 else []
        corrected = config.tis_cap is not None or config.mis_high is not None
        self.in_keys = keys + (["old_log_prob"] if corrected else [])
        self.out_keys = ["loss_objective"] + [
            key for key, on in (("loss_entropy", config.entropy_coef), ("loss_kl", config.kl_coef)) if on > 0
        ]

    def mis_keep(self, td: TensorDictBase, mask: torch.Tensor) -> torch.Tensor | None:
        """The tokens of ``mask`` MIS keeps (ratio within ``[mis_low, mis_high]``); None when MIS is off."""
        cfg = self.config
        if cfg.mis_high is None:
            return None
        sample = td["sample_log_prob"].float()
        old = td["old_log_prob"].float() if "old_log_prob" in td.keys() else sample
        ratio = _masked(old - sample, mask).exp()
        return mask & (ratio >= cfg.mis_low) & (ratio <= cfg.mis_high)

    def add_normalizers(self, batch: TensorDictBase) -> TensorDictBase:
        """:func:`add_loss_normalizers` for this loss: with MIS, the policy loss's token and trace counts
        are those of the tokens it keeps (the value loss's are unchanged)."""
        add_loss_normalizers(batch, train_summaries=self.config.train_summaries)
        keep = self.mis_keep(batch, loss_mask(batch, train_summaries=self.config.train_summaries))
        if keep is not None:
            n = batch.shape[0]
            batch.set("num_loss_tokens", keep.sum().to(torch.int64).expand(n).clone())
            batch.set("num_loss_traces", keep.any(-1).sum().to(torch.int64).expand(n).clone())
        return batch

    def _reduce(self, x: torch.Tensor, mask: torch.Tensor, td: TensorDictBase) -> torch.Tensor:
        if self.config.normalization == "token":
            return _masked(x, mask).sum() / _count(td, "num_loss_tokens", mask)
        per_trace = _masked(x, mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_trace.sum() / _count(td, "num_loss_traces", mask.any(-1))

    def actor_loss(self, td: TensorDictBase) -> TensorDict:
        """``loss_objective`` (+ ``loss_entropy``, ``loss_kl``) and policy diagnostics."""
        cfg = self.config
        mask = loss_mask(td, train_summaries=cfg.train_summaries)
        out = {}
        keep = self.mis_keep(td, mask)
        if keep is not None:
            out["mis_drop_fraction"] = _mean((mask & ~keep).float(), mask)
            mask = keep
        # the actor computes log-probs only where the loss reads them (its LM head is most of a step)
        with batch_replay(self.actor, td, self.routing_replay):
            logp, entropy = self.actor.log_prob(td["tokens"], td["attention_mask"], mask)
        logp, entropy = logp.float(), entropy.float()
        sample = td["sample_log_prob"].float()
        old = td["old_log_prob"].float() if "old_log_prob" in td.keys() else sample
        log_ratio = _masked(logp - old, mask)
        ratio = log_ratio.exp()
        adv = td["advantage"].float()
        clipped = ratio.clamp(1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
        per_token = -torch.minimum(ratio * adv, clipped * adv)
        if cfg.tis_cap is not None:
            weight = _masked(old - sample, mask).exp().clamp(max=cfg.tis_cap).detach()
            per_token = per_token * weight
            out["tis_weight_mean"] = _mean(weight, mask)
            out["tis_clip_fraction"] = _mean((old - sample).exp().ge(cfg.tis_cap).float(), mask)
        out["loss_objective"] = self._reduce(per_token, mask, td)
        if cfg.entropy_coef > 0:
            out["loss_entropy"] = -cfg.entropy_coef * self._reduce(entropy, mask, td)
        if cfg.kl_coef > 0:
            diff = _masked(td[cfg.kl_ref_key].float() - logp, mask)
            kl = -diff if cfg.kl_estimator == "k1" else diff.exp() - diff - 1
            out["loss_kl"] = cfg.kl_coef * self._reduce(kl, mask, td)
            out["kl_to_ref"] = _mean(kl, mask)
        with torch.no_grad():
            hit = (adv > 0) & (ratio > 1 + cfg.clip_eps_high) | (adv < 0) & (ratio < 1 - cfg.clip_eps_low)
            out["clip_fraction"] = _mean(hit.float(), mask)
            out["approx_kl"] = _mean(ratio - 1 - log_ratio, mask)
            out["entropy"] = _mean(entropy, mask)
            out["ratio_mean"] = _mean(ratio, mask)
            out["num_loss_tokens_micro"] = mask.sum().float()
        return TensorDict(out, batch_size=[])

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        return self.actor_loss(tensordict)


class CriticPPOLoss(_PolicyLoss):
    """Critic PPO over trace batches: clipped token ratio, clipped value loss, entropy/KL/TIS options.

    Needs ``advantage``, ``value`` (the rollout critic's values) and ``value_target`` (from
    :func:`compactrl.algos.gae.trace_gae`). ``forward`` returns ``loss_objective``,
    ``loss_critic`` and the optional ``loss_entropy`` / ``loss_kl``; :meth:`actor_loss` and
    :meth:`critic_loss` compute either half alone (critic warm-up, separate optimisers).
    """

    def __init__(self, actor: nn.Module, critic: nn.Module, config: CriticPPOConfig | None = None):
        super().__init__(actor, config or CriticPPOConfig())
        self.critic = critic
        self.in_keys = [*self.in_keys, "value", "value_target"]
        self.out_keys = [*self.out_keys, "loss_critic"]

    def critic_loss(self, td: TensorDictBase) -> TensorDict:
        """``loss_critic`` over every policy token, with value diagnostics."""
        cfg = self.config
        mask = loss_mask(td, train_summaries=True)
        with batch_replay(critic_routers(self.critic), td, self.routing_replay):
            values = self.critic.value(td["tokens"], td["attention_mask"]).float()
        old, target = td["value"].float(), td["value_target"].float()
        err = (values - target) ** 2
        out = {}
        if cfg.value_clip_eps is not None:
            v_clip = old + (values - old).clamp(-cfg.value_clip_eps, cfg.value_clip_eps)
            err = torch.maximum(err, (v_clip - target) ** 2)
            out["value_clip_fraction"] = _mean(((values - old).abs() > cfg.value_clip_eps).float(), mask)
        denom = _count(td, "num_value_tokens", mask)
        out["loss_critic"] = cfg.critic_coef * 0.5 * _masked(err, mask).sum() / denom
        with torch.no_grad():
            t_sel, resid = target[mask], (target - values)[mask]
            var_t = t_sel.var() if t_sel.numel() > 1 else torch.zeros(())
            # a micro-batch whose targets are (numerically) constant has no variance to explain
            out["explained_variance"] = (1 - resid.var() / var_t) if var_t > 1e-6 else torch.zeros(())
            out["value_mean"] = _mean(values, mask)
        return TensorDict(out, batch_size=[])

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        out = self.actor_loss(tensordict)
        out.update(self.critic_loss(tensordict))
        return out


class GRPOLoss(_PolicyLoss):
    """GRPO baseline over trace batches: the same clipped objective and options, no critic.

    The advantage comes from :func:`grpo_advantage` (or :meth:`compute_advantage`) on the whole
    batch before it is split, so that group statistics do not depend on the split.
    """

    def __init__(self, actor: nn.Module, config: GRPOConfig | None = None):
        super().__init__(actor, config or GRPOConfig())

    def compute_advantage(self, batch: TensorDictBase) -> TensorDictBase:
        cfg = self.config
        return grpo_advantage(batch, scale_by_std=cfg.scale_by_std, eps=cfg.eps, trace_advantage=cfg.trace_advantage)


# -- what the trainer builds from its config ----------------------------------------------------------


def advantage_estimator(rl) -> Callable[[TensorDictBase], TensorDictBase]:
    """``batch -> batch`` with ``advantage`` (and, for PPO, ``value_target``) written, per ``rl``
    (``compactrl.training.config.RLConfig``).

    PPO: token-level GAE over the batch's traces (``gamma``, ``lmbda`` or the adaptive lambda with
    ``lmbda_alpha``, ``value_lmbda``, ``boundary``, ``truncation``; needs ``value``); GRPO: the
    group-relative outcome advantage (``rl.grpo.scale_by_std``, ``rl.grpo.eps``,
    ``rl.grpo.trace_advantage``). Both then whiten
    over the loss's tokens when ``whiten_advantages``, so every arm of a comparison is normalised
    the same way.
    """

    def advantages(batch: TensorDictBase) -> TensorDictBase:
        if rl.algo == "grpo":
            grpo_advantage(batch, scale_by_std=rl.grpo.scale_by_std, eps=rl.grpo.eps,
                           trace_advantage=rl.grpo.trace_advantage)
        else:
            from compactrl.algos.tree_gae import tree_gae  # trace_gae's, unless the batch holds trace trees

            adaptive = rl.lmbda == "adaptive"
            tree_gae(batch, gamma=rl.gamma, lmbda=None if adaptive else rl.lmbda,
                     length_adaptive_alpha=rl.lmbda_alpha if adaptive else None, value_lmbda=rl.value_lmbda,
                     boundary=rl.boundary, truncation=rl.truncation)
        if rl.whiten_advantages:
            whiten_advantages(batch, mask=loss_mask(batch, train_summaries=rl.loss.train_summaries))
        return batch

    return advantages


def build_losses(rl, policy: nn.Module, critic: nn.Module | None) -> CriticPPOLoss | GRPOLoss:
    """The loss module of ``rl.algo``, configured by ``rl.ppo`` or ``rl.grpo`` as they are."""
    if rl.algo != "grpo" and critic is None:
        raise ValueError("rl.algo='ppo' needs a critic")
    loss = GRPOLoss(policy, rl.grpo) if rl.algo == "grpo" else CriticPPOLoss(policy, critic, rl.ppo)
    loss.routing_replay = bool(getattr(rl, "routing_replay", False))
    return loss
