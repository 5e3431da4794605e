"""Scripted demonstrators for the supervised warm start: oracles whose choices a learner can imitate.

:class:`ReadingOrderOracle` is an :class:`~compactrl.policies.scripted.code.OraclePolicy` that reads
candidate files in an order that depends only on what its context shows, so a model trained on its
episodes learns choices it could have made itself; its summaries are the oracle's, each fact
surviving with probability ``summary_quality``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

from compactrl.policies.scripted.code import SUMMARY_OPEN, Knowledge, OraclePolicy, in_words, observe
from compactrl.tools import ToolCall
from compactrl.types import PolicyRequest

__all__ = ["ReadingOrderOracle", "reading_order", "shuffled_order"]


class ReadingOrderOracle(OraclePolicy):
    """An oracle whose every choice a learner can imitate from its own context.

    :class:`~compactrl.policies.scripted.code.OraclePolicy` reads the file that holds each fact
    directly: it knows the location from the task's metadata, which a learned policy never sees,
    so imitating it teaches guessing. This demonstrator reads the candidate files in a fixed
    order that depends only on the task message's file list (``config/``, ``README.md``,
    ``docs/``, then the package's other modules), stops as soon as it has seen every fact, and
    then proceeds as the oracle does (view the bug file, replace, test, submit). Summaries are the
    oracle's, dropping each fact with probability ``1 - summary_quality``, so a lost fact makes
    the episode fail, as it would for an agent that trusted a bad summary.

    With ``reproduce_first`` it runs the tests once before fixing (``Next: run the tests, then
    fix KEY = V in FILE.``), views the bug file again when its stale line is neither in the current
    context nor stated by the latest summary, and a summary that drops a fact drops it everywhere: its ``next``
    line then names the constant without a value. So when the compaction falls between reading
    the facts and writing the fix, the fix is only as good as the summary.

    A task generated with ``demo_order="shuffled"`` (``CodeTaskConfig``; the ``variable_chain``
    preset) is read in an order drawn from the demonstrator's ``seed`` and the task id instead
    (:func:`shuffled_order`): the learner sees a next file chosen among the unread candidates, so
    its own episodes of one task read different numbers of files before the fact and compact a
    different number of times. Once the fact is known its summaries list only the bug file as read,
    so a summary that drops the fact sends the next trace exploring again (a longer chain, not a
    guessed value): what a summary keeps decides how many traces follow it.
    """

    def __init__(self, summary_quality: float = 1.0, seed: int = 0, chunk_lines: int = 25,
                 reproduce_first: bool = False) -> None:
        super().__init__(summary_quality=summary_quality, seed=seed, chunk_lines=chunk_lines)
        self.reproduce_first = reproduce_first
        self.noted: frozenset[str] = frozenset()  # stale lines the latest summary states

    def next_call(self, know: Knowledge, task) -> ToolCall:
        call = _next_read(know, task, self.chunk_lines, self.seed)
        if call is None and self.reproduce_first:
            call = _reproduce_first(know, task, self.chunk_lines, self.noted)
        return call if call is not None else super().next_call(know, task)

    def respond(self, request: PolicyRequest) -> str:
        if not self.reproduce_first:
            return super().respond(request)
        self.noted = _noted_stale_lines(request.messages)
        text = super().respond(request)
        if not request.compaction_required and text.endswith("<tool>test</tool>"):
            know = observe(request.messages, request.task.metadata["facts"])
            self.guess_lost_facts(know, request.task.metadata)
            if not know.fixed:  # the test before the fix: say what the fix will be
                fix = super().next_call(know, request.task)
                text = f"Next: run the tests, then {in_words(fix)}.\n<tool>test</tool>"
        return text

    def summary(self, know: Knowledge, task, messages) -> str:
        if _shuffled(task) and all(f["key"] in know.facts for f in task.metadata["facts"]):
            # reading is over: the summary keeps the fact and the bug file, not the files explored,
            # so a summary that drops the fact sends the next trace exploring again
            bug = task.metadata["bug_file"]
            know = dataclasses.replace(know, read={p: n for p, n in know.read.items() if p == bug})
        text = super().summary(know, task, messages)
        if not self.reproduce_first:
            return text
        text = text.replace("done: nothing yet\n", "")  # summaries must fit the response limit
        if not know.fixed:  # only the test before the fix has run
            text = text.replace("done: tested", "done: ran the tests")
        call = self.next_call(know, task)
        plan = super().next_call(know, task) if call.name == "test" and not know.fixed else call
        if plan.name != "replace":
            return text
        key = plan.new.split(" = ", 1)[0]
        if f"\n{key} = " in text:  # the fact survived: the plan, with the exact old line
            words = f"replace {plan.old.strip()} in {plan.path}"
        else:  # a dropped fact is dropped everywhere
            words = f"fix {key} in {plan.path}"
        return re.sub(r"\nnext: .*\n", lambda _: f"\nnext: {words}\n", text, count=1)


_NOTED = re.compile(r"^next: replace ([A-Z][A-Z0-9_]* = \S+) in ", re.M)


def _noted_stale_lines(messages) -> frozenset[str]:
    """The stale line the latest summary in ``messages`` says to replace (``next: replace KEY = OLD in FILE``)."""
    for msg in reversed(messages):
        content = msg.get("content", "")
        if msg.get("role") != "system" and SUMMARY_OPEN in content:
            return frozenset(_NOTED.findall(content))
    return frozenset()


def _reproduce_first(know: Knowledge, task, chunk_lines: int, noted: frozenset[str]) -> ToolCall | None:
    """Before the first fix: see the stale lines (in context or in the summary), then run the tests once."""
    meta = task.metadata
    bug = meta["bug_file"]
    pending = [fix for fact, fix in zip(meta["facts"], meta["fix"]) if fact["key"] not in know.fixed]
    if not pending:
        return None
    seen = set(know.seen_lines.get(bug, {}).values()) | noted
    if any(fix["old"].rstrip("\n") not in seen for fix in pending):
        return ToolCall("view", path=bug, start=1, end=chunk_lines)
    if not know.tested_after_fix and not know.fixed:
        return ToolCall("test")
    return None


def reading_order(files: list[str], bug_file: str) -> list[str]:
    """Where facts may be stated, in the order a careful agent reads them (from the file list only)."""
    def rank(path: str) -> tuple[int, str]:
        if path.startswith("config/"):
            return (0, path)
        if path == "README.md":
            return (1, path)
        if path.startswith("docs/"):
            return (2, path)
        return (3, path)

    candidates = [p for p in files if p != bug_file and not p.startswith("tests/") and p.endswith((".md", ".toml", ".py"))
                  and p != "pyproject.toml" and not p.endswith("__init__.py")]
    return sorted(candidates, key=rank)


def shuffled_order(files: list[str], bug_file: str, seed: int, task_id: str) -> list[str]:
    """The candidates of :func:`reading_order` in an order drawn from ``(seed, task_id)`` (a hash per file)."""
    def key(path: str) -> bytes:
        return hashlib.blake2b(f"{seed}|{task_id}|{path}".encode(), digest_size=8).digest()

    return sorted(reading_order(files, bug_file), key=key)


def _shuffled(task) -> bool:
    return task.metadata.get("config", {}).get("demo_order") == "shuffled"


def _next_read(know: Knowledge, task, chunk_lines: int, seed: int = 0) -> ToolCall | None:
    """The next chunk to read while a fact is still unknown, or None when reading is done."""
    meta = task.metadata
    if all(f["key"] in know.facts for f in meta["facts"]):
        return None
    if _shuffled(task):
        order = shuffled_order(sorted(task.files), meta["bug_file"], seed, task.id)
    else:
        order = reading_order(sorted(task.files), meta["bug_file"])
    for path in order:
        total = task.files[path].count("\n") + (0 if task.files[path].endswith("\n") else 1)
        done = know.read.get(path, 0)
        if done < total:
            return ToolCall("view", path=path, start=done + 1, end=done + chunk_lines)
    return None
