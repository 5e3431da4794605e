"""The task file of a Terminal-Bench folder (1.x ``task.yaml``, 2.x ``task.toml``) read and checked.

Every problem is a :class:`TerminalBenchError` of one line, ``file: field: problem``: syntax
errors (with the line), wrong types, missing pieces, and in a 1.x ``task.yaml`` a misspelled key (an
unknown key close to a known one). Other unknown keys (published folders carry extras such as
``author``) are ignored, as the harness ignores them, and listed in ``TaskSpec.ignored_keys``. A 2.x
``task.toml`` is read as Harbor's ``TaskConfig`` reads it: its pydantic models keep the default
``extra="ignore"``, so every unknown key or table (``[[sources]]`` provenance, a newer
``schema_version``'s fields, a misspelling) is ignored, never refused; a misspelling is listed with the
key it is close to (``verifier.timout_sec (did you mean verifier.timeout_sec?)``) and logged.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

import yaml

DEFAULT_AGENT_TIMEOUT_S = 360.0
DEFAULT_TEST_TIMEOUT_S = 60.0
HARBOR_VERIFIER_TIMEOUT_S = 600.0  # Harbor's VerifierConfig.timeout_sec default
# task.yaml keys of Terminal-Bench 1.x (the harness's TaskConfig, and the older ``descriptions``).
YAML_KEYS = {"instruction", "descriptions", "author_name", "author_email", "difficulty", "category", "tags",
             "parser_name", "max_agent_timeout_sec", "max_test_timeout_sec", "run_tests_in_same_shell",
             "disable_asciinema", "estimated_duration_sec", "expert_time_estimate_min",
             "junior_time_estimate_min", "test_scripts"}
# task.toml tables of Terminal-Bench 2.x and their keys (None: free-form): the fields of Harbor 0.26's
# TaskConfig and its tables (plus the older ``memory``/``storage`` spellings compactrl reads too).
TOML_KEYS: dict[str, set[str] | None] = {
    "version": set(), "schema_version": set(), "source": set(), "task": None, "metadata": None,
    "steps": None, "multi_step_reward_strategy": set(), "artifacts": set(),
    "agent": {"timeout_sec", "user", "network_mode", "allowed_hosts"},
    "verifier": {"timeout_sec", "env", "user", "environment_mode", "environment", "collect", "network_mode",
                 "allowed_hosts"},
    "solution": {"env"},
    "environment": {"build_timeout_sec", "docker_image", "os", "cpus", "memory", "memory_mb", "storage", "storage_mb",
                    "gpus", "gpu_types", "tpu", "allow_internet", "workdir", "mcp_servers", "env", "skills_dir",
                    "healthcheck", "network_mode", "allowed_hosts"},
}
log = logging.getLogger(__name__)
PARSERS = ("pytest",)  # terminal-bench's parsers that compactrl reads as the harness does
INFO_KEYS = ("difficulty", "category", "tags", "author_name", "run_tests_in_same_shell", "parser_name")


class TerminalBenchError(ValueError):
    """A folder that is not a readable Terminal-Bench task (the message is one line)."""


@dataclass
class TaskSpec:
    """What a task folder says, in one shape for both versions."""

    folder: str
    version: int
    instruction: str
    agent_timeout_s: float
    test_timeout_s: float
    info: dict[str, Any] = field(default_factory=dict)
    test_files: list[str] = field(default_factory=list)
    run_tests: str | None = None
    test_sh: str | None = None
    solution: str | None = None
    dockerfile: str | None = None
    context: str = ""
    workdir: str | None = None
    docker_image: str | None = None
    services: list[str] = field(default_factory=list)
    ignored_keys: list[str] = field(default_factory=list)
    """Unknown keys that are no misspelling of a known one (ignored, as the harness ignores them)."""
    parser: str = "pytest"
    """1.x ``parser_name`` (the harness's parser of the test output)."""
    verifier_env: dict[str, str] = field(default_factory=dict)
    """2.x ``[verifier] env``: the environment the verifier script runs with."""
    memory_mb: int | None = None
    """2.x ``[environment] memory_mb`` (or ``memory``): the task's memory."""
    storage_mb: int | None = None
    """2.x ``[environment] storage_mb`` (or ``storage``)."""
    steps: list[TaskSpec] = field(default_factory=list)
    """A multi-step 2.x task's steps, in order (empty for one step): each a spec of its own whose
    ``folder`` is ``steps/<name>`` (its ``instruction.md``, ``tests/``, ``solution/``), sharing the
    task's environment (``dockerfile``, ``context``, ``workdir``)."""
    step_name: str | None = None
    """This step's name (``[[steps]] name``), for a step of a multi-step task."""
    min_reward: float | None = None
    """``[[steps]] min_reward``: the remaining steps are skipped when this step's reward is below it."""
    reward_strategy: str = "mean"
    """``multi_step_reward_strategy``: the task's reward from its steps' (``mean``, Harbor's default, or ``final``)."""


def _walk(root: str) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        out += [os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/") for n in sorted(filenames)]
    return out


def _text(path: str) -> str | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        return fh.read()


def _seconds(where: str, key: str, value: Any, default: float) -> float:
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TerminalBenchError(f"{where}: {key}: must be a number, got {value!r}") from None
    if number <= 0:
        raise TerminalBenchError(f"{where}: {key}: must be > 0, got {number}")
    return number


def _env_table(where: str, key: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TerminalBenchError(f"{where}: {key}: expected a table of NAME = value, got {value!r}")
    return {k: str(v) for k, v in value.items()}


_SIZE = {"": 1 / (1 << 20), "b": 1 / (1 << 20), "k": 1 / 1024, "kb": 1 / 1024, "m": 1, "mb": 1, "g": 1024, "gb": 1024,
         "t": 1 << 20, "tb": 1 << 20}


def _size_mb(where: str, table: str, env: dict, name: str) -> int | None:
    """``<name>_mb`` (an int) or the older ``<name>`` ("2G", "512M") of ``[environment]``, in MiB."""
    value = env.get(f"{name}_mb")
    if value is None and env.get(name) is not None:
        m = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", str(env[name]))
        if not m or m.group(2).lower() not in _SIZE:
            raise TerminalBenchError(f"{where}: {table}.{name}: expected a size such as '2G' or '512M', got {env[name]!r}")
        return max(1, int(float(m.group(1)) * _SIZE[m.group(2).lower()]))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise TerminalBenchError(f"{where}: {table}.{name}_mb: expected a positive number of MiB, got {value!r}")
    return int(value)


def _tests(spec: TaskSpec) -> None:
    """``tests/``'s files. A 1.x task may have none: the harness copies ``tests/`` only where it exists, and
    ``run-tests.sh`` may hold the tests itself (the SWE-bench-style tasks write their test patch from it)."""
    tests = os.path.join(spec.folder, "tests")
    spec.test_files = _walk(tests) if os.path.isdir(tests) else []
    if not spec.test_files and not (spec.version == 1 and spec.run_tests):
        raise TerminalBenchError(f"{tests}: tests: no tests/ folder with the task's tests"
                                 + (" and no run-tests.sh" if spec.version == 1 else ""))


def read_spec(folder: str) -> TaskSpec:
    """The folder's task file read and checked (raises TerminalBenchError, one line)."""
    if os.path.isfile(os.path.join(folder, "task.toml")):
        return _read_toml(folder)
    if os.path.isfile(os.path.join(folder, "task.yaml")):
        return _read_yaml(folder)
    raise TerminalBenchError(f"{folder}: task file: no task.yaml (1.x) or task.toml (2.x) in this folder")


def _load_yaml(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            spec = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "syntax"
        raise TerminalBenchError(f"{path}: {where}: YAML syntax error: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(spec, dict):
        raise TerminalBenchError(f"{path}: (top level): expected a mapping, got {type(spec).__name__}")
    return spec


def _yaml_instruction(path: str, spec: dict) -> str:
    text = spec.get("instruction")
    if text is None and isinstance(spec.get("descriptions"), list):  # the older layout: key "base"
        text = next((d.get("description") for d in spec["descriptions"]
                     if isinstance(d, dict) and d.get("key") == "base"), None)
    if not isinstance(text, str) or not text.strip():
        raise TerminalBenchError(f"{path}: instruction: needs a non-empty string 'instruction'")
    return text.strip()


def _read_yaml(folder: str) -> TaskSpec:
    path = os.path.join(folder, "task.yaml")
    spec = _load_yaml(path)
    ignored = _unknown(path, spec, YAML_KEYS)
    if spec.get("parser_name", "pytest") not in PARSERS:
        raise TerminalBenchError(f"{path}: parser_name: {spec['parser_name']!r} is not supported (one of {PARSERS})")
    out = TaskSpec(folder=folder, version=1, instruction=_yaml_instruction(path, spec),
                   agent_timeout_s=_seconds(path, "max_agent_timeout_sec", spec.get("max_agent_timeout_sec"),
                                            DEFAULT_AGENT_TIMEOUT_S),
                   test_timeout_s=_seconds(path, "max_test_timeout_sec", spec.get("max_test_timeout_sec"),
                                           DEFAULT_TEST_TIMEOUT_S),
                   info={k: spec[k] for k in INFO_KEYS if k in spec},
                   run_tests=_text(os.path.join(folder, "run-tests.sh")), solution=_yaml_solution(folder))
    out.ignored_keys = ignored
    out.parser = spec.get("parser_name", "pytest")
    _tests(out)
    _compose(out)
    return out


def _compose(spec: TaskSpec) -> None:
    """The client service's Dockerfile and context from ``docker-compose.yaml``; other services noted."""
    folder, dockerfile, context = spec.folder, "Dockerfile", "."
    path = next((os.path.join(folder, n) for n in ("docker-compose.yaml", "docker-compose.yml")
                 if os.path.isfile(os.path.join(folder, n))), None)
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                services = (yaml.safe_load(fh) or {}).get("services") or {}
        except (yaml.YAMLError, AttributeError) as exc:
            raise TerminalBenchError(f"{path}: services: not a readable compose file ({type(exc).__name__})") from None
        build = (services.get("client") or {}).get("build") if isinstance(services, dict) else None
        if isinstance(build, dict):
            dockerfile, context = build.get("dockerfile", dockerfile), build.get("context", context)
        spec.services = sorted(n for n in services if n != "client") if isinstance(services, dict) else []
    if os.path.isfile(os.path.join(folder, context, dockerfile)):
        spec.context = os.path.normpath(os.path.join(folder, context))
        spec.dockerfile = os.path.join(spec.context, dockerfile)


def _yaml_solution(folder: str) -> str | None:
    text = _text(os.path.join(folder, "solution.sh"))
    if text is not None:
        return text
    path = os.path.join(folder, "solution.yaml")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            steps = yaml.safe_load(fh) or []
    except yaml.YAMLError as exc:
        raise TerminalBenchError(f"{path}: syntax: YAML syntax error: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(steps, list):
        raise TerminalBenchError(f"{path}: (top level): expected a list of steps with 'command'")
    commands = [s.get("command") if isinstance(s, dict) else s for s in steps]
    return "\n".join(str(c) for c in commands if c) + "\n"


def _load_toml(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            spec = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise TerminalBenchError(f"{path}: syntax: TOML syntax error: {exc}") from None
    for key, value in spec.items():
        known = TOML_KEYS.get(key)
        if known and not isinstance(value, dict):
            raise TerminalBenchError(f"{path}: {key}: expected a table, got {value!r}")
    return spec


def _unknown(path: str, keys: dict, known, prefix: str = "", strict: bool = True) -> list[str]:
    """Unknown keys of ``keys``. One close to a known key is a misspelling: a TerminalBenchError when
    ``strict`` (1.x), else ignored as Harbor ignores it, listed with the key it is close to and logged."""
    ignored = []
    for key in sorted(set(keys) - set(known)):
        close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.8)
        value = keys[key]
        if not strict and (isinstance(value, dict) or (isinstance(value, list) and value
                                                       and all(isinstance(v, dict) for v in value))):
            close = []  # a table of its own (``[[sources]]`` beside ``source = "..."``), not a misspelling
        if close and strict:
            raise TerminalBenchError(f"{path}: {prefix}{key}: unknown key (did you mean {prefix}{close[0]}?)")
        if close:
            log.warning("%s: %s%s: unknown key, ignored as Harbor ignores it (did you mean %s%s?)",
                        path, prefix, key, prefix, close[0])
        ignored.append(prefix + key + (f" (did you mean {prefix}{close[0]}?)" if close else ""))
    return ignored


def _toml_unknown(path: str, spec: dict) -> list[str]:
    """Harbor's reader ignores unknown keys at every level (pydantic's default ``extra="ignore"``)."""
    ignored = _unknown(path, spec, TOML_KEYS, strict=False)
    for table, known in TOML_KEYS.items():
        if known and isinstance(spec.get(table), dict):
            ignored += _unknown(path, spec[table], known, f"{table}.", strict=False)
    return ignored


def _read_toml(folder: str) -> TaskSpec:
    path = os.path.join(folder, "task.toml")
    spec = _load_toml(path)
    ignored = _toml_unknown(path, spec)
    if spec.get("steps") is not None:  # Harbor's multi-step tasks: steps/<name>/{instruction.md,tests/,solution/}
        return _read_steps(folder, path, spec, ignored)
    instruction = _text(os.path.join(folder, "instruction.md"))
    if not instruction or not instruction.strip():
        raise TerminalBenchError(f"{os.path.join(folder, 'instruction.md')}: instruction: missing or empty")
    env, meta = spec.get("environment", {}), spec.get("metadata", {})
    out = TaskSpec(folder=folder, version=2, instruction=instruction.strip(),
                   agent_timeout_s=_seconds(path, "agent.timeout_sec", spec.get("agent", {}).get("timeout_sec"),
                                            DEFAULT_AGENT_TIMEOUT_S),
                   test_timeout_s=_seconds(path, "verifier.timeout_sec",
                                           spec.get("verifier", {}).get("timeout_sec"), HARBOR_VERIFIER_TIMEOUT_S),
                   info={k: meta[k] for k in INFO_KEYS if k in meta} | {"allow_internet": env.get("allow_internet")},
                   solution=_text(os.path.join(folder, "solution", "solve.sh")),
                   workdir=env.get("workdir"), docker_image=env.get("docker_image"))
    out.ignored_keys = ignored
    out.verifier_env = _env_table(path, "verifier.env", spec.get("verifier", {}).get("env"))
    out.memory_mb = _size_mb(path, "environment", env, "memory")
    out.storage_mb = _size_mb(path, "environment", env, "storage")
    _tests(out)
    out.test_sh = _text(os.path.join(folder, "tests", "test.sh"))
    if out.test_sh is None:
        raise TerminalBenchError(f"{folder}/tests/test.sh: tests: missing (2.x grades with tests/test.sh)")
    dockerfile = os.path.join(folder, "environment", "Dockerfile")
    if os.path.isfile(dockerfile):
        out.dockerfile, out.context = dockerfile, os.path.dirname(dockerfile)
    return out


_STEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
STEP_KEYS = {"name", "agent", "verifier", "min_reward", "healthcheck", "artifacts", "inherit_prior_session",
             "dependencies"}


def _read_steps(folder: str, path: str, spec: dict, ignored: list[str]) -> TaskSpec:
    """A multi-step task (Harbor's ``[[steps]]``): the task's spec, its environment read as a one-step
    task's, with one spec per step (``steps/<name>/instruction.md``, ``tests/test.sh``, ``solution/``;
    agent and verifier timeouts of the step, else of the task). The agent keeps one session across the
    steps (as Harbor runs them); a step whose reward is below its ``min_reward`` ends the task."""
    raw = spec["steps"]
    if not isinstance(raw, list) or not raw or not all(isinstance(s, dict) for s in raw):
        raise TerminalBenchError(f"{path}: steps: expected one or more [[steps]] tables, got {raw!r}")
    strategy = spec.get("multi_step_reward_strategy") or "mean"
    if strategy not in ("mean", "final"):
        raise TerminalBenchError(f"{path}: multi_step_reward_strategy: expected 'mean' or 'final', got {strategy!r}")
    env, meta = spec.get("environment", {}), spec.get("metadata", {})
    agent_s = _seconds(path, "agent.timeout_sec", spec.get("agent", {}).get("timeout_sec"), DEFAULT_AGENT_TIMEOUT_S)
    verifier_s = _seconds(path, "verifier.timeout_sec", spec.get("verifier", {}).get("timeout_sec"),
                          HARBOR_VERIFIER_TIMEOUT_S)
    verifier_env = _env_table(path, "verifier.env", spec.get("verifier", {}).get("env"))
    dockerfile = os.path.join(folder, "environment", "Dockerfile")
    shared = dict(version=2, workdir=env.get("workdir"), docker_image=env.get("docker_image"),
                  info={k: meta[k] for k in INFO_KEYS if k in meta} | {"allow_internet": env.get("allow_internet")},
                  memory_mb=_size_mb(path, "environment", env, "memory"),
                  storage_mb=_size_mb(path, "environment", env, "storage"),
                  **({"dockerfile": dockerfile, "context": os.path.dirname(dockerfile)} if os.path.isfile(dockerfile)
                     else {}))
    steps, seen = [], set()
    for i, step in enumerate(raw):
        name = step.get("name")
        where = f"steps[{i}]"
        if not isinstance(name, str) or not _STEP_NAME.fullmatch(name) or ".." in name:
            raise TerminalBenchError(f"{path}: {where}.name: expected a folder name under steps/, got {name!r}")
        if name.casefold() in seen:
            raise TerminalBenchError(f"{path}: {where}.name: {name!r} is used by another step")
        seen.add(name.casefold())
        ignored += _unknown(path, step, STEP_KEYS, f"{where}.", strict=False)
        sub = os.path.join(folder, "steps", name)
        instruction = _text(os.path.join(sub, "instruction.md"))
        if not instruction or not instruction.strip():
            raise TerminalBenchError(f"{sub}/instruction.md: instruction: missing or empty")
        gate = step.get("min_reward")
        if isinstance(gate, dict):  # per reward key: rewards are read as one verdict here, so the largest
            gate = max((v for v in gate.values() if isinstance(v, (int, float))), default=None)
        if gate is not None and (isinstance(gate, bool) or not isinstance(gate, (int, float))):
            raise TerminalBenchError(f"{path}: {where}.min_reward: expected a number, got {gate!r}")
        one = TaskSpec(folder=sub, instruction=instruction.strip(),
                       agent_timeout_s=_seconds(path, f"{where}.agent.timeout_sec",
                                                (step.get("agent") or {}).get("timeout_sec"), agent_s),
                       test_timeout_s=_seconds(path, f"{where}.verifier.timeout_sec",
                                               (step.get("verifier") or {}).get("timeout_sec"), verifier_s),
                       solution=_text(os.path.join(sub, "solution", "solve.sh")), step_name=name,
                       min_reward=None if gate is None else float(gate), **shared)
        one.verifier_env = verifier_env
        _tests(one)
        one.test_sh = _text(os.path.join(sub, "tests", "test.sh"))
        if one.test_sh is None:
            raise TerminalBenchError(f"{sub}/tests/test.sh: tests: missing (each step grades with its tests/test.sh)")
        steps.append(one)
    first = steps[0]
    out = TaskSpec(folder=folder, instruction=first.instruction, agent_timeout_s=sum(s.agent_timeout_s for s in steps),
                   test_timeout_s=first.test_timeout_s, solution=first.solution, test_files=first.test_files,
                   test_sh=first.test_sh, steps=steps, reward_strategy=strategy, **shared)
    out.ignored_keys = ignored
    out.verifier_env = verifier_env
    return out

