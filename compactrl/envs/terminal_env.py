"""``TerminalEnv``: shell work on a file tree (``CompactTerminal-v0`` before context budgeting).

The agent mostly uses ``<tool>shell COMMAND</tool>``; the file tools (view, search, replace,
create) stay available, and ``submit`` grades the final state. There is no ``test`` tool: as in
Terminal-Bench, the checker runs only once, after the agent finishes. On the sim backend the shell
is :mod:`compactrl.envs.shell_sim` (a documented bash subset, never executing anything) and the
verdict is the generated task's checker run in-process; on ``local`` and ``docker`` it is real
bash and the hidden check script.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from compactrl.envs.code_env import TaskSampler, ToolEnv
from compactrl.envs.task import Task
from compactrl.envs.tools import describe_tools

TERMINAL_TOOLS: tuple[str, ...] = ("shell", "view", "search", "replace", "create", "submit")


class TerminalEnv(ToolEnv):
    """Shell tasks over a file tree (see the module docstring).

    ``task_source=None`` draws generated tasks of ``difficulty`` (``easy``, ``default``, ``hard`` or a
    :class:`~compactrl.envs.generators.terminal.TerminalTaskConfig`) from ``split`` (``train``, ``val``,
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
        from compactrl.envs.generators.terminal import (
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


def make_terminal_env(*, context_budget: Any = True, tokenizer: Any = None, **kwargs: Any) -> gym.Env:
    """Entry point of ``CompactTerminal-v0``: a :class:`TerminalEnv` inside
    :class:`~compactrl.wrappers.ContextBudget`.

    Fields of :class:`~compactrl.wrappers.ContextBudgetConfig` given as keywords (``budget=4096``,
    ``max_compactions=...``) override the wrapper's defaults; ``context_budget`` may also be a
    ``ContextBudgetConfig``, or ``None``/``False`` for the bare env. ``tokenizer``: the wrapper's
    tokenizer (default: compactrl's). Other keywords go to :class:`TerminalEnv`.
    """
    from compactrl.wrappers import ContextBudget, ContextBudgetConfig  # wrappers sit above envs

    overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in ContextBudgetConfig.__dataclass_fields__}
    env = TerminalEnv(**kwargs)
    if context_budget is None or context_budget is False:
        if overrides:
            raise ValueError(f"context_budget: got None but also wrapper parameters {sorted(overrides)}")
        return env
    config = context_budget if isinstance(context_budget, ContextBudgetConfig) else None
    return ContextBudget(env, config, tokenizer=tokenizer, **overrides)
