"""The options of the policy losses: one frozen dataclass per loss, validated on construction.

:class:`PolicyLossConfig` is the clipped policy objective both losses share; :class:`CriticPPOConfig`
adds the value loss and :class:`GRPOConfig` the group-relative advantage. :mod:`compactrl.algos.losses`
takes them as they are, and the training config nests them unchanged (``RLConfig.ppo``,
``RLConfig.grpo``), so each option has one name and one default from the CLI down to the loss. This
module imports nothing but the standard library: the config tree (and ``compactrl train --help``)
stays light.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["PolicyLossConfig", "CriticPPOConfig", "GRPOConfig"]


def _check(cond: bool, name: str, expected: str, got: Any) -> None:
    if not cond:
        raise ValueError(f"{name}: expected {expected}, got {got!r}")


@dataclass(frozen=True)
class PolicyLossConfig:
    """Options of the clipped policy objective shared by critic PPO and GRPO."""

    clip_eps_low: float = 0.2
    """Lower ratio clip: the ratio is kept above ``1 - clip_eps_low``."""
    clip_eps_high: float = 0.2
    """Upper ratio clip: the ratio is kept below ``1 + clip_eps_high`` (DAPO's clip-higher when larger)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (``loss_entropy = -entropy_coef * entropy``); 0 leaves the term out."""
    kl_coef: float = 0.0
    """Weight of the KL penalty towards the log-probs at ``kl_ref_key``; 0 leaves the term out."""
    kl_estimator: Literal["k1", "k3"] = "k3"
    """KL estimator per token: ``k1 = logp - ref`` or ``k3 = exp(ref - logp) - (ref - logp) - 1`` (>= 0)."""
    kl_ref_key: str = "sample_log_prob"
    """Entry holding the reference log-probs: ``sample_log_prob`` (the sampling policy's, in every
    trace batch) or e.g. ``ref_log_prob`` written by a frozen reference model."""
    tis_cap: float | None = None
    """Truncated importance sampling (TIS): when the batch has ``old_log_prob`` (the trainer's own
    log-probs) beside ``sample_log_prob`` (another engine's), weight each token by
    ``min(exp(old - sample), tis_cap)`` (detached); None disables it. Metric: ``tis_clip_fraction``."""
    mis_high: float | None = None
    """Masked importance sampling (MIS): with ``old_log_prob`` beside ``sample_log_prob``, a token whose
    learner/sampler ratio ``exp(old - sample)`` is above ``mis_high`` (or below ``mis_low``) is dropped
    from the policy loss (objective, entropy, KL) and from its token count, as verl's rollout rejection
    and slime's MIS do, so the kept tokens are averaged among themselves; None disables it (> 1).
    Metric: ``mis_drop_fraction``. With ``tis_cap`` too, the kept tokens are also TIS-weighted."""
    mis_low: float = 0.0
    """MIS's lower ratio bound, in [0, 1) (0: no lower bound); only with ``mis_high``."""
    train_summaries: bool = True
    """Keep summary tokens in the policy loss; False masks them out (the critic still learns them)."""
    normalization: Literal["token", "trace"] = "token"
    """``token``: sum over loss tokens / loss tokens of the whole batch. ``trace``: every trace's mean
    over its tokens, summed / traces of the whole batch (the original GRPO weighting)."""

    def __post_init__(self) -> None:
        _check(0 < self.clip_eps_low < 1, "clip_eps_low", "a value in (0, 1)", self.clip_eps_low)
        _check(self.clip_eps_high > 0, "clip_eps_high", "> 0", self.clip_eps_high)
        for name in ("entropy_coef", "kl_coef"):
            _check(getattr(self, name) >= 0, name, ">= 0", getattr(self, name))
        _check(self.kl_estimator in ("k1", "k3"), "kl_estimator", "k1|k3", self.kl_estimator)
        _check(self.tis_cap is None or self.tis_cap > 0, "tis_cap", "None or > 0", self.tis_cap)
        _check(self.mis_high is None or self.mis_high > 1, "mis_high", "None or > 1 (ratio 1 is always kept)",
               self.mis_high)
        _check(0 <= self.mis_low < 1, "mis_low", "a value in [0, 1)", self.mis_low)
        _check(self.mis_high is not None or self.mis_low == 0, "mis_low", "0 without mis_high (MIS is off)",
               self.mis_low)
        _check(self.normalization in ("token", "trace"), "normalization", "token|trace", self.normalization)


@dataclass(frozen=True)
class CriticPPOConfig(PolicyLossConfig):
    """Critic PPO: the policy options plus the value loss."""

    value_clip_eps: float | None = 0.2
    """Clip of the new value around the rollout's ``value`` (PPO2 value clipping); None disables it."""
    critic_coef: float = 1.0
    """Weight of ``loss_critic = critic_coef * 0.5 * mean (V - value_target)^2`` (per policy token)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.value_clip_eps is None or self.value_clip_eps > 0, "value_clip_eps", "None or > 0",
               self.value_clip_eps)
        _check(self.critic_coef >= 0, "critic_coef", ">= 0", self.critic_coef)


TRACE_ADVANTAGES = ("broadcast", "split")
"""Values of :attr:`GRPOConfig.trace_advantage`."""


@dataclass(frozen=True)
class GRPOConfig(PolicyLossConfig):
    """GRPO: the policy options plus how the group-relative advantage is formed.

    The variants peers run on multi-trace rollouts: the episode's advantage on every trace
    (``trace_advantage="broadcast"``, the default: SkyRL's step-wise mode, NeMo-RL), split by the
    number of traces (``"split"``: each of an episode's ``K`` traces gets ``A / K``, as slime's
    coding-agent example divides the reward by its ``K`` branches), and Dr. GRPO (``scale_by_std=False``
    with the default ``normalization="token"``; ``benchmarks/boundary_experiment.py``'s ``dr_grpo``
    arm also turns the trainer's batch whitening off).
    """

    scale_by_std: bool = True
    """Divide by the group's reward std (GRPO); False keeps only the mean baseline (Dr. GRPO)."""
    eps: float = 1e-6
    """Added to the group std before dividing."""
    trace_advantage: Literal["broadcast", "split"] = "broadcast"
    """How an episode's group-relative advantage ``A`` reaches its traces: ``broadcast``: every
    policy token of every trace gets ``A``; ``split``: every policy token of each of the episode's
    ``K`` traces gets ``A / K`` (the episode's traces together carry one ``A``, however many it split into)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.eps >= 0, "eps", ">= 0", self.eps)
        _check(self.trace_advantage in TRACE_ADVANTAGES, "trace_advantage", "|".join(TRACE_ADVANTAGES),
               self.trace_advantage)
