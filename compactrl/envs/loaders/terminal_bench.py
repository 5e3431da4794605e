"""Terminal-Bench task folders (1.x and 2.x) -> :class:`~compactrl.envs.task.Task`.

1.x: ``task.yaml``, ``Dockerfile`` (and ``docker-compose.yaml``) with the files it copies,
``tests/``, optionally ``run-tests.sh``, ``solution.sh`` or ``solution.yaml``. 2.x: ``task.toml``,
``instruction.md``, ``environment/`` (``Dockerfile`` and its build context), ``tests/`` (``test.sh``
writes ``/logs/verifier/reward.txt``), ``solution/solve.sh``. docs/task_formats.md lists every field
and what is honoured. In short:

* The work dir is the image's: ``[environment].workdir``, the Dockerfile's ``WORKDIR`` (relative
  ones joined, one inherited from a Terminal-Bench base image), -> ``metadata["workdir"]``.
* ``COPY``/``ADD`` of build-context files into the work dir -> ``Task.files`` at their destinations
  (binary files byte-exact: decoded with ``surrogateescape``, written back the same way); files a
  later ``RUN rm`` removes are left out. What only a built image gives (package installs,
  downloads, services, copies outside the work dir) -> ``metadata["image_only"]``, one reason each.
* ``tests/`` -> hidden files under ``.tbench_tests/`` (``run-tests.sh`` under ``.tbench_run/``, so
  a ``tests/run-tests.sh`` is not overwritten), written only for grading. The absolute ``/tests``
  and ``/logs/verifier`` in the test scripts become ``$TBENCH_ROOT/.tbench_tests`` and
  ``$TBENCH_ROOT/.tbench_logs/verifier`` (``TBENCH_ROOT``: the work dir), so they run where the
  root is read-only.
* Grading as the harness grades: 1.x runs ``run-tests.sh`` (or, without one, pytest on the tests,
  the harness's default) and reads pytest's ``-rA`` report; 2.x runs ``tests/test.sh`` and
  succeeds iff the reward it writes is >= 1. ``grading="auto"`` falls back to pytest on the tests
  when the script installs packages from the network (the sandboxes have none), saying so in
  ``metadata["grading_note"]``; ``"script"`` and ``"pytest"`` force one.
* ``solution.sh`` / ``solution.yaml``'s commands / ``solution/solve.sh`` -> ``metadata["solution_sh"]``.
* The Dockerfile and its build context -> ``metadata["image_build"]``: the docker backend builds the
  task's own image from them (cached by content digest) and runs the task in it; the local backend
  mounts private writable folders at ``metadata["writable_paths"]`` (``/root``, ``/logs``, ...).
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shlex
import textwrap
from dataclasses import dataclass
from typing import Any

from compactrl.envs.loaders.tb_files import read_limited, task_files
from compactrl.envs.loaders.tb_spec import TaskSpec, TerminalBenchError, read_spec
from compactrl.envs.task import Check, Task

log = logging.getLogger(__name__)

TESTS_DIR = ".tbench_tests"
RUN_DIR = ".tbench_run"
LOGS_DIR = ".tbench_logs"
GRADINGS = ("auto", "script", "pytest")
# Writable places outside the work dir that task images give (a solution writing /root/x or
# /logs/y): the local backend mounts a private tmpfs at each; a task image has them anyway.
WRITABLE_PATHS = ("/root", "/home", "/opt", "/srv", "/mnt", "/var/tmp", "/var/log", "/logs", "/output", "/data",
                  "/tests", "/solution")
# A test script that fetches packages cannot run offline (the harness's images have the network).
_NEEDS_NETWORK = re.compile(r"\b(curl|wget|apt-get|apk add|pip3? install|uv (add|pip|sync|init|venv|tool)|uvx)\b")
_ABS_TESTS = re.compile(r"(?<![\w./])/tests(?=/|\b)")
_ABS_LOGS = re.compile(r"(?<![\w./])/logs/verifier(?=/|\b)")

__all__ = ["GRADINGS", "TESTS_DIR", "TerminalBenchConfig", "TerminalBenchError", "is_task_dir", "load_task_dir",
           "load_terminal_bench"]


@dataclass(frozen=True)
class TerminalBenchConfig:
    """How task folders become tasks (validated on construction)."""

    python: str = "python3"
    """Interpreter that runs pytest (and reads a 2.x ``reward.json``) in the sandbox."""
    grading: str = "auto"
    """``auto``: the task's script (``run-tests.sh`` / ``test.sh``) unless it installs from the network,
    then pytest on its tests; ``script``: always the script; ``pytest``: always pytest on ``tests/``."""
    image: str | None = None
    """Docker image for every task (Terminal-Bench images are built from each task's Dockerfile)."""
    use_dockerfile_workdir: bool = True
    """Use the image's work dir (e.g. ``/app``) as the work dir's path in the sandbox."""
    max_turns: int = 50
    """Turn limit of each task."""
    max_file_bytes: int = 2_000_000
    """Task files larger than this are left out (listed in ``metadata["skipped_files"]``)."""

    def __post_init__(self) -> None:
        if not self.python.strip():
            raise ValueError("TerminalBenchConfig.python: expected an interpreter name or path, got ''")
        if self.grading not in GRADINGS:
            raise ValueError(f"TerminalBenchConfig.grading: expected one of {GRADINGS}, got {self.grading!r}")
        for name in ("max_turns", "max_file_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"TerminalBenchConfig.{name}: expected >= 1, got {getattr(self, name)!r}")


def is_task_dir(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, n)) for n in ("task.yaml", "task.toml"))


def _rewrite_paths(text: str) -> str:
    text = _ABS_LOGS.sub("${TBENCH_ROOT}/" + LOGS_DIR + "/verifier", text)
    return _ABS_TESTS.sub("${TBENCH_ROOT}/" + TESTS_DIR, text)


def _hidden(spec: TaskSpec, limit: int) -> dict[str, str]:
    hidden = {}
    for rel in spec.test_files:
        text = read_limited(os.path.join(spec.folder, "tests", rel), limit)
        if text is None:
            raise TerminalBenchError(f"{spec.folder}/tests/{rel}: tests: larger than max_file_bytes")
        hidden[f"{TESTS_DIR}/{rel}"] = _rewrite_paths(text) if rel.endswith(".sh") else text
    if spec.run_tests:
        hidden[f"{RUN_DIR}/run-tests.sh"] = _rewrite_paths(spec.run_tests)
    return hidden


def _grading(spec: TaskSpec, config: TerminalBenchConfig) -> tuple[str, str | None]:
    """``("script" | "pytest", note)``: how this task is graded and, for a fallback, why."""
    script = spec.run_tests if spec.version == 1 else spec.test_sh
    if config.grading == "pytest" or script is None:
        return "pytest", None if script is None else "pytest forced by grading='pytest'"
    if config.grading == "auto":
        needs = _NEEDS_NETWORK.search(script)
        if needs:
            name = "run-tests.sh" if spec.version == 1 else "tests/test.sh"
            return "pytest", f"{name} installs from the network ({needs.group(0)}): pytest run on tests/ instead"
    return "script", None


# Test files that name /tests in code (``open("/tests/data/x")``) are not rewritten: where /tests can
# be made (a task image's writable root, the local backend's writable /tests) the tests are copied
# there for the run and removed after it, as the harness puts them there.
_TESTS_IN = ('__tbt=0; if { mkdir /tests || { [ -w /tests ] && [ -z "$(ls -A /tests)" ]; }; } 2>/dev/null;'
             ' then cp -rT "$TEST_DIR" /tests 2>/dev/null && __tbt=1; fi;')
_TESTS_OUT = '__tbrc=$?; [ $__tbt = 1 ] && rm -rf /tests/* /tests/.[!.]* 2>/dev/null; exit $__tbrc'


def _check(spec: TaskSpec, config: TerminalBenchConfig, hidden: dict[str, str], mode: str) -> Check:
    env = f'export TBENCH_ROOT="$PWD" TEST_DIR="$PWD/{TESTS_DIR}";'
    if mode == "pytest":
        command = f"{env} {_TESTS_IN} {shlex.quote(config.python)} -m pytest -rA -p no:cacheprovider {TESTS_DIR}"
        return Check(kind="pytest", command=f"{command}; {_TESTS_OUT}", hidden_files=hidden,
                     timeout_s=spec.test_timeout_s)
    if spec.version == 1:
        return Check(kind="pytest", command=f"{env} {_TESTS_IN} bash {RUN_DIR}/run-tests.sh; {_TESTS_OUT}",
                     hidden_files=hidden, timeout_s=spec.test_timeout_s)
    return Check(kind="script", command=f"{_reward_command(env + ' ' + _TESTS_IN, config.python)}; {_TESTS_OUT}",
                 hidden_files=hidden, timeout_s=spec.test_timeout_s)


def _reward_command(env: str, python: str) -> str:
    """2.x: run ``test.sh``, then succeed iff ``reward.txt`` (else ``reward.json``'s ``reward``) >= 1."""
    logs = f"{LOGS_DIR}/verifier"
    read_json = (f"{shlex.quote(python)} -c 'import json,sys; d=json.load(open(sys.argv[1]));"
                 " print(d.get(\"reward\", min(d.values())) if isinstance(d, dict) else d)'")
    return (f'{env} mkdir -p {logs} && rm -f {logs}/reward.txt {logs}/reward.json;'
            f" bash {TESTS_DIR}/test.sh; cd \"$TBENCH_ROOT\";"
            f" R=$(cat {logs}/reward.txt 2>/dev/null);"
            f' [ -n "$R" ] || R=$({read_json} {logs}/reward.json 2>/dev/null); echo "reward: ${{R:-none}}";'
            " awk -v r=\"$R\" 'BEGIN { exit !(r != \"\" && r + 0 >= 1) }'")


def _solution_with_files(spec: TaskSpec, limit: int) -> str | None:
    """2.x ``solve.sh`` with the other ``solution/`` files first written to ``/solution``, where the
    harness puts the folder (``cp /solution/solve.py /app``): as base64 here-documents, binary-safe."""
    folder = os.path.join(spec.folder, "solution")
    if spec.version != 2 or spec.solution is None or not os.path.isdir(folder):
        return spec.solution
    if sorted(os.listdir(folder)) == ["solve.sh"]:
        return spec.solution
    # where /solution cannot be made (a read-only root) the script runs without it
    lines = ["if mkdir -p /solution 2>/dev/null; then"]
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            if os.path.getsize(path) > limit:
                raise TerminalBenchError(f"{path}: solution: larger than max_file_bytes")
            with open(path, "rb") as fh:
                data = base64.b64encode(fh.read()).decode()
            dest = shlex.quote(f"/solution/{rel}")
            mode = "0755" if os.access(path, os.X_OK) or rel.endswith(".sh") else "0644"
            lines += [f"mkdir -p \"$(dirname {dest})\" && base64 -d > {dest} <<'__TB_SOLUTION_FILE__'",
                      *textwrap.wrap(data, 76), "__TB_SOLUTION_FILE__", f"chmod {mode} {dest}"]
    return "\n".join([*lines, "fi"]) + "\n" + spec.solution


def load_task_dir(folder: str, config: TerminalBenchConfig | None = None) -> Task:
    """One Terminal-Bench task folder (1.x or 2.x) as a Task (see the module docstring)."""
    config = config or TerminalBenchConfig()
    spec = read_spec(folder)
    files, skipped, facts = task_files(spec, config.max_file_bytes)
    hidden = _hidden(spec, config.max_file_bytes)
    mode, note = _grading(spec, config)
    meta: dict[str, Any] = {
        "terminal_bench": {**spec.info, "version": spec.version},
        "solution_sh": _solution_with_files(spec, config.max_file_bytes),
        "task_dir": os.path.abspath(folder),
        "skipped_files": skipped,
        "image_only": facts.image_only,
        "grading": mode,
        "ignored_keys": spec.ignored_keys,
    }
    if note:
        meta["grading_note"] = note
    if config.use_dockerfile_workdir and facts.workdir:
        meta["workdir"] = facts.workdir
    if spec.dockerfile:  # the docker backend builds the task's own image from it (unless given one)
        meta["image_build"] = {"context": os.path.abspath(spec.context), "dockerfile": os.path.abspath(spec.dockerfile)}
    meta["writable_paths"] = list(WRITABLE_PATHS)
    return Task(id=os.path.basename(os.path.abspath(folder)), kind="terminal", instruction=spec.instruction,
                files=files, check=_check(spec, config, hidden, mode), max_turns=config.max_turns,
                time_limit_s=spec.agent_timeout_s, docker_image=config.image or spec.docker_image,
                source="terminal-bench", metadata=meta)


def load_terminal_bench(path: str, config: TerminalBenchConfig | None = None,
                        problems: list[str] | None = None) -> list[Task]:
    """A task folder, or a folder of task folders (e.g. Terminal-Bench's ``tasks/``), as Tasks.

    In a folder of folders every good task loads; each bad one (and each subfolder without a task
    file) is one line ``file: field: problem`` logged as a warning and appended to ``problems``.
    A single task folder that is bad, or a folder with no good task, raises TerminalBenchError.
    """
    if is_task_dir(path):
        return [load_task_dir(path, config)]
    if not os.path.isdir(path):
        raise TerminalBenchError(f"{path}: not a directory")
    tasks, found = [], []
    for name in sorted(os.listdir(path)):
        sub = os.path.join(path, name)
        if name.startswith(".") or not os.path.isdir(sub):
            continue
        try:
            tasks.append(load_task_dir(sub, config))
        except TerminalBenchError as exc:
            found.append(str(exc))
            log.warning("skipped task: %s", exc)
        except (OSError, ValueError) as exc:  # an unreadable file: this task is bad, not the set
            found.append(f"{sub}: (files): {type(exc).__name__}: {exc}".replace("\n", " "))
            log.warning("skipped task: %s", found[-1])
    if problems is not None:
        problems.extend(found)
    if not tasks:
        more = f"; and {len(found) - 3} more" if len(found) > 3 else ""
        detail = "; ".join(found[:3]) + more if found else "no subfolders"
        raise TerminalBenchError(f"{path}: no loadable task.yaml/task.toml task in it or its subfolders ({detail})")
    return tasks
