"""Algorithms, the maths only: GAE (flat, across traces, over trace trees), critic PPO and GRPO losses,
packing, the boundary-bias analysis and the critic diagnostics. The loop that runs them is in
:mod:`compactrl.training`.

Names resolve lazily (one line per name below), so that importing a light module such as
``compactrl.algos.gae`` does not import torchrl.
"""

from __future__ import annotations

from compactrl.lazy import lazy_exports

_EXPORTS = {
    "gae_loop": "compactrl.algos.gae",
    "trace_gae": "compactrl.algos.gae",
    "length_adaptive_lambda": "compactrl.algos.gae",
    "PolicyLossConfig": "compactrl.algos.loss_config",
    "CriticPPOConfig": "compactrl.algos.loss_config",
    "GRPOConfig": "compactrl.algos.loss_config",
    "CriticPPOLoss": "compactrl.algos.losses",
    "GRPOLoss": "compactrl.algos.losses",
    "loss_mask": "compactrl.algos.losses",
    "add_loss_normalizers": "compactrl.algos.losses",
    "grpo_advantage": "compactrl.algos.losses",
    "whiten_advantages": "compactrl.algos.losses",
    "build_losses": "compactrl.algos.losses",
    "advantage_estimator": "compactrl.algos.losses",
    "pack_rows": "compactrl.algos.packing",
    "micro_batches": "compactrl.algos.packing",
    "padding_share": "compactrl.algos.packing",
    "PaddingReport": "compactrl.algos.packing",
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
