"""The task file of a Terminal-Bench folder (1.x ``task.yaml``, 2.x ``task.toml``) read and checked.

Every problem is a :class:`TerminalBenchError` of one line, ``file: field: problem``: syntax
errors (with the line), unknown keys (a misspelling is not silently ignored), wrong types,
missing pieces.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

import yaml

DEFAULT_AGENT_TIMEOUT_S = 360.0
DEFAULT_TEST_TIMEOUT_S = 60.0
# task.yaml keys of Terminal-Bench 1.x (the harness's TaskConfig, and the older ``descriptions``).
YAML_KEYS = {"instruction", "descriptions", "author_name", "author_email", "difficulty", "category", "tags",
             "parser_name", "max_agent_timeout_sec", "max_test_timeout_sec", "run_tests_in_same_shell",
             "disable_asciinema", "estimated_duration_sec", "expert_time_estimate_min",
             "junior_time_estimate_min", "test_scripts"}
# task.toml tables of Terminal-Bench 2.x and their keys (None: free-form).
TOML_KEYS: dict[str, set[str] | None] = {
    "version": set(), "source": set(), "metadata": None, "agent": {"timeout_sec"},
    "verifier": {"timeout_sec", "env"}, "solution": {"env"},
    "environment": {"build_timeout_sec", "docker_image", "cpus", "memory", "memory_mb", "storage", "storage_mb",
                    "gpus", "gpu_types", "allow_internet", "workdir", "mcp_servers", "env"},
}
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


def _tests(spec: TaskSpec) -> None:
    tests = os.path.join(spec.folder, "tests")
    spec.test_files = _walk(tests) if os.path.isdir(tests) else []
    if not spec.test_files:
        raise TerminalBenchError(f"{tests}: tests: no tests/ folder with the task's tests")


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
    unknown = sorted(set(spec) - YAML_KEYS)
    if unknown:
        raise TerminalBenchError(f"{path}: {unknown[0]}: unknown key (known: {', '.join(sorted(YAML_KEYS))})")
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
    if spec.get("parser_name", "pytest") != "pytest":
        raise TerminalBenchError(f"{path}: parser_name: {spec['parser_name']!r} is not supported (only pytest)")
    out = TaskSpec(folder=folder, version=1, instruction=_yaml_instruction(path, spec),
                   agent_timeout_s=_seconds(path, "max_agent_timeout_sec", spec.get("max_agent_timeout_sec"),
                                            DEFAULT_AGENT_TIMEOUT_S),
                   test_timeout_s=_seconds(path, "max_test_timeout_sec", spec.get("max_test_timeout_sec"),
                                           DEFAULT_TEST_TIMEOUT_S),
                   info={k: spec[k] for k in INFO_KEYS if k in spec},
                   run_tests=_text(os.path.join(folder, "run-tests.sh")), solution=_yaml_solution(folder))
    _tests(out)
    if os.path.isfile(os.path.join(folder, "Dockerfile")):
        out.dockerfile, out.context = os.path.join(folder, "Dockerfile"), folder
    return out


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
        if key not in TOML_KEYS:
            raise TerminalBenchError(f"{path}: {key}: unknown key (known: {', '.join(sorted(TOML_KEYS))})")
        known = TOML_KEYS[key]
        if known and isinstance(value, dict):
            extra = sorted(set(value) - known)
            if extra:
                raise TerminalBenchError(f"{path}: {key}.{extra[0]}: unknown key (known: {', '.join(sorted(known))})")
        elif known and not isinstance(value, dict):
            raise TerminalBenchError(f"{path}: {key}: expected a table, got {value!r}")
    return spec


def _read_toml(folder: str) -> TaskSpec:
    path = os.path.join(folder, "task.toml")
    spec = _load_toml(path)
    instruction = _text(os.path.join(folder, "instruction.md"))
    if not instruction or not instruction.strip():
        raise TerminalBenchError(f"{os.path.join(folder, 'instruction.md')}: instruction: missing or empty")
    env, meta = spec.get("environment", {}), spec.get("metadata", {})
    out = TaskSpec(folder=folder, version=2, instruction=instruction.strip(),
                   agent_timeout_s=_seconds(path, "agent.timeout_sec", spec.get("agent", {}).get("timeout_sec"),
                                            DEFAULT_AGENT_TIMEOUT_S),
                   test_timeout_s=_seconds(path, "verifier.timeout_sec",
                                           spec.get("verifier", {}).get("timeout_sec"), DEFAULT_TEST_TIMEOUT_S),
                   info={k: meta[k] for k in INFO_KEYS if k in meta} | {"allow_internet": env.get("allow_internet")},
                   solution=_text(os.path.join(folder, "solution", "solve.sh")),
                   workdir=env.get("workdir"), docker_image=env.get("docker_image"))
    _tests(out)
    out.test_sh = _text(os.path.join(folder, "tests", "test.sh"))
    if out.test_sh is None:
        raise TerminalBenchError(f"{folder}/tests/test.sh: tests: missing (2.x grades with tests/test.sh)")
    dockerfile = os.path.join(folder, "environment", "Dockerfile")
    if os.path.isfile(dockerfile):
        out.dockerfile, out.context = dockerfile, os.path.dirname(dockerfile)
    return out
