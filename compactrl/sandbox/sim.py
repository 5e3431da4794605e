"""The simulated backend: an in-memory work dir and a static test verdict.

Nothing the agent writes is ever executed. Files live in a dict; ``run_tests`` asks a judge for
the verdict: by default :func:`~compactrl.sandbox.static_pytest.judge_code_task`, which
decides each test of a generated code task from the files with :mod:`ast` so that it equals what
``python -m pytest`` would report (see :mod:`compactrl.sandbox.static_pytest`). ``exec``
delegates to the sim shell (:mod:`compactrl.shell_sim`) and turns its
:class:`~compactrl.shell_sim.ShellResult` into an :class:`~compactrl.sandbox.base.ExecResult`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from compactrl.sandbox.base import ExecResult, SandboxError, TestReport
from compactrl.sandbox.static_pytest import judge_code_task
from compactrl.task import Check, Task
from compactrl.tools import normalize_path

if TYPE_CHECKING:
    from compactrl.shell_sim import ShellResult

Judge = Callable[[Task, dict[str, str]], TestReport]

SHELL_UNAVAILABLE = (
    "shell is not available on the sim backend: use view, search, replace, create and test "
    "(or a real backend: backend='local' or 'docker')"
)


class SimSandbox:
    """In-memory :class:`~compactrl.sandbox.base.Sandbox`; deterministic, no processes.

    ``judge`` decides test verdicts (default: :func:`judge_code_task`, which needs a generated
    code task). ``exec`` delegates to :mod:`compactrl.shell_sim` when that module provides
    ``execute(files, command, *, timeout_s)`` (see :func:`exec_result` for its result); otherwise it
    answers that the shell is unavailable.
    """

    backend = "sim"

    def __init__(self, *, judge: Judge | None = None) -> None:
        self._judge = judge or judge_code_task
        self._files: dict[str, str] = {}
        self._task: Task | None = None
        self._shell = _load_shell()
        self._paths_version = 0  # bumped whenever the set of paths may have changed
        self._blocked: tuple[int, str | None] = (-1, None)
        self._dir_cache: tuple[int, frozenset[str]] = (-1, frozenset())

    def start(self, task: Task) -> None:
        if self._judge is judge_code_task and "sim" not in task.metadata:
            raise ValueError(
                f"task {task.id!r}: backend='sim' needs task.metadata['sim'] (a generated code task) "
                "or a custom judge; use backend='local' or 'docker' for other tasks"
            )
        self._task = task
        self._files = dict(task.files)
        self._paths_version += 1

    # -- files -------------------------------------------------------------------------------
    def _path(self, path: str) -> str:
        try:
            return normalize_path(path)
        except ValueError as exc:
            raise PermissionError(str(exc)) from None

    def _dirs(self) -> frozenset[str]:
        """Every directory that holds a file ("" is the work dir), cached per set of paths."""
        if self._dir_cache[0] != self._paths_version:
            dirs = {""}
            for p in self._files:
                parts = p.split("/")
                dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
            self._dir_cache = (self._paths_version, frozenset(dirs))
        return self._dir_cache[1]

    def read_file(self, path: str) -> str:
        rel = self._path(path)
        if rel in self._files:
            return self._files[rel]
        if rel in self._dirs():
            raise IsADirectoryError(f"{path} is a directory")
        raise FileNotFoundError(f"no such file: {path}")

    def write_file(self, path: str, content: str) -> None:
        rel = self._path(path)
        if rel in self._dirs():
            raise IsADirectoryError(f"{path} is a directory")
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in self._files:
                raise NotADirectoryError(f"{'/'.join(parts[:i])} is a file, not a directory")
        if rel not in self._files:
            self._paths_version += 1
        self._files[rel] = content

    def list_files(self) -> list[str]:
        return sorted(self._files)

    # -- processes ---------------------------------------------------------------------------
    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        if self._shell is None:
            return ExecResult(output=SHELL_UNAVAILABLE, exit_code=127)
        self._paths_version += 1
        return exec_result(self._shell(self._files, command, timeout_s=timeout_s))

    def run_tests(self, check: Check | None = None) -> TestReport:
        task = self._require_task()
        if check is not None:
            task = dataclasses.replace(task, check=check)
        blocked = self._blocked_hidden_path(task)
        if blocked:  # as the real backends: the test files cannot be installed, nothing runs
            return TestReport((), (), f"could not install the test files: {blocked}; the tests did not run", False)
        # Like the real backends: hidden files are written for the run; those that belong to the
        # visible project (the visible tests) stay restored, the others never become visible.
        for path, content in task.check.hidden_files.items():
            if path in task.files:
                if path not in self._files:
                    self._paths_version += 1
                self._files[path] = content
        return self._judge(task, self._files | task.check.hidden_files)

    def _blocked_hidden_path(self, task: Task) -> str | None:
        """Why the hidden test files cannot be written (cached until the set of paths changes)."""
        if self._blocked[0] != self._paths_version:
            self._blocked = (self._paths_version, self._find_blocked_path(task))
        return self._blocked[1]

    def _find_blocked_path(self, task: Task) -> str | None:
        dirs = self._dirs()
        for path in task.check.hidden_files:
            if path in dirs:
                return f"{path} is a directory"
            parts = path.split("/")
            for i in range(1, len(parts)):
                if "/".join(parts[:i]) in self._files:
                    return f"{'/'.join(parts[:i])} is a file, not a directory"
        return None

    def close(self) -> None:
        self._files = {}
        self._task = None

    def _require_task(self) -> Task:
        if self._task is None:
            raise SandboxError("the sim sandbox was not started (call start(task) first)")
        return self._task


def exec_result(run: ShellResult) -> ExecResult:
    """The sandbox's result for the sim shell's: the same output, exit code, time-out and truncation."""
    return ExecResult(output=run.output, exit_code=run.exit_code, timed_out=run.timed_out, truncated=run.truncated)


def _load_shell():
    try:
        module = importlib.import_module("compactrl.shell_sim")
    except ImportError:
        return None
    return getattr(module, "execute", None)
