"""Scripted policies: an oracle that solves generated code tasks, and a random policy.

:class:`OraclePolicy` is a pure function of ``(request.task, request.messages)``: it learns fact
values only by parsing the tool outputs (and its own summaries) it sees, reads fact files
sequentially in chunks (so contexts grow as a real agent's would), then views the bug file,
replaces each stale constant, runs the tests and submits. When asked to compact it writes a
summary (:func:`format_summary`) that drops each fact with probability ``1 - summary_quality``; a
fact whose file the summary says was read but whose value is missing is then guessed wrongly, as
an over-confident agent would. With ``summary_quality=1`` it solves every task; with 0 it fails
whenever a compaction loses a fact.

The summary format (:class:`SummaryState`, :func:`format_summary`, :func:`parse_summary`) is
task-agnostic and lives in :mod:`compactrl.policies.scripted.summary`, below both oracles (re-exported
here); the terminal oracle (:mod:`compactrl.policies.scripted.terminal`) answers terminal tasks.
"""

from __future__ import annotations

import ast
import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from compactrl.policies.scripted.summary import (
    SUMMARY_CLOSE,
    SUMMARY_OPEN,
    SummaryState,
    format_summary,
    parse_summary,
)
from compactrl.policies.scripted.terminal import TerminalOraclePolicy
from compactrl.tasksets.generators.facts import code_value
from compactrl.tools import ToolCall, format_call
from compactrl.types import Message, PolicyRequest

__all__ = ["SUMMARY_CLOSE", "SUMMARY_OPEN", "Knowledge", "OraclePolicy", "RandomPolicy", "SummaryState",
           "format_summary", "in_words", "observe", "parse_summary"]

_VIEW_HEADER = re.compile(r"^(\S+) \(lines (\d+)-(\d+) of (\d+)\)$")
_ASSIGNMENT = re.compile(r"^([A-Z][A-Z0-9_]*) = ")
_REPLACE_HEADER = re.compile(r"^Replaced \d+ line\(s\) of (\S+) at line (\d+)")
_NUMBERED = re.compile(r"^\s*(\d+)\t(.*)$")


# ----------------------------------------------------------------------------------------------
# what the oracle knows


@dataclass
class Knowledge:
    """What a scripted agent knows at a step: read lines, facts (found or guessed), fixes, tests."""

    read: dict[str, int] = field(default_factory=dict)  # contiguous lines read from the top
    facts: dict[str, object] = field(default_factory=dict)
    guessed: set[str] = field(default_factory=set)
    fixed: set[str] = field(default_factory=set)
    tested_after_fix: bool = False
    seen_lines: dict[str, dict[int, str]] = field(default_factory=dict)


def observe(messages: Sequence[Message], facts_meta: list[dict]) -> Knowledge:
    """Everything the oracle knows: the latest summary plus the tool outputs after it.

    ``facts_meta`` are the facts the generator recorded in the task (``task.metadata["facts"]``); a
    fact is known once a line matching its recorded ``pattern`` was seen in its ``file``, its value
    the stated text under its recorded ``transform``
    (:func:`~compactrl.tasksets.generators.facts.code_value`)."""
    know = Knowledge()
    start = 0
    for i, msg in enumerate(messages):
        if SUMMARY_OPEN in msg.get("content", "") and msg.get("role") != "system":
            state = parse_summary(msg["content"])
            if state is not None:
                know = _from_summary(state)
                start = i + 1
    for msg in messages[start:]:
        if msg.get("role") in ("tool", "user"):
            _read_output(msg.get("content", ""), know)
    for fact in facts_meta:
        if fact["key"] in know.facts:
            continue
        regex = re.compile(fact["pattern"])
        for line in know.seen_lines.get(fact["file"], {}).values():
            match = regex.search(line)
            if match:
                know.facts[fact["key"]] = code_value(fact["transform"], match.group(1))
                break
    return know


def _from_summary(state: SummaryState) -> Knowledge:
    know = Knowledge(read=dict(state.read))
    for key, literal in state.facts.items():
        try:
            know.facts[key] = ast.literal_eval(literal)
        except (ValueError, SyntaxError):
            continue
    know.fixed = {d.removeprefix("fixed ") for d in state.done if d.startswith("fixed ")}
    know.tested_after_fix = "tested" in state.done
    return know


def _read_output(text: str, know: Knowledge) -> None:
    lines = text.split("\n")
    head = lines[0] if lines else ""
    if head.startswith("Tests: "):
        know.tested_after_fix = True  # the oracle tests only after its last fix
        return
    view, rep = _VIEW_HEADER.match(head), _REPLACE_HEADER.match(head)
    if not (view or rep):
        return
    path = (view or rep).group(1)
    seen = know.seen_lines.setdefault(path, {})
    numbered = []
    for line in lines[1:]:
        match = _NUMBERED.match(line)
        if not match:
            if "clipped" in line and numbered:
                numbered.pop()  # the line before a clip marker may be cut short
            break  # a clip marker or a note: what follows is not contiguous
        numbered.append((int(match.group(1)), match.group(2)))
    expected = int(view.group(2)) if view else None
    for number, text in numbered:
        seen[number] = text
        if view and number == expected and know.read.get(path, 0) >= number - 1:
            know.read[path] = number
            expected += 1
    if rep:
        know.tested_after_fix = False
        for _, text in numbered:  # its own edit: that constant is fixed (to the value it wrote)
            match = _ASSIGNMENT.match(text)
            if match:
                know.fixed.add(match.group(1))


# ----------------------------------------------------------------------------------------------
# the oracle


class OraclePolicy:
    """Solves generated code tasks through the tool language (see the module docstring).

    Extension point: a demonstrator that acts differently subclasses it and overrides the public
    methods :meth:`respond` (one request -> one response), :meth:`next_call` (the next tool call
    given what is known), :meth:`summary` (the summary text) and :meth:`guess_lost_facts`; calling
    ``super()`` gives the oracle's own choice (see ``compactrl.policies.scripted.demonstrators``).

    Args:
        summary_quality: probability that each fact survives into a summary.
        seed: seeds the (deterministic, message-dependent) choice of dropped facts.
        chunk_lines: lines per ``view`` when reading a file.
    """

    def __init__(self, summary_quality: float = 1.0, seed: int = 0, chunk_lines: int = 25) -> None:
        if not 0.0 <= summary_quality <= 1.0:
            raise ValueError(f"summary_quality: expected a value in [0, 1], got {summary_quality!r}")
        if chunk_lines < 1:
            raise ValueError(f"chunk_lines: expected >= 1, got {chunk_lines!r}")
        self.summary_quality, self.seed, self.chunk_lines = float(summary_quality), int(seed), int(chunk_lines)

    def act(self, requests: Sequence[PolicyRequest]) -> list[str]:
        return [self.respond(r) for r in requests]

    def respond(self, request: PolicyRequest) -> str:
        task = request.task
        if getattr(task, "kind", None) == "terminal":  # generated terminal tasks have their own oracle
            return TerminalOraclePolicy(self.summary_quality, self.seed).respond(request)
        if task is None or "facts" not in getattr(task, "metadata", {}):
            raise ValueError("OraclePolicy needs request.task: a generated code task (with metadata['facts'])")
        meta = task.metadata
        know = observe(request.messages, meta["facts"])
        self.guess_lost_facts(know, meta)
        if request.compaction_required:
            return self.summary(know, task, request.messages)
        return _describe_then_call(self.next_call(know, task))

    def guess_lost_facts(self, know: Knowledge, meta: dict) -> None:
        """A fact read but no longer known is 'remembered' as a look-alike value (overconfidence)."""
        for fact in meta["facts"]:
            if fact["key"] not in know.facts and know.read.get(fact["file"], 0) >= fact["line"]:
                know.facts[fact["key"]] = _plausible_wrong_value(fact)
                know.guessed.add(fact["key"])

    def next_call(self, know: Knowledge, task) -> ToolCall:
        """The oracle's next tool call: read each fact where it is stated, fix, test, submit."""
        meta = task.metadata
        for fact in sorted(meta["facts"], key=lambda f: (f["file"], f["line"])):
            if fact["key"] not in know.facts:
                lo = know.read.get(fact["file"], 0) + 1
                return ToolCall("view", path=fact["file"], start=lo, end=lo + self.chunk_lines - 1)
        bug = meta["bug_file"]
        last_const = max(_line_of(task.files[bug], f["key"]) for f in meta["facts"])
        if know.read.get(bug, 0) < last_const and not know.fixed:
            lo = know.read.get(bug, 0) + 1
            return ToolCall("view", path=bug, start=lo, end=lo + self.chunk_lines - 1)
        for fact, fix in zip(meta["facts"], meta["fix"]):
            key = fact["key"]
            line = f"{key} = {know.facts[key]!r}"
            if key not in know.fixed and line not in know.seen_lines.get(bug, {}).values():
                return ToolCall("replace", path=bug, old=fix["old"], new=line + "\n")
        if not know.tested_after_fix:
            return ToolCall("test")
        return ToolCall("submit")

    def summary(self, know: Knowledge, task, messages: Sequence[Message]) -> str:
        """What is known, each fact kept with probability ``summary_quality``, and the next step."""
        facts = {}
        for key, value in sorted(know.facts.items()):
            if self._keeps(task.id, key, len(messages)):
                facts[key] = repr(value)
        fixed = set(know.fixed) | {
            f["key"] for f in task.metadata["facts"]
            if f"{f['key']} = {know.facts.get(f['key'], object())!r}" in know.seen_lines.get(task.metadata["bug_file"], {}).values()
        }
        done = [f"fixed {k}" for k in sorted(fixed)] + (["tested"] if know.tested_after_fix else [])
        next_call = self.next_call(know, task)
        state = SummaryState(read=dict(know.read), facts=facts, done=done, next=in_words(next_call))
        return format_summary(state)

    def _keeps(self, task_id: str, key: str, n_messages: int) -> bool:
        digest = hashlib.blake2b(f"{self.seed}|{task_id}|{key}|{n_messages}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < self.summary_quality


def _line_of(source: str, key: str) -> int:
    for i, line in enumerate(source.split("\n"), start=1):
        if line.startswith(f"{key} = ") or line.startswith(f"{key}: "):
            return i
    return 1


def _plausible_wrong_value(fact: dict) -> object:
    """What an over-confident agent 'remembers': a look-alike value seen in the project."""
    for distractor in fact["distractors"]:
        value = code_value(fact["transform"], distractor["stated"])
        if value != fact["value"] and value != fact["wrong_value"]:
            return value
    return fact["wrong_value"]


def in_words(call: ToolCall) -> str:
    """A tool call as the plan line of a response or a summary (``fix KEY = V in FILE``)."""
    if call.name == "view":
        return f"view {call.path} lines {call.start}-{call.end}"
    if call.name == "replace":
        return f"fix {call.new.strip()} in {call.path}"
    return {"test": "run the tests", "submit": "submit"}.get(call.name, call.name)


def _describe_then_call(call: ToolCall) -> str:
    return f"Next: {in_words(call)}.\n{format_call(call)}"


# ----------------------------------------------------------------------------------------------
# the random policy


_WORDS = ("def", "import", "return", "TODO", "page", "fee", "=", "config", "test", "Contract", "the", "0")


class RandomPolicy:
    """Arbitrary unicode, malformed calls and random valid calls (stateful, seeded RNG).

    File names come from the task message's listing in ``request.messages``.
    """

    def __init__(self, seed: int = 0, submit_prob: float = 0.02) -> None:
        if not 0.0 <= submit_prob <= 1.0:
            raise ValueError(f"submit_prob: expected a value in [0, 1], got {submit_prob!r}")
        self.rng = random.Random(seed)
        self.submit_prob = submit_prob

    def act(self, requests: Sequence[PolicyRequest]) -> list[str]:
        return [self.respond(r) for r in requests]

    def respond(self, request: PolicyRequest) -> str:
        rng = self.rng
        if request.compaction_required:
            return "I read some files. " + self._noise(rng.randint(0, 80))
        roll = rng.random()
        if roll < self.submit_prob:
            return "<tool>submit</tool>"
        if roll < 0.2:
            return self._noise(rng.randint(0, 300))
        if roll < 0.35:
            return rng.choice(_MALFORMED)
        return format_call(self._valid_call(_listed_files(request.messages)))

    def _noise(self, n: int) -> str:
        pool = "abcdefghijklmnopqrstuvwxyz <>/\n\t\"'=éß中😀\u0301\u202e" + "<tool>"
        return "".join(self.rng.choice(pool) for _ in range(n))

    def _valid_call(self, files: list[str]) -> ToolCall:
        rng = self.rng
        path = rng.choice(files) if files and rng.random() < 0.9 else rng.choice(("nope.py", "a/b", "."))
        kind = rng.choice(("view", "view", "view", "search", "replace", "create", "test", "shell"))
        if kind == "view":
            if rng.random() < 0.5:
                return ToolCall("view", path=path)
            lo = rng.randint(1, 200)
            return ToolCall("view", path=path, start=lo, end=lo + rng.randint(0, 60))
        if kind == "search":
            return ToolCall("search", pattern=rng.choice(_WORDS), path=rng.choice((None, path)))
        if kind == "replace":
            return ToolCall("replace", path=path, old=rng.choice(_WORDS), new=rng.choice(_WORDS + ("",)))
        if kind == "create":
            return ToolCall("create", path=rng.choice((f"scratch/{rng.randint(0, 9)}.txt", path)), content=self._noise(40))
        if kind == "shell":
            return ToolCall("shell", command=rng.choice(("ls", "cat README.md", "python -m pytest -q")))
        return ToolCall("test")


_MALFORMED = (
    "<tool>view</tool>",
    "<tool>frobnicate x</tool>",
    "<tool>view a.py</tool><tool>test</tool>",
    "<tool>view a.py 5 2</tool>",
    "<tool>replace a.py\n<old>\nx\n</old>\n</tool>",
    "<tool>create a.py</tool>",
    "<tool>test now</tool>",
    "<tool>search</tool>",
    "<tool>view a.py",
    "</tool>",
    "",
)


def _listed_files(messages: Sequence[Message]) -> list[str]:
    for msg in messages:
        if msg.get("role") == "user" and "Files in the work dir" in msg.get("content", ""):
            return re.findall(r"^(\S+) \(\d+ lines\)$", msg["content"], flags=re.M)
    return []
