"""The scripted agents' summary format, shared by the code and the terminal oracle.

A summary is a block between ``<summary>`` and ``</summary>`` that lists the files read (from line 1
to a line), the finished steps, the facts kept (``KEY = value``) and the next step;
:func:`format_summary` writes one from a :class:`SummaryState` and :func:`parse_summary` reads the
last one in a text back. It is the lowest layer of the scripted policies: it imports nothing of theirs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SUMMARY_OPEN, SUMMARY_CLOSE = "<summary>", "</summary>"


@dataclass
class SummaryState:
    """What a scripted agent carries across a compaction.

    ``read``: file -> last line read (files are read from line 1 on); ``facts``: key -> value, as a
    Python literal; ``done``: finished steps (e.g. ``"fixed PAGE_SIZE"``, ``"tested"``);
    ``next``: the next step, in words.
    """

    read: dict[str, int] = field(default_factory=dict)
    facts: dict[str, str] = field(default_factory=dict)
    done: list[str] = field(default_factory=list)
    next: str = ""


def format_summary(state: SummaryState) -> str:
    """Render a summary; :func:`parse_summary` reads it back."""
    read = ", ".join(f"{path} lines 1-{line}" for path, line in sorted(state.read.items()))
    lines = [
        SUMMARY_OPEN,
        f"read: {read or 'nothing yet'}",
        f"done: {', '.join(state.done) or 'nothing yet'}",
        "facts:",
        *(f"{key} = {value}" for key, value in sorted(state.facts.items())),
        f"next: {state.next}",
        SUMMARY_CLOSE,
    ]
    return "\n".join(lines)


def parse_summary(text: str) -> SummaryState | None:
    """The last summary block in ``text``, or None if there is none."""
    start = text.rfind(SUMMARY_OPEN)
    end = text.find(SUMMARY_CLOSE, start)
    if start < 0 or end < 0:
        return None
    state = SummaryState()
    in_facts = False
    for line in text[start + len(SUMMARY_OPEN) : end].splitlines():
        if line.startswith("read: "):
            for path, last in re.findall(r"(\S+) lines 1-(\d+)", line):
                state.read[path] = int(last)
        elif line.startswith("done: ") and line != "done: nothing yet":
            state.done = [d.strip() for d in line[6:].split(",") if d.strip()]
        elif line.startswith("next: "):
            state.next, in_facts = line[6:], False
        elif line == "facts:":
            in_facts = True
        elif in_facts and " = " in line:
            key, value = line.split(" = ", 1)
            state.facts[key.strip()] = value.strip()
    return state
