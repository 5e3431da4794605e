"""Terminal-Bench task folders -> :class:`~compactrl.envs.task.Task`.

A folder holds ``task.yaml`` (``instruction``, ``max_agent_timeout_sec``, ``max_test_timeout_sec``,
``difficulty``, ``category``, ``tags``, ``parser_name``, ``run_tests_in_same_shell`` ...), ``tests/``
(``test_outputs.py`` and what it needs), ``solution.sh`` or ``solution.yaml``, optionally
``run-tests.sh``, and the environment (``Dockerfile`` / ``docker-compose.yaml``) with any files it
copies. Mapping:

* ``instruction`` -> ``Task.instruction``; ``max_agent_timeout_sec`` -> ``time_limit_s``;
  ``max_test_timeout_sec`` -> ``Check.timeout_s``.
* The folder's other files (not ``task.yaml``, the solution, ``run-tests.sh``, ``tests/``, the
  Docker files) -> ``Task.files``, at the same relative paths: the common "COPY the task's files
  into the work dir" layout. The Dockerfile's last ``WORKDIR`` becomes ``metadata["workdir"]``.
* ``tests/`` (and ``run-tests.sh``) -> hidden files under ``.tbench_tests/``, written only after
  the agent finishes (as the harness copies tests into the container after the agent run), with
  ``TEST_DIR`` pointing there. Grading runs ``pytest -rA`` on them in the sandbox, without network;
  success: pytest exits 0 with at least one passed test. ``use_run_tests=True`` runs the folder's
  ``run-tests.sh`` instead (most install pytest with ``uv`` from the network, which the sandboxes
  do not allow).
* ``solution.sh`` (or ``solution.yaml``'s commands) -> ``metadata["solution_sh"]``: the ``gold``
  policy runs it.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from compactrl.envs.task import Check, Task

log = logging.getLogger(__name__)

TESTS_DIR = ".tbench_tests"
RESERVED = {"task.yaml", "solution.sh", "solution.yaml", "run-tests.sh", "Dockerfile", "docker-compose.yaml",
            "docker-compose.yml", ".dockerignore"}
DEFAULT_AGENT_TIMEOUT_S = 360.0
DEFAULT_TEST_TIMEOUT_S = 60.0


class TerminalBenchError(ValueError):
    """A folder that is not a readable Terminal-Bench task."""


@dataclass(frozen=True)
class TerminalBenchConfig:
    """How task folders become tasks (validated on construction)."""

    python: str = "python3"
    """Interpreter that runs pytest in the sandbox."""
    use_run_tests: bool = False
    """Grade with the folder's ``run-tests.sh`` (needs what it installs) instead of pytest directly."""
    image: str | None = None
    """Docker image for every task (Terminal-Bench images are built from each task's Dockerfile)."""
    use_dockerfile_workdir: bool = True
    """Use the Dockerfile's ``WORKDIR`` (e.g. ``/app``) as the work dir's path in the sandbox."""
    max_turns: int = 50
    """Turn limit of each task."""
    max_file_bytes: int = 2_000_000
    """Task files larger than this (or binary) are left out (listed in ``metadata``)."""

    def __post_init__(self) -> None:
        if not self.python.strip():
            raise ValueError("TerminalBenchConfig.python: expected an interpreter name or path, got ''")
        for name in ("max_turns", "max_file_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"TerminalBenchConfig.{name}: expected >= 1, got {getattr(self, name)!r}")


def is_task_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "task.yaml"))


def _read_text(path: str, limit: int) -> str | None:
    if os.path.getsize(path) > limit:
        return None
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\0" in text else text


def _walk(root: str, sub: str = "") -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, sub)):
        dirnames.sort()
        for name in sorted(filenames):
            out.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return out


def _solution(folder: str) -> str | None:
    sh = os.path.join(folder, "solution.sh")
    if os.path.isfile(sh):
        with open(sh, encoding="utf-8") as fh:
            return fh.read()
    yml = os.path.join(folder, "solution.yaml")
    if os.path.isfile(yml):
        with open(yml, encoding="utf-8") as fh:
            steps = yaml.safe_load(fh) or []
        commands = [s.get("command") if isinstance(s, dict) else s for s in steps]
        return "\n".join(str(c) for c in commands if c) + "\n"
    return None


def _workdir(folder: str) -> str | None:
    path = os.path.join(folder, "Dockerfile")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as fh:
        found = re.findall(r"^\s*WORKDIR\s+(\S+)", fh.read(), flags=re.MULTILINE | re.IGNORECASE)
    return found[-1] if found and found[-1].startswith("/") else None


def _float(spec: dict, key: str, default: float, folder: str) -> float:
    value = spec.get(key, default)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TerminalBenchError(f"{folder}: task.yaml {key} must be a number, got {value!r}") from None
    if value <= 0:
        raise TerminalBenchError(f"{folder}: task.yaml {key} must be > 0, got {value}")
    return value


def load_task_dir(folder: str, config: TerminalBenchConfig | None = None) -> Task:
    """One Terminal-Bench task folder as a Task (see the module docstring)."""
    config = config or TerminalBenchConfig()
    if not is_task_dir(folder):
        raise TerminalBenchError(f"{folder}: no task.yaml (not a Terminal-Bench task folder)")
    with open(os.path.join(folder, "task.yaml"), encoding="utf-8") as fh:
        spec = yaml.safe_load(fh)
    if not isinstance(spec, dict) or not isinstance(spec.get("instruction"), str) or not spec["instruction"].strip():
        raise TerminalBenchError(f"{folder}: task.yaml needs a non-empty string 'instruction'")
    if spec.get("parser_name", "pytest") != "pytest":
        raise TerminalBenchError(f"{folder}: parser_name {spec['parser_name']!r} is not supported (only pytest)")
    test_files = [p for p in _walk(folder, "tests")] if os.path.isdir(os.path.join(folder, "tests")) else []
    if not test_files:
        raise TerminalBenchError(f"{folder}: no tests/ folder with the task's tests")
    files, hidden, skipped = {}, {}, []
    for rel in _walk(folder):
        text = _read_text(os.path.join(folder, rel), config.max_file_bytes)
        top = rel.split("/", 1)[0]
        if rel in RESERVED and rel != "run-tests.sh":
            continue
        if text is None:
            skipped.append(rel)
        elif rel.startswith("tests/"):
            hidden[f"{TESTS_DIR}/{rel[len('tests/'):]}"] = text
        elif rel == "run-tests.sh":
            hidden[f"{TESTS_DIR}/run-tests.sh"] = text
        elif top not in RESERVED:
            files[rel] = text
    name = os.path.basename(os.path.abspath(folder))
    workdir = _workdir(folder) if config.use_dockerfile_workdir else None
    check = Check(kind="pytest", command=_test_command(config, hidden), must_pass=(), hidden_files=hidden,
                  timeout_s=_float(spec, "max_test_timeout_sec", DEFAULT_TEST_TIMEOUT_S, folder))
    meta: dict[str, Any] = {
        "terminal_bench": {k: spec.get(k) for k in ("difficulty", "category", "tags", "author_name",
                                                    "run_tests_in_same_shell", "parser_name") if k in spec},
        "solution_sh": _solution(folder),
        "task_dir": os.path.abspath(folder),
        "skipped_files": skipped,
    }
    if workdir:
        meta["workdir"] = workdir
    return Task(id=name, kind="terminal", instruction=spec["instruction"].strip(), files=files, check=check,
                max_turns=config.max_turns,
                time_limit_s=_float(spec, "max_agent_timeout_sec", DEFAULT_AGENT_TIMEOUT_S, folder),
                docker_image=config.image, source="terminal-bench", metadata=meta)


def _test_command(config: TerminalBenchConfig, hidden: dict[str, str]) -> str:
    env = f'TEST_DIR="$PWD/{TESTS_DIR}"'
    if config.use_run_tests and f"{TESTS_DIR}/run-tests.sh" in hidden:
        return f"{env} bash {TESTS_DIR}/run-tests.sh"
    return f"{env} {shlex.quote(config.python)} -m pytest -rA -p no:cacheprovider {TESTS_DIR}"


def load_terminal_bench(path: str, config: TerminalBenchConfig | None = None) -> list[Task]:
    """A task folder, or a folder of task folders (e.g. Terminal-Bench's ``tasks/``), as Tasks."""
    if is_task_dir(path):
        return [load_task_dir(path, config)]
    if not os.path.isdir(path):
        raise TerminalBenchError(f"{path}: not a directory")
    subdirs = sorted(os.path.join(path, d) for d in os.listdir(path) if is_task_dir(os.path.join(path, d)))
    if not subdirs:
        raise TerminalBenchError(f"{path}: no task.yaml in it or in its subfolders")
    return [load_task_dir(d, config) for d in subdirs]
