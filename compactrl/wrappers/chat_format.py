"""Exact, incremental chat-template token ids for one tokenizer.

A context is built turn by turn: every turn's ids are ``header + content + footer``, where the
header and footer come from the tokenizer's own chat template (rendered once, around a sentinel)
and the content is tokenised on its own with special-token strings treated as plain text (a tool
output that prints ``<|im_end|>`` must not close the turn). Appending a turn therefore costs
time proportional to that turn, never to the whole context.

The ids are the template's text tokenised *per part*; with byte-level BPE they equal tokenising
the whole rendered text except where a content starts with whitespace that the pre-tokenizer
would have merged into the header's last newline. The ids a learned policy sees (the
``prompt_token_ids`` of the context-budget wrapper) are these per-part ids, in training and at
serving alike.

The same object is the token spec of a tokenizer: its stop ids (end-of-turn and eos), pad id and
special ids are derived here once, from the template, for the wrapper and the policies alike
(:func:`chat_format` caches one per tokenizer, :func:`stop_ids` adds a model's own eos ids).

Text that is not valid unicode (lone surrogates, e.g. bytes decoded with ``surrogateescape``) is
tokenised as :func:`valid_unicode` makes it: each lone surrogate becomes U+FFFD.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_SENTINEL = "\u2063CTXSENTINEL\u2063"  # invisible separator: never produced by a template itself


@dataclass(frozen=True)
class TurnIds:
    """The template's ids around one role's content: ``header + content + footer``."""

    header: tuple[int, ...]
    footer: tuple[int, ...]


class ChatFormat:
    """Per-role header/footer ids, the generation prompt and the end-of-turn id of a tokenizer.

    Works with any Hugging Face tokenizer whose chat template renders a conversation as the
    concatenation of its turns (ChatML, Llama 3, Qwen 2.5 and most others); a template that rewrites
    earlier turns is rejected with a ``ValueError``.
    """

    def __init__(self, tokenizer: Any, *, tool_role: str = "tool") -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("tokenizer: expected a tokenizer with a chat template, got one without")
        self.tokenizer = tokenizer
        self.tool_role = tool_role
        self._plain = _plain_encoder(tokenizer)
        sys_text = self._render([{"role": "system", "content": _SENTINEL}])
        self.system = self._split(sys_text, "system")
        base = [{"role": "system", "content": "x"}, {"role": "user", "content": "x"}]
        self.user = self._turn(base[:1], "user")
        self.tool = self.user if tool_role == "user" else self._turn(base, tool_role)
        assistant = self._turn(base, "assistant")
        gen = self._suffix(base, self._render(base, add_generation_prompt=True), "the generation prompt")
        self.generation_prompt: tuple[int, ...] = tuple(self.encode_special(gen))
        if not assistant.footer:
            raise ValueError("tokenizer: its chat template closes assistant turns with no token")
        self.end_of_turn: int = assistant.footer[0]
        self.assistant_footer_rest: tuple[int, ...] = assistant.footer[1:]
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop_ids = frozenset({self.end_of_turn} | ({int(eos)} if isinstance(eos, int) else set()))
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id: int = int(pad) if isinstance(pad, int) else min(self.stop_ids)
        self.special_ids = frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", ())) | self.stop_ids
        self.vocab_size = len(tokenizer)

    # -- tokenising -------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Content ids: special-token strings in ``text`` are plain text, nothing is added."""
        return self._plain(valid_unicode(text))

    def encode_special(self, text: str) -> list[int]:
        """Template ids: special-token strings become their ids."""
        return list(self.tokenizer.encode(valid_unicode(text), add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def turn(self, role: str, content: str) -> list[int]:
        """The ids of one whole turn (not the system turn, which may carry a begin-of-text id)."""
        t = self.tool if role == "tool" else self.user if role == "user" else None
        if t is None:
            raise ValueError(f"role: expected 'user' or 'tool' for an appended turn, got {role!r}")
        return [*t.header, *self.encode(content), *t.footer]

    def prefix(self, system: str, task: str) -> list[int]:
        """The ids of a context's fixed start: the system turn and the task (a user turn)."""
        return [*self.system.header, *self.encode(system), *self.system.footer, *self.turn("user", task)]

    # -- deriving the template's pieces --------------------------------------------------------

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
        except Exception as exc:  # jinja raises whatever the template raises
            roles = [m["role"] for m in messages]
            raise ValueError(f"tokenizer: its chat template cannot render roles {roles}: {exc}") from exc

    def _suffix(self, base: list[dict[str, str]], text: str, what: str) -> str:
        head = self._render(base)
        if not text.startswith(head):
            raise ValueError(
                f"tokenizer: its chat template re-renders earlier turns when {what} is added; "
                "the context wrapper needs a template that appends turns"
            )
        return text[len(head) :]

    def _turn(self, base: list[dict[str, str]], role: str) -> TurnIds:
        text = self._render([*base, {"role": role, "content": _SENTINEL}])
        return self._split(self._suffix(base, text, f"a {role!r} turn"), role)

    def _split(self, text: str, role: str) -> TurnIds:
        if text.count(_SENTINEL) != 1:
            raise ValueError(f"tokenizer: its chat template does not render a {role!r} turn's content verbatim")
        head, tail = text.split(_SENTINEL)
        return TurnIds(tuple(self.encode_special(head)), tuple(self.encode_special(tail)))


def valid_unicode(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (surrogate pairs are joined).

    A Python ``str`` may hold surrogates (``"\\ud800"``, or bytes decoded with ``surrogateescape``)
    that no UTF-8 tokenizer accepts; valid text is returned as is (the check is one encode).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


_FORMATS: OrderedDict[tuple[int, str, str], ChatFormat] = OrderedDict()
_FORMATS_MAX = 16  # a format holds its tokenizer: a bounded cache keeps short-lived ones collectable


def chat_format(tokenizer: Any, *, tool_role: str = "tool") -> ChatFormat:
    """The :class:`ChatFormat` of ``tokenizer``, built once per tokenizer object (and chat template).

    Shared: treat it as read-only. Building one renders the template a few times (~15 ms), which
    every env of a batch would otherwise repeat.
    """
    key = (id(tokenizer), str(getattr(tokenizer, "chat_template", None)), tool_role)
    fmt = _FORMATS.get(key)
    if fmt is None or fmt.tokenizer is not tokenizer:  # an id can be reused after collection
        fmt = _FORMATS[key] = ChatFormat(tokenizer, tool_role=tool_role)
        if len(_FORMATS) > _FORMATS_MAX:
            _FORMATS.popitem(last=False)
    _FORMATS.move_to_end(key)
    return fmt


def stop_ids(tokenizer: Any, model: Any = None) -> list[int]:
    """The ids that end a response: the chat format's end-of-turn and eos ids, plus ``model``'s
    generation-config eos ids. A tokenizer without a chat template contributes its eos id only."""
    if getattr(tokenizer, "chat_template", None) is not None:
        ids = set(chat_format(tokenizer).stop_ids)
    else:
        eos = getattr(tokenizer, "eos_token_id", None)
        ids = {int(eos)} if isinstance(eos, int) else set()
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is not None:
        ids |= {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}
    if not ids:
        raise ValueError("tokenizer: cannot tell the end-of-turn token (no chat template, no eos id): "
                         "pass stop_token_ids")
    return sorted(ids)


def _plain_encoder(tokenizer: Any):
    """A fast content encoder: the Rust tokenizer with special-token parsing off, when available."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_special_tokens"):
        plain = copy.deepcopy(backend)
        plain.encode_special_tokens = True
        plain.no_truncation()
        plain.no_padding()
        return lambda text: plain.encode(text, add_special_tokens=False).ids
    return lambda text: list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
