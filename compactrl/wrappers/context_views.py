"""A read-only view that lets :class:`~compactrl.wrappers.context_budget.ContextBudget` hand out a
step's prompt ids without copying the context.

A step used to copy the whole trace's ids into ``info["prompt_token_ids"]``: O(context) per step,
so an episode cost O(context^2) in all (docs/context_budget.md). The trace's id list only ever
grows, so a step's prompt is a fixed-length prefix of it plus the generation prompt.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain, islice
from typing import Any


class PromptIds(Sequence):
    """``ids[:n] + tail`` without copying ``ids``, which the owner only ever appends to.

    A read-only ``Sequence[int]``: ``len``, indexing, slicing (a slice is a ``list``), iteration and
    ``==`` with lists and tuples behave as the list would. Pickling and copying give that ``list``
    (what crosses a process boundary is plain data).
    """

    __slots__ = ("_ids", "_n", "_tail")

    def __init__(self, ids: list[int], n: int, tail: Sequence[int] = ()) -> None:
        if not 0 <= n <= len(ids):
            raise ValueError(f"n: expected 0..{len(ids)}, got {n}")
        self._ids, self._n, self._tail = ids, n, tuple(tail)

    def __len__(self) -> int:
        return self._n + len(self._tail)

    def __getitem__(self, index: Any):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            return self._slice(start, stop) if step == 1 else list(self)[index]
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError("PromptIds index out of range")
        return self._ids[i] if i < self._n else self._tail[i - self._n]

    def _slice(self, start: int, stop: int) -> list[int]:
        if stop <= start:
            return []
        head = self._ids[start:min(stop, self._n)] if start < self._n else []
        return head + list(self._tail[max(start - self._n, 0):max(stop - self._n, 0)])

    def __iter__(self) -> Iterator[int]:
        return chain(islice(self._ids, self._n), self._tail)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (PromptIds, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list, so unhashable like one

    def __reduce__(self):
        return list, (list(self),)

    def __repr__(self) -> str:
        return f"PromptIds({list(self)!r})" if len(self) <= 16 else f"PromptIds(<{len(self)} ids>)"
