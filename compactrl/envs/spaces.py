"""Text spaces for LLM environments.

Gymnasium's :class:`~gymnasium.spaces.Text` only contains strings drawn from its charset
(alphanumeric by default), but a model's response and a tool's output can hold any unicode
character. :class:`UnicodeText` keeps the ``Text`` interface (so wrappers and checkers that expect a
``Text`` keep working) and checks length only. :class:`ChatMessages` is the space of a chat context
(a tuple of ``{"role", "content"}`` messages), the context-budget wrapper's observation.

TorchRL: ``GymEnv``/``GymWrapper`` map a ``Text`` (so :class:`UnicodeText`) to a ``NonTensor``
spec; :func:`register_torchrl_specs` teaches them the same for :class:`ChatMessages` (the env
factory calls it whenever TorchRL's Gym bridge is loaded), so the messages travel as non-tensor data.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from gymnasium.spaces import Space, Text

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


class ChatMessages(Space):
    """Chat contexts: tuples of messages ``{"role": str, "content": str}`` with exactly those keys.

    A role has at most ``max_role_length`` characters, a content at most ``max_content_length``
    (any unicode, as :class:`UnicodeText`). ``sample`` draws a system message, a user message and
    alternating assistant/tool turns.
    """

    def __init__(self, max_content_length: int, *, max_role_length: int = 16, max_messages: int = 1 << 16,
                 seed: int | np.random.Generator | None = None) -> None:
        for name, value in (("max_content_length", max_content_length), ("max_role_length", max_role_length),
                            ("max_messages", max_messages)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        super().__init__(None, None, seed)
        self.max_content_length, self.max_role_length = max_content_length, max_role_length
        self.max_messages = max_messages
        self._content = UnicodeText(max_content_length)

    def contains(self, x: Any) -> bool:
        return isinstance(x, tuple) and len(x) <= self.max_messages and all(map(self._message, x))

    def _message(self, m: Any) -> bool:
        return (isinstance(m, dict) and m.keys() == {"role", "content"} and isinstance(m["role"], str)
                and len(m["role"]) <= self.max_role_length and self._content.contains(m["content"]))

    def sample(self, mask: Any = None, probability: Any = None) -> tuple[dict[str, str], ...]:
        if mask is not None or probability is not None:
            raise ValueError("ChatMessages.sample: masks are not supported, got one")
        self._content._np_random = self.np_random  # one seeded stream for the whole space
        n = int(self.np_random.integers(2, min(self.max_messages, 8) + 1)) if self.max_messages > 1 else 1
        roles = ["system", "user", *(("assistant", "tool")[i % 2] for i in range(n - 2))][:n]
        return tuple({"role": r, "content": self._content.sample()} for r in roles)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"ChatMessages(max_content_length={self.max_content_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChatMessages) and (self.max_content_length, self.max_role_length,
                                                    self.max_messages) == (other.max_content_length,
                                                                           other.max_role_length, other.max_messages)

    def __hash__(self) -> int:
        return hash(("ChatMessages", self.max_content_length, self.max_role_length, self.max_messages))


def register_torchrl_specs(*, only_if_loaded: bool = False) -> bool:
    """Register :class:`ChatMessages` -> ``NonTensor`` with TorchRL's Gym spec conversion.

    With ``only_if_loaded`` nothing is imported: it registers only when ``torchrl.envs.libs.gym``
    is already loaded (importing TorchRL costs seconds). Returns whether it registered.
    """
    if only_if_loaded and "torchrl.envs.libs.gym" not in sys.modules:
        return False
    from torchrl.data import NonTensor
    from torchrl.envs.libs.gym import register_gym_spec_conversion

    def convert(spec: ChatMessages, device: Any = None, **_: Any) -> NonTensor:
        return NonTensor((), device=device, example_data=({"role": "user", "content": "a message"},))

    register_gym_spec_conversion(ChatMessages)(convert)
    return True
