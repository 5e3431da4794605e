"""An in-process bash emulator over an in-memory file system (the sim backend's ``shell`` tool).

Nothing is ever executed: commands are Python re-implementations of a documented subset of bash
and GNU coreutils/grep/sed/findutils/awk, checked against real bash by property-based tests
(``tests/terminal/test_shell_agreement.py``, ``benchmarks/shell_agreement.py``). The reference is
bash 5.2 with GNU coreutils 9.1, grep 3.8, sed 4.9, findutils 4.9, mawk 1.3.4 under
``LC_ALL=C.UTF-8``; docs/terminal.md lists the subset and every known disagreement class.

>>> files = {"logs/a.log": "ERROR x\\nok\\n", "logs/b.log": "ERROR y\\n"}
>>> sh = ShellEmulator(files)
>>> sh.run("grep -c ERROR logs/*.log | sort").output
'logs/a.log:1\\nlogs/b.log:1\\n'
>>> sh.run("cat logs/*.log | grep ERROR > errors.txt && wc -l < errors.txt").output
'2\\n'
>>> files["errors.txt"]
'ERROR x\\nERROR y\\n'
"""

from __future__ import annotations

import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from compactrl.shell_sim.awk import AWK
from compactrl.shell_sim.builtins import BUILTINS
from compactrl.shell_sim.builtins2 import BUILTINS2
from compactrl.shell_sim.calc import CALC
from compactrl.shell_sim.control import GRAMMAR
from compactrl.shell_sim.coreutils import COREUTILS
from compactrl.shell_sim.fs import VirtualFS
from compactrl.shell_sim.grep import GREP
from compactrl.shell_sim.listing import LISTING
from compactrl.shell_sim.moreutils import MOREUTILS
from compactrl.shell_sim.sed import SED
from compactrl.shell_sim.shell import Limits, Shell
from compactrl.shell_sim.sort import cmd_sort

COMMANDS = {**BUILTINS, **BUILTINS2, **COREUTILS, **LISTING, **GREP, **SED, **AWK, "sort": cmd_sort,
            **MOREUTILS, **CALC}
"""Every command the emulator knows; anything else is ``command not found`` (exit 127)."""

SUPPORTED_COMMANDS = tuple(sorted(COMMANDS))

DEFAULT_ROOT = "/workspace"
"""The work dir's absolute path, as the local and docker sandboxes mount it by default."""


_PYTHON_FRAMES = 4000
"""Python frames the executor may need: about 11 per nested shell function call (20 with a
command substitution), so the default function depth of 100 fits with room to spare."""

if sys.getrecursionlimit() < _PYTHON_FRAMES:  # 3.11+: Python-to-Python calls use no C stack
    sys.setrecursionlimit(_PYTHON_FRAMES)

DEFAULT_TIMEOUT_S = 30.0
"""A command line's time budget when the caller gives none (the local sandbox's default)."""


@dataclass(frozen=True)
class ShellResult:
    """What one command line gave: ``output`` is stdout and stderr interleaved in write order.

    ``exit_code`` is the command line's status as ``bash -c`` would exit with it (124 when a limit
    stopped it); ``timed_out`` says a limit (the time budget, or loop iterations and function calls)
    ended it, with the reason at the end of ``output``; ``truncated`` says ``output`` was cut at ``max_output_chars``.
    The fields and their defaults are those of the sandboxes' result, which the sim sandbox builds
    from this one.
    """

    output: str
    exit_code: int
    timed_out: bool = False
    truncated: bool = False


@dataclass(frozen=True)
class ShellRun:
    """One command line's result with the streams kept apart (:class:`ShellResult` merges them)."""

    stdout: str
    stderr: str
    output: str
    exit_code: int
    truncated: bool
    timed_out: bool = False


class ShellEmulator:
    """A bash session over ``files`` (work-dir-relative path -> text), which it edits in place.

    ``root`` is the work dir's absolute path (what ``pwd`` prints); ``env`` seeds the variables
    (``HOME`` defaults to ``root``); ``line_numbers`` prefixes shell errors with ``line N:`` as
    ``bash -c`` does; ``max_output_chars`` caps what one command line returns. Limits that keep a
    runaway command from hanging the episode: ``max_loop_iterations`` (loop iterations and
    function calls per command line), ``max_function_depth`` and a time budget (``timeout_s`` of
    :meth:`run`, else ``DEFAULT_TIMEOUT_S``); a command line that exceeds one ends as a timed-out
    command does on the real backends (exit 124, ``timed_out``). Like the real sandboxes (each
    command is a fresh ``bash -c`` that inherits the previous one's state), the current
    directory, exported variables and empty directories persist across :meth:`run` calls; plain
    shell variables and functions do not.
    """

    def __init__(self, files: dict[str, str] | None = None, *, root: str = DEFAULT_ROOT,
                 env: dict[str, str] | None = None, line_numbers: bool = True,
                 max_output_chars: int = 1 << 20, max_file_chars: int = 1 << 24,
                 max_loop_iterations: int = 100_000, max_function_depth: int = 100) -> None:
        if not root.startswith("/"):
            raise ValueError(f"root must be an absolute path, got {root!r}")
        for name, value in (("max_loop_iterations", max_loop_iterations), ("max_function_depth", max_function_depth)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.files = files if files is not None else {}
        self.fs = VirtualFS(self.files, root)
        self.max_loop_iterations, self.max_function_depth = max_loop_iterations, max_function_depth
        variables = {"HOME": root, "PWD": root, "LC_ALL": "C.UTF-8"}
        variables.update(env or {})
        self.shell = Shell(self.fs, COMMANDS, variables, GRAMMAR, line_numbers=line_numbers,
                           output_limit=max_output_chars, file_limit=max_file_chars)

    @property
    def cwd(self) -> str:
        """The shell's current directory (absolute)."""
        return self.shell.cwd

    def run_detailed(self, command: str, timeout_s: float | None = None) -> ShellRun:
        """Run one command line as :meth:`run` does, keeping stdout and stderr apart as well."""
        self.fs.invalidate()  # the caller may have edited ``files`` between runs
        budget = timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S
        limits = Limits(deadline=time.monotonic() + budget, max_iterations=self.max_loop_iterations,
                        max_depth=self.max_function_depth)
        code = self.shell.run(command, limits)
        chunks = list(self.shell.term.chunks)
        if self.shell.timed_out:
            chunks.append((2, f"\n[timed out after {budget:g}s: the command and every process it started were "
                              f"killed] (sim-shell: {limits.reason})\n"))
        return ShellRun(
            stdout="".join(t for fd, t in chunks if fd == 1),
            stderr="".join(t for fd, t in chunks if fd == 2),
            output="".join(t for _, t in chunks),
            exit_code=code,
            truncated=self.shell.term.truncated,
            timed_out=self.shell.timed_out,
        )

    def run(self, command: str, timeout_s: float | None = None) -> ShellResult:
        """Run one command line; ``output`` is stdout and stderr interleaved in write order."""
        r = self.run_detailed(command, timeout_s)
        return ShellResult(output=r.output, exit_code=r.exit_code, truncated=r.truncated, timed_out=r.timed_out)


def run_command(files: dict[str, str], command: str, **kwargs) -> ShellResult:
    """One-shot helper: a fresh :class:`ShellEmulator` over ``files`` runs ``command``."""
    return ShellEmulator(files, **kwargs).run(command)


_SESSIONS: OrderedDict[int, ShellEmulator] = OrderedDict()
_SESSIONS_LOCK = threading.Lock()
MAX_SESSIONS = 4096


def execute(files: dict[str, str], command: str, *, timeout_s: float | None = None) -> ShellResult:
    """The sim sandbox's ``exec``: run ``command`` in the session that owns ``files``.

    A session (current directory, exported variables, empty directories) lives as long as the
    sandbox keeps the same ``files`` dict, like the real backends' per-episode shell. Sessions are
    found by the dict's identity and the oldest are dropped beyond :data:`MAX_SESSIONS`.
    """
    key = id(files)
    with _SESSIONS_LOCK:
        sh = _SESSIONS.get(key)
        if sh is None or sh.files is not files:
            sh = ShellEmulator(files)
            _SESSIONS[key] = sh
        _SESSIONS.move_to_end(key)
        while len(_SESSIONS) > MAX_SESSIONS:
            _SESSIONS.popitem(last=False)
    return sh.run(command, timeout_s=timeout_s)


__all__ = ["COMMANDS", "DEFAULT_ROOT", "DEFAULT_TIMEOUT_S", "SUPPORTED_COMMANDS", "ShellEmulator", "ShellResult", "ShellRun",
           "execute", "run_command"]
