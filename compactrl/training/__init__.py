"""Training: the configuration tree (:mod:`.config`), the loop (:mod:`.trainer`) with its phases
(:mod:`.sft`, :mod:`.update`), the learner in one process or on FSDP2 ranks (:mod:`.learner`,
:mod:`.ranks`), where batches come from (:mod:`.rollouts`), the run directory
(:mod:`.run_dir`) and ``compactrl train`` (:mod:`.cli`). The maths it runs (advantages, losses, packing)
is in :mod:`compactrl.algos`.

Names resolve lazily, so that ``import compactrl.training`` does not import torch.
"""

from __future__ import annotations

from compactrl.lazy import lazy_exports

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
    "Learner": "compactrl.training.learner",
    "make_learner": "compactrl.training.ranks",
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
