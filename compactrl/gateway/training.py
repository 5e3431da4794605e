"""Recorded black-box sessions -> one critic-PPO update: what a trainer's black-box source runs.

:func:`session_batch` turns finished sessions into the trace batch (:func:`sessions_to_batch`), adds
the critic's values, advantages over the trace trees (:func:`~compactrl.algos.tree_gae.tree_gae`)
and the whole-batch loss normalisers; :func:`ppo_update` takes one optimiser step of a
:class:`~compactrl.algos.losses.CriticPPOLoss` on it. The trainer's own loop (micro-batches, epochs,
checkpoints) consumes the same batch; these two functions are the smallest complete use of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDict

from compactrl.algos.losses import CriticPPOLoss, add_loss_normalizers
from compactrl.algos.tree_gae import tree_gae
from compactrl.gateway.recording import Session
from compactrl.gateway.traces import sessions_to_batch


def session_batch(sessions: Sequence[Session], critic, *, pad_id: int = 0, gamma: float = 1.0,
                  lmbda: float = 1.0) -> TensorDict:
    """Finished sessions as a trace batch with ``value``, ``advantage``, ``value_target`` and normalisers."""
    unfinished = [s.name for s in sessions if not s.finished]
    if unfinished:
        raise ValueError(f"sessions: expected finished sessions (with a reward), got unfinished {unfinished}")
    batch = sessions_to_batch(sessions, pad_id=pad_id)
    with torch.no_grad():
        batch.set("value", critic.value(batch["tokens"], batch["attention_mask"]).float())
    tree_gae(batch, gamma=gamma, lmbda=lmbda)
    return add_loss_normalizers(batch)


def ppo_update(loss: CriticPPOLoss, optimizer: torch.optim.Optimizer, batch: TensorDict) -> dict[str, float]:
    """One optimiser step on the sum of the loss terms; returns every term and diagnostic as floats."""
    out = loss(batch)
    total = sum(v for k, v in out.items() if k.startswith("loss_"))
    optimizer.zero_grad(set_to_none=True)
    total.backward()
    optimizer.step()
    return {k: float(v) for k, v in out.items()}
