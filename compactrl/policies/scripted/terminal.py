"""A scripted oracle for generated terminal tasks (``CompactTerminal-v0``).

Like the code oracle, :class:`TerminalOraclePolicy` is a pure function of ``(request.task,
request.messages)``: it knows from the task's metadata *where* each fact is, but learns fact values
only from the tool outputs (and its own summaries) in its context. It reads each fact's file from
the top in chunks with ``echo FILE; cat -n FILE | sed -n 'A,Bp'`` (so contexts grow as a reading
agent's do), then runs the task's solution commands with the values it found, and submits.

When asked to compact it writes a summary in the shared format of
:func:`compactrl.policies.scripted.summary.format_summary` that keeps each fact with probability
``summary_quality``. A fact whose file the summary says was read past it, but whose value was
dropped, is "remembered" wrongly (a distractor's value), as an over-confident agent would.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from compactrl.policies.scripted.summary import SUMMARY_OPEN, SummaryState, format_summary, parse_summary
from compactrl.tasksets.generators.terminal import render_solution
from compactrl.tools import ToolCall, format_call, parse_action
from compactrl.types import Message, PolicyRequest

_NUMBERED = re.compile(r"^\s*(\d+)\t(.*)$")


@dataclass
class _Knowledge:
    read: dict[str, int] = field(default_factory=dict)  # contiguous lines read from the top
    facts: dict[str, str] = field(default_factory=dict)
    guessed: set[str] = field(default_factory=set)
    done: set[int] = field(default_factory=set)  # solution steps run
    seen_lines: dict[str, dict[int, str]] = field(default_factory=dict)


def read_command(path: str, start: int, end: int) -> str:
    """The oracle's chunk read: the file name, then its numbered lines ``start..end``."""
    return f"echo {path}; cat -n {path} | sed -n '{start},{end}p'"


def _parse_read(text: str, files: dict[str, str], know: _Knowledge) -> None:
    lines = text.split("\n")
    if not lines or lines[0].strip() not in files:
        return
    path = lines[0].strip()
    seen = know.seen_lines.setdefault(path, {})
    numbered: list[tuple[int, str]] = []
    for line in lines[1:]:
        m = _NUMBERED.match(line)
        if not m:
            if "clipped" in line and numbered:
                numbered.pop()  # the line before a clip marker may be cut short
            break
        numbered.append((int(m.group(1)), m.group(2)))
    for number, body in numbered:
        seen[number] = body
        if know.read.get(path, 0) == number - 1:
            know.read[path] = number


def _observe(messages: Sequence[Message], task) -> _Knowledge:
    meta = task.metadata["terminal"]
    know, start = _Knowledge(), 0
    for i, msg in enumerate(messages):
        if msg.get("role") != "system" and SUMMARY_OPEN in msg.get("content", ""):
            state = parse_summary(msg["content"])
            if state is not None:
                know, start = _from_summary(state), i + 1
    shell_commands: list[str] = []
    for msg in messages[start:]:
        role, content = msg.get("role"), msg.get("content", "")
        if role == "assistant":
            call = parse_action(content)
            if isinstance(call, ToolCall) and call.name == "shell" and call.command:
                shell_commands.append(call.command)
        elif role in ("tool", "user"):
            _parse_read(content, task.files, know)
    for fact in meta["facts"]:
        if fact["key"] in know.facts:
            continue
        rx = re.compile(fact["pattern"])
        for body in know.seen_lines.get(fact["file"], {}).values():
            m = rx.search(body)
            if m:
                know.facts[fact["key"]] = m.group(1)
                break
    know.shell_commands = shell_commands  # type: ignore[attr-defined]
    return know


def _from_summary(state: SummaryState) -> _Knowledge:
    know = _Knowledge(read=dict(state.read))
    for key, literal in state.facts.items():
        if len(literal) >= 2 and literal[0] == literal[-1] == "'":
            know.facts[key] = literal[1:-1]
    know.done = {int(d.split()[1]) for d in state.done if re.fullmatch(r"step \d+", d)}
    return know


class TerminalOraclePolicy:
    """Solves generated terminal tasks through the shell (see the module docstring).

    Args:
        summary_quality: probability that each fact survives into a summary.
        seed: seeds the (deterministic, message-dependent) choice of dropped facts.
        chunk_chars: a chunk read ends once its lines hold about this many characters.
    """

    def __init__(self, summary_quality: float = 1.0, seed: int = 0, chunk_chars: int = 700) -> None:
        if not 0.0 <= summary_quality <= 1.0:
            raise ValueError(f"summary_quality: expected a value in [0, 1], got {summary_quality!r}")
        if chunk_chars < 1:
            raise ValueError(f"chunk_chars: expected >= 1, got {chunk_chars!r}")
        self.summary_quality, self.seed, self.chunk_chars = float(summary_quality), int(seed), int(chunk_chars)

    def act(self, requests: Sequence[PolicyRequest]) -> list[str]:
        return [self.respond(r) for r in requests]

    def respond(self, request: PolicyRequest) -> str:
        task = request.task
        if task is None or "terminal" not in getattr(task, "metadata", {}):
            raise ValueError("TerminalOraclePolicy needs request.task: a generated terminal task "
                             "(with metadata['terminal'])")
        know = _observe(request.messages, task)
        self._guess_lost_facts(know, task)
        if request.compaction_required:
            return self._summary(know, task, request.messages)
        call = self._next_call(know, task)
        return f"Next: {_in_words(call)}.\n{format_call(call)}"

    def _guess_lost_facts(self, know: _Knowledge, task) -> None:
        for fact in task.metadata["terminal"]["facts"]:
            if fact["key"] not in know.facts and know.read.get(fact["file"], 0) >= fact["line"]:
                wrong = [w for w in fact["wrong"] if w != fact["value"]]
                know.facts[fact["key"]] = wrong[0] if wrong else _off_by_one(fact["value"])
                know.guessed.add(fact["key"])

    def _chunk_end(self, task, path: str, start: int) -> int:
        lines = task.files.get(path, "").split("\n")
        end, size = start, 0
        while end <= len(lines):
            size += len(lines[end - 1]) + 8
            if size > self.chunk_chars and end > start:
                return end - 1
            end += 1
        return max(start, len(lines))

    def _steps(self, know: _Knowledge, task) -> list[str]:
        return render_solution(task, know.facts)

    def _next_call(self, know: _Knowledge, task) -> ToolCall:
        meta = task.metadata["terminal"]
        for fact in sorted(meta["facts"], key=lambda f: (f["file"], f["line"])):
            if fact["key"] not in know.facts:
                lo = know.read.get(fact["file"], 0) + 1
                return ToolCall("shell", command=read_command(fact["file"], lo, self._chunk_end(task, fact["file"], lo)))
        steps = self._steps(know, task)
        ran = set(getattr(know, "shell_commands", []))
        for i, cmd in enumerate(steps):
            if i not in know.done and cmd not in ran:
                return ToolCall("shell", command=cmd)
        return ToolCall("submit")

    def _summary(self, know: _Knowledge, task, messages: Sequence[Message]) -> str:
        facts = {k: repr(v) for k, v in sorted(know.facts.items()) if self._keeps(task.id, k, len(messages))}
        done = set(know.done)
        if len(know.facts) == len(task.metadata["terminal"]["facts"]):
            ran = set(getattr(know, "shell_commands", []))
            done |= {i for i, cmd in enumerate(self._steps(know, task)) if cmd in ran}
        state = SummaryState(read=dict(know.read), facts=facts, done=[f"step {i}" for i in sorted(done)],
                             next=_in_words(self._next_call(know, task)))
        return format_summary(state)

    def _keeps(self, task_id: str, key: str, n_messages: int) -> bool:
        digest = hashlib.blake2b(f"{self.seed}|{task_id}|{key}|{n_messages}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < self.summary_quality


def _off_by_one(value: str) -> str:
    return str(int(value) + 1) if value.isdigit() else value + "x"


def _in_words(call: ToolCall) -> str:
    if call.name == "shell":
        m = re.match(r"echo (\S+); cat -n \S+ \| sed -n '(\d+),(\d+)p'$", call.command or "")
        if m:
            return f"read {m.group(1)} lines {m.group(2)}-{m.group(3)}"
        return f"run {call.command}"
    return call.name
