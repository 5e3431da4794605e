"""The tool language: parsing a model response into one tool call, and rendering calls back.

A response may contain free text (reasoning) and exactly one tool call::

    <tool>view PATH [START END]</tool>
    <tool>search PATTERN [PATH]</tool>
    <tool>replace PATH
    <old>
    exact old text
    </old>
    <new>
    new text
    </new>
    </tool>
    <tool>create PATH
    <content>
    file contents
    </content>
    </tool>
    <tool>test</tool>
    <tool>shell COMMAND</tool>
    <tool>submit</tool>

Payload rule (``<old>``, ``<new>``, ``<content>``): the payload is the exact text between the
opening and the closing tag, except that ONE newline directly after the opening tag is dropped.
So ``<old>\\nx = 1\\n</old>`` is ``"x = 1\\n"`` and ``<new>\\n</new>`` is the empty string.

Everything here is a pure function; the environment turns a :class:`FormatError` into an
observation (never an exception). The full reference is ``docs/tool_language.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

TOOL_NAMES: tuple[str, ...] = ("view", "search", "replace", "create", "test", "shell", "submit")
OPEN, CLOSE = "<tool>", "</tool>"


class ToolCall(NamedTuple):
    """One parsed tool call. Only the fields of its tool are set; the others stay ``None``.

    (A named tuple rather than a frozen dataclass: it is built on every env step, and a frozen
    dataclass's ``__init__`` costs several times more.)
    """

    name: str
    path: str | None = None
    start: int | None = None
    end: int | None = None
    pattern: str | None = None
    old: str | None = None
    new: str | None = None
    content: str | None = None
    command: str | None = None


@dataclass(frozen=True)
class FormatError:
    """Why a response is not exactly one well-formed tool call. ``tool``: the name, if recognised."""

    message: str
    tool: str | None = None


def parse_action(text: str) -> ToolCall | FormatError:
    """Parse ``text`` into exactly one :class:`ToolCall`, or explain what is wrong."""
    if not isinstance(text, str):
        return FormatError(f"a response must be a str, got {type(text).__name__}")
    opens, closes = text.count(OPEN), text.count(CLOSE)
    if opens == 0:
        return FormatError("no tool call found: put exactly one <tool>...</tool> in your response")
    if opens > 1 or closes > 1:
        return FormatError(f"found {max(opens, closes)} tool calls: send exactly one <tool>...</tool> per response")
    start = text.index(OPEN) + len(OPEN)
    end = text.find(CLOSE, start)
    if end < 0:
        return FormatError("the tool call is not closed: end it with </tool>")
    body = text[start:end].lstrip()
    name = body.split(None, 1)[0] if body.strip() else ""
    rest = body[len(name):]
    parser = _PARSERS.get(name)
    if parser is None:
        shown = repr(name[:40]) if name else "nothing"
        return FormatError(f"unknown tool {shown}: the tools are {', '.join(TOOL_NAMES)}")
    return parser(rest)


def _parse_view(rest: str) -> ToolCall | FormatError:
    args = rest.split()
    usage = "usage: <tool>view PATH</tool> or <tool>view PATH START END</tool> (1-based, inclusive)"
    if len(args) not in (1, 3):
        return FormatError(f"view takes a path and optionally a line range; {usage}", "view")
    if len(args) == 1:
        return ToolCall("view", path=args[0])
    try:
        lo, hi = int(args[1]), int(args[2])
    except ValueError:
        return FormatError(f"view line numbers must be integers; {usage}", "view")
    if lo < 1 or hi < lo:
        return FormatError(f"view needs 1 <= START <= END, got {lo} {hi}; {usage}", "view")
    return ToolCall("view", path=args[0], start=lo, end=hi)


def _parse_search(rest: str) -> ToolCall | FormatError:
    usage = 'usage: <tool>search PATTERN [PATH]</tool>; quote a pattern with spaces: search "two words"'
    rest = rest.strip()
    if rest.startswith('"'):
        close = rest.find('"', 1)
        if close < 0:
            return FormatError(f"unterminated quoted pattern; {usage}", "search")
        pattern, tail = rest[1:close], rest[close + 1 :].split()
    else:
        parts = rest.split()
        pattern, tail = (parts[0] if parts else ""), parts[1:]
    if not pattern:
        return FormatError(f"search needs a non-empty pattern; {usage}", "search")
    if len(tail) > 1:
        return FormatError(f"search takes at most one path; {usage}", "search")
    return ToolCall("search", pattern=pattern, path=tail[0] if tail else None)


def _blocks(rest: str, tags: tuple[str, ...], usage: str, tool: str) -> tuple[str, list[str]] | FormatError:
    """Split ``PATH\\n<a>..</a><b>..</b>`` into the path and the payloads of ``tags``, in order."""
    head, sep, after = rest.partition("\n")
    path_parts = head.split()
    if len(path_parts) != 1:
        return FormatError(f"{tool} needs exactly one path on its first line; {usage}", tool)
    pos, payloads = 0, []
    for tag in tags:
        opening, closing = f"<{tag}>", f"</{tag}>"
        if after.count(opening) != 1 or after.count(closing) != 1:
            return FormatError(f"{tool} needs exactly one {opening}...{closing} block; {usage}", tool)
        i, j = after.find(opening), after.find(closing)
        if i < pos or j < i or after[pos:i].strip():
            return FormatError(f"{tool} blocks must come in this order with nothing between: {usage}", tool)
        payload = after[i + len(opening) : j]
        payloads.append(payload[1:] if payload.startswith("\n") else payload)
        pos = j + len(closing)
    if after[pos:].strip():
        return FormatError(f"unexpected text after the last block of {tool}; {usage}", tool)
    return path_parts[0], payloads


def _parse_replace(rest: str) -> ToolCall | FormatError:
    usage = "usage: <tool>replace PATH\\n<old>\\nexact old text\\n</old>\\n<new>\\nnew text\\n</new>\\n</tool>"
    parsed = _blocks(rest, ("old", "new"), usage, "replace")
    if isinstance(parsed, FormatError):
        return parsed
    path, (old, new) = parsed
    if not old:
        return FormatError("replace needs a non-empty <old> text", "replace")
    return ToolCall("replace", path=path, old=old, new=new)


def _parse_create(rest: str) -> ToolCall | FormatError:
    usage = "usage: <tool>create PATH\\n<content>\\nfile contents\\n</content>\\n</tool>"
    parsed = _blocks(rest, ("content",), usage, "create")
    if isinstance(parsed, FormatError):
        return parsed
    path, (content,) = parsed
    return ToolCall("create", path=path, content=content)


def _no_args(name: str):
    def parse(rest: str) -> ToolCall | FormatError:
        if rest.strip():
            return FormatError(f"{name} takes no arguments: <tool>{name}</tool>", name)
        return ToolCall(name)

    return parse


def _parse_shell(rest: str) -> ToolCall | FormatError:
    command = rest.strip()
    if not command:
        return FormatError("shell needs a command: <tool>shell COMMAND</tool>", "shell")
    return ToolCall("shell", command=command)


_PARSERS = {
    "view": _parse_view,
    "search": _parse_search,
    "replace": _parse_replace,
    "create": _parse_create,
    "test": _no_args("test"),
    "submit": _no_args("submit"),
    "shell": _parse_shell,
}


def format_call(call: ToolCall) -> str:
    """Render ``call`` in the tool language; ``parse_action(format_call(c)) == c`` for valid calls."""
    if call.name == "view":
        rng = "" if call.start is None else f" {call.start} {call.end}"
        return f"<tool>view {call.path}{rng}</tool>"
    if call.name == "search":
        pattern = call.pattern or ""
        if any(c.isspace() for c in pattern) or pattern.startswith('"'):
            pattern = f'"{pattern}"'
        return f"<tool>search {pattern}{'' if call.path is None else ' ' + call.path}</tool>"
    if call.name == "replace":
        return f"<tool>replace {call.path}\n<old>\n{call.old}</old>\n<new>\n{call.new}</new>\n</tool>"
    if call.name == "create":
        return f"<tool>create {call.path}\n<content>\n{call.content}</content>\n</tool>"
    if call.name == "shell":
        return f"<tool>shell {call.command}</tool>"
    return f"<tool>{call.name}</tool>"


def normalize_path(path: str) -> str:
    """Canonical work-dir-relative POSIX path (``""`` is the work dir itself).

    Raises ``ValueError`` for absolute paths and paths that climb out with ``..``.
    """
    if path and path[0] not in "./" and "//" not in path and "/." not in path and path[-1] != "/":
        return path  # already canonical (the common case)
    if path.startswith("/"):
        raise ValueError(f"paths are relative to the work dir; got absolute path {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"paths may not contain '..'; got {path!r}")
    return "/".join(parts)


_DESCRIPTIONS = {
    "view": "<tool>view PATH [START END]</tool> show a file's numbered lines (a directory: its files)",
    "search": '<tool>search TEXT [PATH]</tool> list lines containing TEXT (quote "two words")',
    "replace": "<tool>replace PATH\n<old>\nexact old text\n</old>\n<new>\nnew text\n</new>\n</tool>"
    " replace text that occurs exactly once",
    "create": "<tool>create PATH\n<content>\ntext\n</content>\n</tool> create or overwrite a file",
    "test": "<tool>test</tool> run the tests",
    "shell": "<tool>shell COMMAND</tool> run a shell command",
    "submit": "<tool>submit</tool> finish; the tests grade your work",
}


def describe_tools(tools: tuple[str, ...]) -> str:
    """The tool-language part of a system prompt, for the given tools (in the given order).

    Kept short on purpose: it is in every context. ``docs/tool_language.md`` is the full reference.
    """
    rules = "Reply with exactly one tool call; other text is ignored. One newline after <old>, <new>, <content> is dropped."
    return "\n".join(_DESCRIPTIONS[t] for t in tools) + "\n" + rules

__all__ = ["FormatError", "ToolCall", "describe_tools", "format_call", "normalize_path", "parse_action"]
