"""Pieces the real backends (local, docker) share, so that both follow the sim's rules exactly."""

from __future__ import annotations

import dataclasses

from compactrl.sandbox import _shell
from compactrl.sandbox.base import ExecResult, TestReport
from compactrl.sandbox.pytest_report import check_success, parse_pytest_rA, split_outcomes
from compactrl.sandbox.tb_verdict import harbor_verdict, tbench_verdict
from compactrl.task import Check, Task
from compactrl.tools import normalize_path


def make_config(cls, config, options: dict):
    """``config`` (or ``cls()``) with keyword ``options`` applied; an unknown name is a ValueError."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} option(s) {unknown}; expected some of {sorted(names)}")
    return dataclasses.replace(config or cls(), **options)


def command_timeout(task: Task | None, default: float) -> float:
    """A command's default wall-clock limit: the task's own (``Task.runtime.limits.timeout_s``, e.g. a
    Terminal-Bench task whose solution compiles for minutes: the harness's per-command wait) or ``default``."""
    own = task.runtime.limits.timeout_s if task is not None else None
    return float(own) if isinstance(own, (int, float)) and not isinstance(own, bool) and own > 0 else default


def work_rel(path: str) -> str:
    """Work-dir-relative path as the sim computes it; ``PermissionError`` for one that leaves it."""
    try:
        return normalize_path(path)
    except ValueError as e:
        raise PermissionError(str(e)) from None


def file_bytes(content: str) -> bytes:
    """A task file's bytes: loaders decode binary files with ``surrogateescape``, so encoding with it
    gives them back byte-exact; any other lone surrogate is kept as ``surrogatepass`` writes it."""
    try:
        return content.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        return content.encode("utf-8", errors="surrogatepass")


# The sim's exception messages: the env shows them to the agent, so every backend uses the same.
def not_found(path: str) -> FileNotFoundError:
    return FileNotFoundError(f"no such file: {path}")


def is_a_directory(path: str) -> IsADirectoryError:
    return IsADirectoryError(f"{path} is a directory")


def not_a_directory(prefix: str) -> NotADirectoryError:
    return NotADirectoryError(f"{prefix} is a file, not a directory")


def hidden_restore_plan(task: Task, before: dict[str, bytes | None]) -> dict[str, bytes | None]:
    """What to put back after a test run, as the sim does: hidden copies of files the task ships
    (pristine visible tests) stay in place; other hidden files revert to what was there (None:
    delete), so they never become visible."""
    return {rel: data for rel, data in before.items() if rel not in task.files}


def hidden_files_blocked(error: OSError) -> TestReport:
    """The verdict when the task's hidden test files cannot be written (the agent put a directory or
    a symlink out of the work dir in their way): a failed run, explained."""
    return TestReport(passed=(), failed=(), success=False,
                      output=f"could not install the test files: {error}; the tests did not run")


def report_from_run(check: Check, res: ExecResult, output_limit: int) -> TestReport:
    """The :class:`TestReport` of one run of ``check``: ``output`` clipped to ``output_limit`` after parsing (what
    the agent's ``test`` tool shows), ``log`` the whole output (what records keep)."""
    passed, failed = split_outcomes(parse_pytest_rA(res.output))
    success = check_success(check, res.exit_code, passed, timed_out=res.timed_out)
    output = res.output
    if check.kind in ("tbench", "harbor"):  # Terminal-Bench: the harness's own reading of the run
        decide = tbench_verdict if check.kind == "tbench" else harbor_verdict
        success, why = decide(res.output, res.timed_out)
        output = f"{output.rstrip()}\n[verdict: {'success' if success else 'failure'}: {why}]"
    full = output
    raw = output.encode("utf-8", errors="replace")
    if len(raw) > output_limit:  # the agent's view is clipped; the report keeps the whole log for records
        capped = _shell.CappedOutput(output_limit)
        capped.feed(raw)
        output = capped.text()
    return TestReport(passed=passed, failed=failed, output=output, success=success, exit_code=res.exit_code,
                      timed_out=res.timed_out, log_tail=log_tail(full), log=full if output is not full else None,
                      log_complete=not res.truncated)


def log_tail(output: str, max_lines: int = 40, max_chars: int = 4000) -> str:
    """The last ``max_lines`` lines of ``output`` (at most ``max_chars`` characters): what a report shows
    of a run that went wrong."""
    tail = "\n".join(output.rstrip("\n").splitlines()[-max_lines:])
    return tail[-max_chars:]
