"""Pack trace rows into micro-batches under a token budget, and measure the padding it saves.

A micro-batch is a set of whole rows padded to its own longest row, so its cost is
``rows * longest_row`` positions. :func:`pack_rows` sorts rows by length (longest first) and puts
each into the first micro-batch that stays within ``token_budget`` (first-fit decreasing); rows of
similar length end up together and padding shrinks. The losses normalise by whole-batch token
counts (:func:`compactrl.algos.losses.add_loss_normalizers`), so any packing gives the same
accumulated gradient.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase

__all__ = ["pack_rows", "row_lengths", "micro_batches", "PaddingReport", "padding_share"]

log = logging.getLogger(__name__)


def row_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """Length of every row up to its last real position (rows are right-padded)."""
    pos = torch.arange(1, attention_mask.shape[-1] + 1, device=attention_mask.device)
    return (attention_mask * pos).amax(-1) if attention_mask.shape[-1] else attention_mask.sum(-1)


def pack_rows(lengths: Sequence[int] | torch.Tensor, token_budget: int) -> list[torch.Tensor]:
    """Row indices per micro-batch, first-fit decreasing, each with ``rows * longest <= token_budget``.

    A row longer than the budget cannot be split (its tokens depend on each other) and gets a
    micro-batch of its own, with a warning.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    lengths = [int(x) for x in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    widths: list[int] = []  # the first row placed is the longest: it sets the width
    for i in order:
        for rows, width in zip(groups, widths):
            if (len(rows) + 1) * width <= token_budget:
                rows.append(i)
                break
        else:
            if lengths[i] > token_budget:
                log.warning(
                    "a row of %d tokens exceeds the micro-batch budget of %d", lengths[i], token_budget
                )
            groups.append([i])
            widths.append(max(lengths[i], 1))
    return [torch.tensor(sorted(rows), dtype=torch.long) for rows in groups]


def micro_batches(batch: TensorDictBase, token_budget: int) -> list[TensorDictBase]:
    """Split a trace batch into packed micro-batches, each trimmed to its own longest row.

    Entries whose second dimension is the batch's token length are token-aligned and trimmed; the
    others (per-trace scalars, normalisers) are only indexed.
    """
    mask = batch["attention_mask"]
    width = mask.shape[-1]
    lengths = row_lengths(mask)
    out = []
    for rows in pack_rows(lengths, token_budget):
        keep = max(int(lengths[rows].max()), 1)
        part = batch[rows.to(mask.device)]
        out.append(part.apply(lambda t, k=keep: t[:, :k] if t.dim() >= 2 and t.shape[1] == width else t))
    return out


@dataclass(frozen=True)
class PaddingReport:
    """Computed positions of one batch under three layouts, and the share of them that is padding."""

    real_tokens: int
    """Positions holding a token."""
    padded_positions: int
    """One tensor padded to the longest row (``N * L``, the trace batch as stored)."""
    sequential_positions: int
    """Rows in arrival order, cut greedily under the budget, each micro-batch padded to its longest."""
    packed_positions: int
    """:func:`pack_rows` micro-batches, each padded to its longest row."""
    micro_batches: int
    """Number of packed micro-batches."""

    def share(self, positions: int) -> float:
        return 1.0 - self.real_tokens / positions if positions else 0.0

    @property
    def padded_share(self) -> float:
        return self.share(self.padded_positions)

    @property
    def sequential_share(self) -> float:
        return self.share(self.sequential_positions)

    @property
    def packed_share(self) -> float:
        return self.share(self.packed_positions)


def _sequential_positions(lengths: list[int], token_budget: int) -> int:
    total, rows, width = 0, 0, 0
    for n in lengths:
        if rows and (rows + 1) * max(width, n) > token_budget:
            total, rows, width = total + rows * width, 0, 0
        rows, width = rows + 1, max(width, n)
    return total + rows * width


def padding_share(lengths: Sequence[int] | torch.Tensor, token_budget: int) -> PaddingReport:
    """Padding of packed micro-batches against a padded tensor and arrival-order micro-batches."""
    lengths = [int(x) for x in (lengths.tolist() if isinstance(lengths, torch.Tensor) else lengths)]
    groups = pack_rows(lengths, token_budget)
    packed = sum(len(g) * max(lengths[i] for i in g.tolist()) for g in groups)
    return PaddingReport(
        real_tokens=sum(lengths),
        padded_positions=len(lengths) * max(lengths, default=0),
        sequential_positions=_sequential_positions(lengths, token_budget),
        packed_positions=packed,
        micro_batches=len(groups),
    )
