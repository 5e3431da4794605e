"""The sandbox protocol: one interface, three backends (``sim``, ``local``, ``docker``).

The environment implements every file tool (view, search, replace, create) on top of
``read_file`` / ``write_file`` / ``list_files``, so those tools behave identically on every
backend; only ``exec`` (shell) and ``run_tests`` touch a real process.

Failures of the agent's commands are observations (an :class:`ExecResult` with a non-zero exit
code, ``timed_out=True``, clipped output). Failures of the infrastructure (the sandbox process died,
the container vanished, the engine is unreachable) raise :class:`SandboxError`; the env turns them
into a truncated episode with ``info["sandbox_error"]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from compactrl.task import Check, Task


class SandboxError(RuntimeError):
    """The sandbox infrastructure failed (not the agent's command)."""


@dataclass(frozen=True)
class ExecResult:
    """Result of one shell command. ``output`` is stdout+stderr decoded with replacement."""

    output: str
    exit_code: int
    timed_out: bool = False
    truncated: bool = False


@dataclass(frozen=True)
class TestReport:
    """Verdict of a test run: per-test outcome plus the (possibly clipped) raw output."""

    passed: tuple[str, ...]
    failed: tuple[str, ...]
    output: str
    success: bool
    exit_code: int | None = None
    """Exit status of the test (or verifier) command; None when it never ran."""
    timed_out: bool = False
    """The command hit its time limit (the task's own test timeout)."""
    limit_hit: str | None = None
    """A sandbox resource limit the run hit, named (e.g. "file size limit 256 MiB (RLIMIT_FSIZE)")."""
    log_tail: str = ""
    """The last lines of the raw test/verifier output (unclipped by the head+tail cap), for reports."""
    log: str | None = None
    """The whole test/verifier output as the run printed it (the log grading read, with the grader's
    lines) when ``output`` is clipped for the agent; None when ``output`` is already whole. Records keep it."""
    log_complete: bool = True
    """False when even the test run's capture limit (``test_output_limit_bytes``) dropped the middle."""


@runtime_checkable
class Sandbox(Protocol):
    backend: str

    def start(self, task: Task) -> None:
        """Prepare a fresh work dir holding ``task.files`` and run ``task.setup``."""

    def read_file(self, path: str) -> str:
        """Contents of a work-dir file. Raises ``FileNotFoundError`` / ``IsADirectoryError``."""

    def write_file(self, path: str, content: str) -> None:
        """Create or overwrite a work-dir file (parents created). ``PermissionError`` outside it."""

    def list_files(self) -> list[str]:
        """Sorted relative paths of every regular file in the work dir."""

    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        """Run a shell command in the work dir (sim: a documented subset)."""

    def run_tests(self, check: Check | None = None) -> TestReport:
        """Run ``check`` (default: the task's; a multi-step task's later steps give theirs), writing its
        hidden files first, and report the verdict."""

    def close(self) -> None:
        """Release everything (processes, containers, temp dirs). Idempotent."""
