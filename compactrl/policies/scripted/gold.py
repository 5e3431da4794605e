"""Reference-solution policies for validating a task set: ``gold`` applies the known solution,
``noop`` submits at once. ``gold`` should succeed and ``noop`` fail on every well-formed task.

:class:`GoldPolicy` knows, from ``request.task``:

* SWE-bench tasks: the gold ``patch`` (``Task.reference.gold_patch``): with the repository's files in
  the task, the patched files are written with ``create``; with the repository inside an image,
  the patch is written to a file and applied there with ``git apply`` (or ``patch -p1``);
* Terminal-Bench tasks: ``solution.sh`` (``Task.reference.solution_sh``, each of ``Task.steps``), written and run with bash;
* generated terminal tasks: the solution commands with the true fact values;
* generated code tasks: each stale constant replaced by its right value.

It is a pure function of the task and of how many steps it has already taken in this trace (it
counts its own tool calls in ``request.messages``), so it needs the bare env (no compaction).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from compactrl.tools import ToolCall, format_call
from compactrl.types import PolicyRequest

PATCH_FILE = ".compactrl_gold.patch"
SOLUTION_FILE = ".compactrl_solution.sh"


def gold_calls(task) -> list[ToolCall]:
    """The tool calls that apply ``task``'s reference solution (the last ``submit`` not included; a
    multi-step task's steps are separated by the ``submit`` that moves the episode to the next one)."""
    meta = task.metadata
    if task.source == "swebench":
        if task.files:  # the repository's files are known: write the patched files (no git needed inside)
            from compactrl.tasksets.swebench.rows import apply_patch

            patched = apply_patch(task.files, task.reference.gold_patch)
            return [ToolCall("create", path=p, content=c) if c is not None else ToolCall("shell", command=f"rm -f {p}")
                    for p, c in patched.items()]
        apply = (f"(git apply --whitespace=nowarn {PATCH_FILE} || patch -p1 --forward < {PATCH_FILE}) "
                 f"&& rm -f {PATCH_FILE}")
        return [ToolCall("create", path=PATCH_FILE, content=task.reference.gold_patch), ToolCall("shell", command=apply)]
    if task.source == "terminal-bench":
        steps = [(s.name, s.solution_sh) for s in task.steps] or [(None, task.reference.solution_sh)]
        calls: list[ToolCall] = []
        for i, (name, script) in enumerate(steps):
            if not script:
                where = f" step {name!r}" if name else ""
                raise ValueError(f"task {task.id!r}{where}: no solution.sh, solution.yaml or solution/solve.sh to run")
            run = f"bash {SOLUTION_FILE}; __rc=$?; rm -f {SOLUTION_FILE}; exit $__rc"
            calls += [*([ToolCall("submit")] if i else []), ToolCall("create", path=SOLUTION_FILE, content=script),
                      ToolCall("shell", command=run)]
        return calls
    if "terminal" in meta:
        from compactrl.tasksets.generators.terminal import render_solution

        values = {f["key"]: f["value"] for f in meta["terminal"]["facts"]}
        return [ToolCall("shell", command=cmd) for cmd in render_solution(task, values)]
    if "facts" in meta and "fix" in meta:
        return [ToolCall("replace", path=meta["bug_file"], old=fix["old"], new=f"{fact['key']} = {fact['value']!r}\n")
                for fact, fix in zip(meta["facts"], meta["fix"])]
    raise ValueError(f"task {task.id!r} ({task.source}): no reference solution known for it")


def _own_calls(messages: Sequence[dict]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant" and re.search(r"<tool>", m.get("content", "")))


class GoldPolicy:
    """Applies each task's reference solution, then submits (see the module docstring)."""

    def act(self, requests: Sequence[PolicyRequest]) -> list[str]:
        return [self.respond(r) for r in requests]

    def respond(self, request: PolicyRequest) -> str:
        if request.task is None:
            raise ValueError("GoldPolicy needs request.task")
        if request.compaction_required:
            return "<summary>applying the reference solution</summary>"
        calls = gold_calls(request.task)
        done = _own_calls(request.messages)
        return format_call(calls[done] if done < len(calls) else ToolCall("submit"))


class NoopPolicy:
    """Submits at once: the baseline a task set's checks must reject."""

    def act(self, requests: Sequence[PolicyRequest]) -> list[str]:
        return ["<summary>nothing done</summary>" if r.compaction_required else "<tool>submit</tool>" for r in requests]
