"""``tool_choice``: ``"required"`` and a named function, as vLLM's OpenAI-compatible server takes them.

With either, the answer is constrained to be tool calls in the gateway's one format
(:mod:`compactrl.gateway.chat`)::

    <tool_call>
    {"name": "<an offered name>", "arguments": {...}}
    </tool_call>

``"required"``: one or more such blocks (joined by a newline), each naming an offered tool; a named
function: exactly one block naming it. The arguments are a JSON object in the separators the
format prints (``", "`` and ``": "``, no other whitespace); where the tool's ``parameters`` list
``properties``, its keys are those (each once, every ``required`` one present) and a property
with a ``type`` takes a value of that JSON type. Nested values are any JSON.

How it is enforced: :class:`ToolCallGrammar` is a character-level acceptor of that language whose
states are hashable, so the set of vocabulary tokens that keep the text inside it (the mask) is
computed once per state. :func:`constrained_generate` samples token by token with every other
token's logit at -inf, as vLLM's structured outputs do: the recorded ids are the ones sampled and
their log-probs those of the masked, renormalised distribution (the distribution actually sampled).
Engines that do not expose logits are constrained by rejection instead (``app.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from compactrl.policies.sampling import Generated, SamplingConfig, draw, sampling_log_probs
from compactrl.policies.transformers_policy import positions_from_mask
from compactrl.serving.completions import RequestError

CALL_HEAD = '<tool_call>\n{"name": '
CALL_ARGS = ', "arguments": '
CALL_TAIL = "}\n</tool_call>"
JSON_TYPES = frozenset({"string", "number", "integer", "boolean", "null", "object", "array"})
_NUMBER_DONE = frozenset({"zero", "int", "frac", "exp"})


# --------------------------------------------------------------------------------------------------
# the request field


@dataclass(frozen=True)
class ToolChoice:
    """What a request's ``tool_choice`` asks: calls of ``names`` (more than one block when ``multiple``)."""

    names: tuple[str, ...]
    multiple: bool
    parameters: dict[str, dict]
    """Each offered name's JSON schema (its ``parameters``; {} when it gives none)."""

    @property
    def label(self) -> str:
        return "required" if self.multiple else f"function:{self.names[0]}"


def parse_tool_choice(tool_choice: Any, tools: Sequence[Any] | None) -> ToolChoice | None:
    """The constraint a ``tool_choice`` asks for (None: "auto", "none" or absent), or a 400 naming the field."""
    if tool_choice is None or tool_choice in ("auto", "none"):
        return None
    named = None
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function")
        named = fn.get("name") if isinstance(fn, dict) else None
        if tool_choice.get("type", "function") != "function" or not isinstance(named, str) or not named:
            raise RequestError("Invalid `tool_choice`: expected \"none\", \"auto\", \"required\" or "
                               '{"type": "function", "function": {"name": "my_function"}}, got '
                               f"{json.dumps(tool_choice)[:200]}", param="tool_choice")
    elif tool_choice != "required":
        raise RequestError(f"Invalid value for `tool_choice`: {str(tool_choice)[:100]!r}; only a named tool, "
                           '"none", "auto" or "required" are supported', param="tool_choice")
    if not tools:
        raise RequestError("When using `tool_choice`, `tools` must be set.", param="tool_choice")
    schemas: dict[str, dict] = {}
    for t in tools:
        fn = t.function if hasattr(t, "function") else t.get("function", {})
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError("every tool needs a function name (a string)", param="tools")
        params = fn.get("parameters")
        schemas[name] = params if isinstance(params, dict) else {}
    if named is not None:
        if named not in schemas:
            raise RequestError(f"The tool specified in `tool_choice` ({named!r}) does not match any of the "
                               f"specified `tools` ({sorted(schemas)})", param="tool_choice")
        return ToolChoice((named,), False, {named: schemas[named]})
    return ToolChoice(tuple(schemas), True, schemas)


# --------------------------------------------------------------------------------------------------
# the language, one character at a time

# A state is a nested tuple (hashable, so masks are cached per state):
#   ("head", prefix)        matching CALL_HEAD + a quoted offered name + CALL_ARGS
#   ("args", name, stack)   inside the arguments object; stack: tuple of frames, innermost last
#   ("lit", rest, then)     the literal ``rest``, then state ``then``
#   ("end",)                a whole call: end of turn (or, with ``multiple``, "\n" and another call)
# Frames: ("val", types) a value of one of ``types`` (None: any) is next; ("str", esc) inside a string
# (esc 0, -1 after a backslash, k>0 hex digits of a \u escape left); ("num", sub, integer_only);
# ("word", rest) the rest of true/false/null; ("obj", sub, spec) and ("arr", sub) containers, where
# ``spec`` is None (any keys) or (props, required, seen) for the arguments object itself, and
# ("key", prefix, props) matching one of the declared keys.


def _types(schema: Any) -> frozenset[str] | None:
    t = schema.get("type") if isinstance(schema, dict) else None
    names = {t} if isinstance(t, str) else set(t) if isinstance(t, list) else set()
    names &= JSON_TYPES
    if "integer" in names and "number" in names:
        names.discard("integer")
    return frozenset(names) or None


def _key_spec(schema: dict) -> tuple | None:
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return None
    pairs = tuple((json.dumps(k, ensure_ascii=False), k, _types(v)) for k, v in props.items())
    required = frozenset(k for k in schema.get("required", ()) if k in props)
    return (pairs, required, frozenset())


class ToolCallGrammar:
    """Character-level acceptor of the tool-call answers a :class:`ToolChoice` allows."""

    def __init__(self, choice: ToolChoice) -> None:
        self.choice = choice
        self.heads = {CALL_HEAD + json.dumps(n, ensure_ascii=False) + CALL_ARGS: n for n in choice.names}
        self.head_prefixes = {h[:i] for h in self.heads for i in range(len(h) + 1)}
        self.specs = {n: _key_spec(choice.parameters.get(n, {})) for n in choice.names}

    @property
    def start(self) -> tuple:
        return ("head", "")

    @staticmethod
    def accepting(state: tuple) -> bool:
        return state[0] == "end"

    def feed(self, state: tuple | None, text: str) -> tuple | None:
        for ch in text:
            if state is None:
                return None
            state = self.step(state, ch)
        return state

    def step(self, state: tuple, ch: str) -> tuple | None:
        kind = state[0]
        if kind == "head":
            p = state[1] + ch
            if p in self.heads:
                name = self.heads[p]
                return ("args", name, (("obj", "start", self.specs[name]),))
            return ("head", p) if p in self.head_prefixes else None
        if kind == "lit":
            rest, then = state[1], state[2]
            if ch != rest[0]:
                return None
            return ("lit", rest[1:], then) if len(rest) > 1 else then
        if kind == "end":
            return ("head", "") if ch == "\n" and self.choice.multiple else None
        stack = _json_step(state[2], ch)
        if stack is None:
            return None
        if not stack:  # the arguments object closed
            return ("lit", CALL_TAIL, ("end",))
        return ("args", state[1], stack)


def _done(stack: tuple) -> tuple:
    """The innermost frame was a whole value: pop it and move its container on."""
    stack = stack[:-1]
    if not stack:
        return stack
    parent = stack[-1]
    if isinstance(parent[1], tuple):  # a key string ended: its colon is next
        return stack
    return stack[:-1] + ((parent[0], "after") + parent[2:],)


def _value_start(stack: tuple, types: frozenset[str] | None, ch: str) -> tuple | None:
    def ok(t: str) -> bool:
        return types is None or t in types

    if ch == '"' and ok("string"):
        frame: tuple = ("str", 0)
    elif ch == "{" and ok("object"):
        frame = ("obj", "open", None)
    elif ch == "[" and ok("array"):
        frame = ("arr", "open")
    elif (ch == "-" or ch.isdigit() and ch.isascii()) and (ok("number") or ok("integer")):
        frame = ("num", "sign" if ch == "-" else "zero" if ch == "0" else "int", types is not None
                 and "number" not in types)
    elif ch in "tfn" and ok("boolean" if ch != "n" else "null"):
        frame = ("word", {"t": "rue", "f": "alse", "n": "ull"}[ch])
    else:
        return None
    return stack + (frame,)


def _number_step(sub: str, ch: str, integer_only: bool) -> str | None:
    digit = ch.isascii() and ch.isdigit()
    if sub == "sign":
        return "zero" if ch == "0" else "int" if digit else None
    if sub in ("zero", "int"):
        if digit and sub == "int":
            return "int"
        if integer_only:
            return None
        return "dot" if ch == "." else "e" if ch in "eE" else None
    if sub in ("dot", "frac"):
        return "frac" if digit else ("e" if sub == "frac" and ch in "eE" else None)
    if sub == "e":
        return "esign" if ch in "+-" else "exp" if digit else None
    if sub in ("esign", "exp"):
        return "exp" if digit else None
    return None


def _json_step(stack: tuple, ch: str) -> tuple | None:
    frame = stack[-1]
    kind = frame[0]
    if kind == "val":
        return _value_start(stack[:-1], frame[1], ch)
    if kind == "str":
        esc = frame[1]
        if esc == 0:
            if ch == '"':
                return _done(stack)
            if ch == "\\":
                return stack[:-1] + (("str", -1),)
            return stack if ch >= " " else None  # control characters must be escaped
        if esc == -1:
            if ch == "u":
                return stack[:-1] + (("str", 4),)
            return stack[:-1] + (("str", 0),) if ch in '"\\/bfnrt' else None
        if ch in "0123456789abcdefABCDEF":
            return stack[:-1] + (("str", esc - 1),)
        return None
    if kind == "num":
        nxt = _number_step(frame[1], ch, frame[2])
        if nxt is not None:
            return stack[:-1] + (("num", nxt, frame[2]),)
        if frame[1] in _NUMBER_DONE:  # the number ended: the character belongs to its container
            after = _done(stack)
            return _json_step(after, ch) if after else None
        return None
    if kind == "word":
        rest = frame[1]
        if ch != rest[0]:
            return None
        return stack[:-1] + (("word", rest[1:]),) if len(rest) > 1 else _done(stack)
    if kind == "key":
        prefix, pairs = frame[1] + ch, frame[2]
        for quoted, _key, types in pairs:
            if quoted == prefix:
                obj = stack[-2]
                props, required, seen = obj[2]
                spec = (props, required, seen | {_key})
                return stack[:-2] + (("obj", ("colon", types), spec),)
        return stack[:-1] + (("key", prefix, pairs),) if any(q.startswith(prefix) for q, _, _ in pairs) else None
    if kind == "arr":
        sub = frame[1]
        if sub == "open":
            if ch == "]":
                return _done(stack)
            return _json_step(stack[:-1] + (("arr", "val"), ("val", None)), ch)
        if sub == "after":
            return _done(stack) if ch == "]" else stack[:-1] + (("arr", "comma"),) if ch == "," else None
        if sub == "comma":
            return stack[:-1] + (("arr", "val"), ("val", None)) if ch == " " else None
        return None
    return _object_step(stack, frame, ch)


def _object_step(stack: tuple, frame: tuple, ch: str) -> tuple | None:
    sub, spec = frame[1], frame[2]
    left = None if spec is None else [p for p in spec[0] if p[1] not in spec[2]]
    may_close = spec is None or spec[1] <= spec[2]

    def key_start() -> tuple | None:
        if spec is None:
            return stack[:-1] + (("obj", ("colon", None), None), ("str", 0)) if ch == '"' else None
        if not left:
            return None
        return _json_step(stack + (("key", "", tuple(left)),), ch)

    if sub == "start":
        return stack[:-1] + (("obj", "open", spec),) if ch == "{" else None
    if sub == "open":
        return _done(stack) if ch == "}" and may_close else key_start()
    if sub == "after":
        if ch == "}":
            return _done(stack) if may_close else None
        return stack[:-1] + (("obj", "comma", spec),) if ch == "," and (left is None or left) else None
    if sub == "comma":
        return stack[:-1] + (("obj", "key", spec),) if ch == " " else None
    if sub == "key":
        return key_start()
    if isinstance(sub, tuple):  # ("colon", types) after a key; ("space", types) after its colon
        if sub[0] == "colon":
            return stack[:-1] + (("obj", ("space", sub[1]), spec),) if ch == ":" else None
        if ch == " ":
            return stack[:-1] + (("obj", "val", spec), ("val", sub[1]))
        return None
    return None


# --------------------------------------------------------------------------------------------------
# the masks and the sampler


class TokenMasks:
    """Per grammar state, which token ids keep the text in the language (cached per state)."""

    def __init__(self, grammar: ToolCallGrammar, tokenizer, stop_ids: Iterable[int], special_ids: Iterable[int] = ()):
        self.grammar = grammar
        self.vocab_size = len(tokenizer)
        self.stop_ids = sorted(set(stop_ids))
        excluded = set(special_ids) | set(self.stop_ids)
        self.texts: list[tuple[int, str]] = []
        for i in range(self.vocab_size):
            text = tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            # a token that is part of a character (byte-level BPE) has no text of its own to check
            if i not in excluded and text and "\ufffd" not in text:
                self.texts.append((i, text))
        self.text_of = dict(self.texts)
        self._cache: dict[tuple, torch.Tensor] = {}

    def allowed(self, state: tuple) -> torch.Tensor:
        mask = self._cache.get(state)
        if mask is None:
            mask = torch.zeros(self.vocab_size, dtype=torch.bool)
            ids = [i for i, text in self.texts if self.grammar.feed(state, text) is not None]
            if self.grammar.accepting(state):
                ids += self.stop_ids
            mask[ids] = True
            self._cache[state] = mask
        return mask


@torch.no_grad()
def constrained_generate(model, prompt: Sequence[int], max_tokens: int, *, masks: TokenMasks,
                         sampling: SamplingConfig, report: SamplingConfig, stop_ids: Iterable[int],
                         generator: torch.Generator | None = None, top_logprobs: int = 0) -> Generated:
    """One continuation of ``prompt`` inside ``masks.grammar`` (KV cache, one row).

    Every step samples from the model's distribution with the tokens that would leave the language
    at -inf; the recorded log-prob is the sampled token's under that masked distribution (``report``'s
    temperature and truncation, as for unconstrained calls). It stops at a stop id (allowed only once
    a whole answer is written), at ``max_tokens``, or where no token is allowed (``finished`` False).
    """
    from transformers import DynamicCache

    grammar, stop = masks.grammar, set(stop_ids)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt)], device=device)
    mask = torch.ones_like(ids)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask), cache=cache,
                use_cache=True, logits_to_keep=1)
    result = Generated([], [], False, [] if top_logprobs else None)
    state: tuple | None = grammar.start
    pos = len(prompt)
    for _ in range(max_tokens):
        allowed = masks.allowed(state).to(device)
        if not bool(allowed.any()):
            break
        logits = out.logits[:, -1].float().masked_fill(~allowed, float("-inf"))
        logp = sampling_log_probs(logits, sampling)
        tok = draw(logp, sampling, generator)
        if report != sampling:
            logp = sampling_log_probs(logits, report)
        t = int(tok[0])
        result.token_ids.append(t)
        result.log_probs.append(float(logp[0, t]))
        if top_logprobs:
            top = torch.topk(logp[0], min(top_logprobs, int(allowed.sum())))
            result.top_logprobs.append(list(zip(top.indices.tolist(), top.values.tolist())))
        if t in stop:
            result.finished = True
            break
        state = grammar.feed(state, masks.text_of[t])
        mask = torch.cat([mask, mask.new_ones(1, 1)], dim=1)
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=torch.tensor([[pos]], device=device),
                    cache=cache, use_cache=True)
        pos += 1
    return result
