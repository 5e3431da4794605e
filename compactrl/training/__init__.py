"""Training: the configuration tree (:mod:`.config`), the loop (:mod:`.trainer`) with its phases
(:mod:`.sft`, :mod:`.update`), where batches come from (:mod:`.rollouts`), the run directory
(:mod:`.run_dir`) and ``compactrl train`` (:mod:`.cli`). The maths it runs (advantages, losses, packing)
is in :mod:`compactrl.algos`.

Names resolve lazily, so that ``import compactrl.training`` does not import torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TrainConfig": "compactrl.training.config",
    "PRESETS": "compactrl.training.config",
    "preset": "compactrl.training.config",
    "override": "compactrl.training.config",
    "train": "compactrl.training.trainer",
    "TrainResult": "compactrl.training.trainer",
    "Rollouts": "compactrl.training.rollouts",
    "make_rollouts": "compactrl.training.rollouts",
    "RunDir": "compactrl.training.run_dir",
    "Updater": "compactrl.training.update",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'compactrl.training' has no attribute {name!r}")
