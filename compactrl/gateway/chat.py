"""Chat completions in the OpenAI format: request models, the tool-call text format, prompt ids.

The gateway applies the chat template once, itself, turn by turn with
:class:`~compactrl.wrappers.chat_format.ChatFormat`, so the ids it records are exactly the ids the
model saw. An assistant turn the gateway produced earlier in the same session is rendered from the
ids that were *sampled* (token-in/token-out), never by re-tokenising its text: an agent that sends
its history back therefore extends the previous prompt + response ids exactly, which is what trace
reconstruction (:mod:`compactrl.gateway.traces`) relies on.

Tool calls (one documented format, Hermes/Qwen style, parsed and rendered alike)::

    <tool_call>
    {"name": "bash", "arguments": {"command": "ls"}}
    </tool_call>

Tool definitions are rendered into the system turn (one created when the request has none) as a
``# Tools`` section listing one JSON schema per line inside ``<tools></tools>``. A block that is not
valid JSON with a string ``name`` stays part of the content: malformed model output is an
observation for the agent, never an error.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from compactrl.serving.completions import RequestError
from compactrl.wrappers.chat_format import ChatFormat

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)


class FunctionCall(BaseModel):
    name: str
    arguments: str = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: dict[str, Any]


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    """A ``/v1/chat/completions`` body (OpenAI's fields; vLLM's ``top_k``, ``stop_token_ids``,
    ``return_token_ids`` extras; unknown fields are ignored, as OpenAI-compatible servers do)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: str | dict[str, Any] | None = None
    n: int = Field(1, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    return_token_ids: bool = False


def content_text(content: str | list[dict[str, Any]] | None) -> str:
    """A message's text: a string, or the ``text`` parts of a list of content parts joined."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise RequestError(f"only text content parts are supported, got {part.get('type')!r}", param="messages")
        parts.append(part["text"])
    return "".join(parts)


def tools_text(tools: Sequence[ToolSpec]) -> str:
    lines = "\n".join(json.dumps({"type": "function", "function": t.function}, ensure_ascii=False) for t in tools)
    return TOOLS_HEADER + lines + TOOLS_FOOTER


def _canonical_args(arguments: str | dict) -> str:
    try:
        value = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return arguments  # an agent may echo broken arguments back: keep them verbatim
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def render_tool_calls(calls: Sequence[tuple[str, str]]) -> str:
    """``(name, arguments JSON)`` pairs as ``<tool_call>`` blocks (the parse of :func:`parse_tool_calls`)."""
    blocks = []
    for name, args in calls:
        try:
            parsed: Any = json.loads(args)
        except json.JSONDecodeError:
            parsed = args
        blocks.append("<tool_call>\n" + json.dumps({"name": name, "arguments": parsed}, ensure_ascii=False)
                      + "\n</tool_call>")
    return "\n".join(blocks)


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Split model text into content and OpenAI ``tool_calls``; malformed blocks stay content."""
    calls, kept, pos = [], [], 0
    for m in TOOL_CALL_RE.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", {})
        kept.append(text[pos:m.start()])
        pos = m.end()
        calls.append({
            "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"],
                         "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)},
        })
    if not calls:
        return text, []
    kept.append(text[pos:])
    return "".join(kept).strip(), calls


def assistant_key(content: str | None, tool_calls: Sequence[tuple[str, str]]) -> tuple:
    """What identifies an assistant message an agent sends back (None and "" content alike)."""
    return (content or "", tuple((n, _canonical_args(a)) for n, a in tool_calls))


class SampledTurns:
    """Exact ids of the assistant messages the gateway produced in one session, newest kept."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[tuple, tuple[tuple[int, ...], bool]] = OrderedDict()

    def put(self, key: tuple, ids: Sequence[int], finished: bool) -> None:
        self._ids[key] = (tuple(ids), finished)
        self._ids.move_to_end(key)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def get(self, key: tuple) -> tuple[tuple[int, ...], bool] | None:
        return self._ids.get(key)


def _calls_of(msg: ChatMessage) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in msg.tool_calls or []]


def prompt_ids(fmt: ChatFormat, request: ChatRequest, sampled: SampledTurns | None) -> list[int]:
    """The exact prompt ids of a chat request: turns rendered one by one, plus the generation prompt."""
    messages = list(request.messages)
    system_extra = tools_text(request.tools) if request.tools else ""
    if system_extra and messages[0].role not in ("system", "developer"):
        messages.insert(0, ChatMessage(role="system", content=""))
    ids: list[int] = []
    for i, msg in enumerate(messages):
        text = content_text(msg.content)
        if msg.role in ("system", "developer"):
            if i == 0 and system_extra:
                text = f"{text}\n\n{system_extra}" if text else system_extra
            ids += [*fmt.system.header, *fmt.encode(text), *fmt.system.footer]
        elif msg.role in ("user", "tool"):
            ids += fmt.turn(msg.role, text)
        else:
            ids += assistant_ids(fmt, text, _calls_of(msg), sampled)
    return ids + list(fmt.generation_prompt)


def assistant_ids(fmt: ChatFormat, content: str, calls: list[tuple[str, str]], sampled: SampledTurns | None) -> list[int]:
    """An assistant turn: the sampled ids when this session produced it, else its rendered text."""
    hit = sampled.get(assistant_key(content, calls)) if sampled is not None else None
    if hit is not None:
        body, finished = list(hit[0]), hit[1]
    else:
        text = "\n".join(x for x in (content, render_tool_calls(calls)) if x)
        body, finished = fmt.encode(text), False
    return [*fmt.generation_prompt, *body, *([] if finished else [fmt.end_of_turn]), *fmt.assistant_footer_rest]


def cut_at_stop(fmt: ChatFormat, ids: list[int], stops: Sequence[str]) -> tuple[list[int], str, bool]:
    """Ids up to the token that completes the first stop string, the text before it, and whether one hit.

    The kept ids are a prefix of what was sampled, so their log-probs stay exact; the text excludes
    the stop string, as OpenAI's does.
    """
    if not stops:
        return ids, "", False
    for k in range(1, len(ids) + 1):
        text = fmt.decode(ids[:k])
        hits = [text.find(s) for s in stops if s and s in text]
        if hits:
            return ids[:k], text[: min(hits)], True
    return ids, "", False
