"""Text spaces for LLM environments.

Gymnasium's :class:`~gymnasium.spaces.Text` only contains strings drawn from its charset
(alphanumeric by default), but a model's response and a tool's output can hold any unicode
character. :class:`UnicodeText` keeps the ``Text`` interface (so wrappers and checkers that expect a
``Text`` keep working) and checks length only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.spaces import Text

# What ``sample`` draws from: printable ASCII, whitespace, the tool-language markers' characters,
# and a few non-ASCII blocks (accents, Greek, CJK, emoji, a combining mark, a right-to-left letter)
# so that sampled strings exercise unicode handling without being pure noise.
SAMPLE_CHARSET: str = (
    "".join(chr(c) for c in range(32, 127))
    + "\n\t"
    + "éüßñçøå"
    + "αβγδλπΩ"
    + "中文字符测试"
    + "😀🔥✓→∑"
    + "\u0301\u05d0\u00a0"
)


class UnicodeText(Text):
    """A ``Text`` space that contains any ``str`` whose length lies in ``[min_length, max_length]``.

    ``sample`` draws characters from :data:`SAMPLE_CHARSET` with a length of at most
    ``sample_max_length`` (a space whose ``max_length`` is a million would otherwise sample
    megabyte strings).
    """

    def __init__(
        self,
        max_length: int,
        *,
        min_length: int = 0,
        sample_max_length: int = 256,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        if sample_max_length < min_length:
            raise ValueError(
                f"sample_max_length must be >= min_length ({min_length}), got {sample_max_length}"
            )
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)
        self.sample_max_length = int(sample_max_length)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is None and probability is None:
            high = min(self.max_length, self.sample_max_length)
            length = int(self.np_random.integers(self.min_length, high + 1))
            return super().sample(mask=(length, None))
        return super().sample(mask=mask, probability=probability)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    @property
    def is_np_flattenable(self) -> bool:
        # Flattening indexes characters in the charset, which any unicode string may leave.
        return False

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:
        return hash(("UnicodeText", self.min_length, self.max_length))
