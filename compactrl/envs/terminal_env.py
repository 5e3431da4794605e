"""``TerminalEnv``: shell work on a file tree (``CompactTerminal-v0`` before context budgeting).

The agent mostly uses ``<tool>shell COMMAND</tool>``; the file tools (view, search, replace,
create) stay available, and ``submit`` grades the final state. There is no ``test`` tool: as in
Terminal-Bench, the checker runs only once, after the agent finishes. On the sim backend the shell
is :mod:`compactrl.shell_sim` (a documented bash subset, never executing anything) and the
verdict is the generated task's checker run in-process; on ``local`` and ``docker`` it is real
bash and the hidden check script.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compactrl.envs.code_env import TaskSampler, ToolEnv
from compactrl.task import Task
from compactrl.tools import describe_tools

TERMINAL_TOOLS: tuple[str, ...] = ("shell", "view", "search", "replace", "create", "submit")


class TerminalEnv(ToolEnv):
    """Shell tasks over a file tree (see the module docstring).

    ``task_source=None`` draws generated tasks of ``difficulty`` (``easy``, ``default``, ``hard`` or a
    :class:`~compactrl.tasksets.generators.terminal.TerminalTaskConfig`) from ``split`` (``train``, ``val``,
    ``test``; disjoint). Any list of terminal tasks works too (e.g. from the Terminal-Bench loader) on
    the ``local`` and ``docker`` backends. Other keyword arguments: see
    :class:`~compactrl.envs.code_env.ToolEnv`.
    """

    def __init__(
        self,
        task_source: TaskSampler | Task | Sequence[Task] | None = None,
        *,
        difficulty: Any = "default",
        split: str = "train",
        backend: str = "sim",
        tools: Sequence[str] = TERMINAL_TOOLS,
        sandbox_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        from compactrl.tasksets.generators.terminal import (
            GeneratedTerminalTasks,
            TerminalTaskGenerator,
            judge_terminal_task,
        )

        if task_source is None:
            task_source = GeneratedTerminalTasks(TerminalTaskGenerator(difficulty), split)
        sandbox_kwargs = dict(sandbox_kwargs or {})
        if backend == "sim":
            sandbox_kwargs.setdefault("judge", judge_terminal_task)
        self.difficulty, self.split = difficulty, split
        super().__init__(task_source, tools=tools, backend=backend, sandbox_kwargs=sandbox_kwargs, **kwargs)

    @property
    def system_prompt(self) -> str:
        return ("Do the task in the terminal's work dir, then submit; the final files are graded.\n"
                + describe_tools(self.tools))

    def task_message(self, task: Task) -> str:
        files = self._sandbox.list_files() if self._sandbox else sorted(task.files)
        top = sorted({p.split("/", 1)[0] + ("/" if "/" in p else "") for p in files})
        return f"{task.instruction}\n\nThe work dir holds {len(files)} files; at its top: {' '.join(top)}"
