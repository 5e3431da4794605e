"""The task record: a frozen, serialisable description of one episode's problem.

A :class:`Task` says what the agent is asked (``instruction``, ``files``), how success is decided
(:class:`Check`), what the sandbox must start (:class:`Runtime`), what decides whether a verdict can be
trusted on this machine (:class:`Grading`), the reference solution (:class:`Reference`, with the
:class:`Step` list of a multi-step task) and what a task set prepares before the episode
(:class:`Build`). Each field says who writes it and who reads it. ``metadata`` keeps the generator's
own facts (scripted policies, the sim's verdict); ``origin`` what a task set recorded about where the
task came from, which no backend, env or grader reads.

Preparing a task's state is one call, :func:`prepared`, made before the episode (by the env at
``reset``, the collectors, eval and validate): the task set named by :attr:`Build.builder` does it.
A task's own image (:attr:`Runtime.image_build`) is built by the same task set when the docker backend
starts, through :func:`built_image`: the build needs the backend's engine and options.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol

TaskKind = Literal["code", "terminal"]
TaskSource = Literal["generated", "swebench", "terminal-bench", "user"]


@dataclass(frozen=True)
class Check:
    """How success is decided.

    ``kind="pytest"``: run ``command`` in the work dir; success iff every test id in ``must_pass``
    passes (read from pytest's ``-rA`` report). ``kind="script"``: run ``command`` (a checker
    script, e.g. ``python3 .check/check.py``); success iff it exits 0. ``kind="tbench"`` /
    ``"harbor"``: Terminal-Bench 1.x / 2.x, the output read as those harnesses read it
    (:mod:`compactrl.sandbox.tb_verdict`).
    ``hidden_files`` are written just before grading and are never visible to the agent
    (SWE-bench test patches, Terminal-Bench tests).
    """

    kind: Literal["pytest", "script", "tbench", "harbor"] = "pytest"
    command: str = "python -m pytest -q -rA -p no:cacheprovider"
    must_pass: tuple[str, ...] = ()
    hidden_files: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 120.0

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Check:
        """A check from its JSON form (``dataclasses.asdict``; ``must_pass`` back to a tuple)."""
        return cls(**{**raw, "must_pass": tuple(raw.get("must_pass", ()))})


# ------------------------------------------------------------------------------------- the runtime
@dataclass(frozen=True)
class Limits:
    """A task's own resource limits; each None leaves the sandbox's configured one.

    Written by the Terminal-Bench loader (:mod:`compactrl.tasksets.terminal_bench.folders`); read by the
    local sandbox (all of them: ``ulimit``, tmpfs sizes) and by both sandboxes' command timeout
    (``timeout_s``: the harness's per-command wait, :func:`compactrl.sandbox._common.command_timeout`).
    """

    timeout_s: float | None = None
    """Default wall-clock limit of one command, in seconds."""
    memory_bytes: int | None = None
    """RLIMIT_AS of every sandboxed process."""
    file_size_bytes: int | None = None
    """RLIMIT_FSIZE: the largest file a process may write."""
    max_processes: int | None = None
    """RLIMIT_NPROC: processes alive at once."""
    cpu_time_s: int | None = None
    """RLIMIT_CPU, in CPU seconds."""
    writable_bytes: int | None = None
    """Size of each private writable folder (:attr:`Runtime.writable_paths`)."""
    tmpfs_bytes: int | None = None
    """Size of the private ``/tmp``."""

    def get(self, name: str) -> int | float | None:
        """The limit called ``name`` (a field of this class), or None when the task sets none."""
        if name not in _LIMIT_NAMES:
            raise ValueError(f"limits: unknown limit {name!r}; expected one of {sorted(_LIMIT_NAMES)}")
        return getattr(self, name)


_LIMIT_NAMES = frozenset(f.name for f in dataclasses.fields(Limits))


@dataclass(frozen=True)
class ImageBuild:
    """A task's own image, built from a Dockerfile: written by the Terminal-Bench loader, read by the task
    set's image builder (:func:`built_image`, which the docker backend calls unless the task names
    ``docker_image``) and by eval's notes."""

    context: str
    """Absolute path of the build context."""
    dockerfile: str
    """Absolute path of the Dockerfile."""


@dataclass(frozen=True)
class Runtime:
    """What the sandbox must start for the task, and nothing it must know about where the task came from.

    Written by the task sets (:mod:`compactrl.tasksets.swebench.rows`,
    :mod:`compactrl.tasksets.terminal_bench.folders`) and by a :class:`Builder` (``state``); read by the
    sandboxes (:mod:`compactrl.sandbox.local`, :mod:`compactrl.sandbox.docker`). The defaults are a
    generated task's: the configured work dir, interpreter and limits, no binds.
    """

    workdir: str | None = None
    """Absolute work dir inside the sandbox (SWE-bench images: ``/testbed``; a Dockerfile's WORKDIR);
    None: the sandbox's configured one."""
    work_tree: str | None = None
    """A host folder copied as the initial work dir before ``files`` (a prepared SWE-bench checkout:
    modes, symlinks, built files)."""
    python: str | None = None
    """The interpreter behind ``python``/``pytest`` in the local sandbox (an absolute path: a prepared
    row's environment, whose prefix is mounted); otherwise the configured one."""
    home: str | None = None
    """The shell's HOME when it lies in a writable folder (a Terminal-Bench image's user's home)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables of the shell (a Dockerfile's ENV); ``__SITE__`` stands for the prepared
    state's ``site`` folder. ``PATH`` goes behind the sandbox's own wrappers."""
    writable_paths: tuple[str, ...] = ()
    """Absolute folders outside the work dir that get a private writable folder each (``/root``, ``/logs``)."""
    ro_binds: tuple[str, ...] = ()
    """Host folders the local sandbox mounts read-only at the same paths (a toolchain fetched at prepare)."""
    ro_mounts: tuple[str, ...] = ()
    """Host folders the docker backend mounts read-only at the same paths (a prepared row's environment)."""
    keep_background: bool = False
    """Keep what a command leaves running in the background (a server the tests talk to)."""
    image_root: bool = False
    """The local shell is root in a user namespace of its own, over the prepared root layer (a reference
    solution that adds users); needs compactrl to run as root."""
    limits: Limits = field(default_factory=Limits)
    """The task's own resource limits."""
    image_build: ImageBuild | None = None
    """The task's own image, for the docker backend (which has it built through :func:`built_image`)."""
    state: str | None = None
    """The prepared state the local sandbox starts from (``work/``, ``layer/``, ``site/``, ``roots.tar``),
    set by :func:`prepared`; None until then, or when there is nothing to prepare."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Runtime:
        """A runtime from its JSON form."""
        raw = dict(raw)
        _known(cls, raw, "runtime")
        for name in ("writable_paths", "ro_binds", "ro_mounts"):
            raw[name] = _strings(raw.get(name), f"runtime.{name}")
        limits = raw.get("limits") or {}
        _known(Limits, limits, "runtime.limits")
        raw["limits"] = Limits(**limits)
        image = raw.get("image_build")
        if image is not None:
            _known(ImageBuild, image, "runtime.image_build")
            raw["image_build"] = ImageBuild(**image)
        return cls(**raw)


# ------------------------------------------------------------------------------------- grading
@dataclass(frozen=True)
class Grading:
    """Whether and how far a verdict on this machine can be trusted.

    Written by the task sets; read by eval (``not_gradable`` tasks are reported, never run; the notes go to
    each record), validate, and the docker backend (``mode="pytest"``: the grader's pytest in the image).
    """

    mode: str | None = None
    """How a Terminal-Bench task is graded: ``"script"`` (its test script) or ``"pytest"`` (pytest on its tests)."""
    note: str | None = None
    """Why a grading fallback was taken (a test script that installs from the network)."""
    not_gradable: str | None = None
    """Why the task cannot be graded faithfully on this machine (an image-only step, network at test time)."""
    image_only: tuple[str, ...] = ()
    """What only the task's image does (the local backend cannot), one reason each."""
    local_notes: tuple[str, ...] = ()
    """How the local backend stands in for what the image does (packages mapped, a toolchain fetched)."""
    prepared: bool = False
    """The task's environment was prepared outside compactrl (a record written by hand): validate counts a
    SWE-bench task prepared when it has a ``work_tree``, an image, or this."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Grading:
        """Grading from its JSON form."""
        raw = dict(raw)
        _known(cls, raw, "grading")
        for name in ("image_only", "local_notes"):
            raw[name] = _strings(raw.get(name), f"grading.{name}")
        return cls(**raw)


# ------------------------------------------------------------------------------------- reference
@dataclass(frozen=True)
class Step:
    """One step of a multi-step task (Harbor): written by the Terminal-Bench loader, read by the env (the
    next instruction and check, ``min_reward``), validate and the gold policy (``solution_sh``)."""

    name: str | None
    instruction: str
    check: Check
    solution_sh: str | None = None
    """The step's reference solution (a bash script)."""
    min_reward: float | None = None
    """The episode ends after this step when its reward is below this."""
    time_limit_s: float | None = None
    grading: str | None = None
    """As :attr:`Grading.mode`, for this step."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Step:
        """A step from its JSON form."""
        raw = dict(raw)
        _known(cls, raw, "steps[]")
        return cls(**{**raw, "check": Check.from_dict(raw["check"])})


@dataclass(frozen=True)
class Reference:
    """The reference solution: written by the task sets, read by the gold policy
    (:mod:`compactrl.policies.scripted.gold`) and validate."""

    gold_patch: str | None = None
    """A SWE-bench row's gold ``patch`` (a unified diff of the repository)."""
    solution_sh: str | None = None
    """A Terminal-Bench task's reference solution (a bash script, its files written first); a multi-step
    task's first step's (each step's is in :attr:`Step.solution_sh`)."""


# ------------------------------------------------------------------------------------- preparation
@dataclass(frozen=True)
class Build:
    """What a task set prepares before the episode (a Dockerfile's steps replayed for the local backend).

    Written by the task set that loaded the task; read by the :class:`Builder` in the module
    ``builder`` names (through :func:`prepared`) and by the local sandbox (``error``: the step it cannot
    run; a plan without :attr:`Runtime.state` was not prepared).
    """

    builder: str
    """The module (dotted name) whose ``BUILDER`` (a :class:`Builder`) prepares this task."""
    plan: dict[str, Any] | None = None
    """The builder's plan, JSON (for Terminal-Bench: :class:`~compactrl.tasksets.terminal_bench.local_build.Plan`)."""
    error: str | None = None
    """Why the plan cannot be carried out on this machine (``"needs its image: <the step>"``)."""
    system_packages: tuple[str, ...] = ()
    """Host packages the plan needs that this machine lacks (``compactrl tasks validate
    --install-system-packages`` installs them)."""
    toolchains: tuple[dict[str, Any], ...] = ()
    """Toolchains fetched for the task (a newer Go from PyPI), one record each."""
    executable_files: tuple[str, ...] = ()
    """Task files the image makes executable."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Build:
        """A build from its JSON form."""
        raw = dict(raw)
        _known(cls, raw, "build")
        if not isinstance(raw.get("builder"), str) or not raw["builder"]:
            raise ValueError(f"build.builder: expected a module name, got {raw.get('builder')!r}")
        for name in ("system_packages", "executable_files"):
            raw[name] = _strings(raw.get(name), f"build.{name}")
        raw["toolchains"] = tuple(raw.get("toolchains") or ())
        return cls(**raw)


class Builder(Protocol):
    """Prepares a task's state for a backend; a task set's module exposes one as ``BUILDER``."""

    def prepare(self, task: Task, backend: str) -> Task:
        """``task`` ready for an episode on ``backend``: with :attr:`Runtime.state` set, or with
        :attr:`Grading.not_gradable` saying why it cannot be; unchanged when ``backend`` needs nothing."""
        ...


def prepared(task: Task, backend: str) -> Task:
    """The one call before an episode: ``task`` with what ``backend`` needs prepared (from the task set's
    cache, or built now without downloads), by the :class:`Builder` of the module :attr:`Build.builder`
    names (imported on first use, so a task read back from JSON prepares as the loaded one did). Tasks
    without a :attr:`Task.build` come back unchanged."""
    if task.build is None:
        return task
    builder = getattr(importlib.import_module(task.build.builder), "BUILDER", None)
    if builder is None:
        raise ValueError(f"task {task.id}: build.builder: {task.build.builder} has no BUILDER")
    return builder.prepare(task, backend)


class ImageBuilder(Protocol):
    """Builds a task's own image (:attr:`Runtime.image_build`) on a container engine; a task set's
    ``BUILDER`` that can is one as well."""

    def image(self, task: Task, engine: Any) -> str:
        """The name of ``task``'s image on ``engine`` (what the backend that asks hands over: for the docker
        backend a :class:`~compactrl.sandbox.docker.DockerEngine`), built now or reused; the backend's own
        error type when it cannot be built."""
        ...


def built_image(task: Task, engine: Any) -> str:
    """The one call a backend makes for a task's own image: its name on ``engine``, from the ``BUILDER`` of
    the module :attr:`Build.builder` names (:data:`OLD_BUILDER` for a task without a :attr:`Task.build`,
    as old records have it). ValueError when the task has no :attr:`Runtime.image_build`, or its builder
    builds no image."""
    if task.runtime.image_build is None:
        raise ValueError(f"task {task.id}: runtime.image_build: the task has no Dockerfile to build")
    module = task.build.builder if task.build is not None else OLD_BUILDER
    builder = getattr(importlib.import_module(module), "BUILDER", None)
    if not callable(getattr(builder, "image", None)):
        raise ValueError(f"task {task.id}: build.builder: {module} builds no image (its BUILDER has no image())")
    return builder.image(task, engine)


# ------------------------------------------------------------------------------------- the task
@dataclass(frozen=True)
class Task:
    """One problem. ``files`` maps relative paths to contents (the initial work dir).

    ``metadata`` holds a generator's JSON-serialisable facts (for generated tasks: the facts the fix
    needs, where they live, the bug, the reference solution) used by the sim backend's verdict and by
    scripted policies; learned policies never see it. ``origin`` holds what a task set recorded about the
    task's source (a SWE-bench row's instance, repository and tests; a Terminal-Bench folder), for reports
    and the task set itself.
    """

    id: str
    kind: TaskKind
    instruction: str
    files: dict[str, str]
    check: Check = field(default_factory=Check)
    setup: tuple[str, ...] = ()
    max_turns: int = 40
    time_limit_s: float = 600.0
    docker_image: str | None = None
    source: TaskSource = "generated"
    metadata: dict[str, Any] = field(default_factory=dict)
    runtime: Runtime = field(default_factory=Runtime)
    grading: Grading = field(default_factory=Grading)
    reference: Reference = field(default_factory=Reference)
    steps: tuple[Step, ...] = ()
    """A multi-step task's steps, the first being the task's own ``instruction`` and ``check``."""
    steps_reward: str | None = None
    """How a multi-step task's reward comes from its steps' (``"mean"``, ``"final"``...; see the env)."""
    build: Build | None = None
    origin: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """The task as one JSON object; the typed fields that hold their defaults are left out (a generated
        task's record is the same as before they existed), :meth:`from_json` puts them back."""
        raw = asdict(self)
        for spec in dataclasses.fields(self):
            if spec.name in _OMITTED_AT_DEFAULT and getattr(self, spec.name) == _default(spec):
                del raw[spec.name]
        return json.dumps(raw, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Task:
        """A task from :meth:`to_json`'s text. A record written before the typed fields existed (its
        ``metadata`` holding ``workdir``, ``limits``, ``not_gradable``...) is read with those keys moved
        into the typed fields (:func:`from_old_metadata`); docs/task_formats.md says which go where."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"task record: expected a JSON object, got {type(raw).__name__}")
        _known(cls, raw, "task")
        raw = {**raw, **from_old_metadata(raw.get("metadata") or {}, raw)}
        raw["check"] = Check.from_dict(raw.pop("check"))
        raw["setup"] = tuple(raw.get("setup", ()))
        raw["runtime"] = Runtime.from_dict(raw.get("runtime") or {})
        raw["grading"] = Grading.from_dict(raw.get("grading") or {})
        reference = raw.get("reference") or {}
        _known(Reference, reference, "reference")
        raw["reference"] = Reference(**reference)
        raw["steps"] = tuple(Step.from_dict(s) for s in raw.get("steps") or ())
        raw["build"] = Build.from_dict(raw["build"]) if raw.get("build") else None
        return cls(**raw)


#: the fields :meth:`Task.to_json` leaves out when they hold their defaults
_OMITTED_AT_DEFAULT = ("runtime", "grading", "reference", "steps", "steps_reward", "build", "origin")


def _default(spec: dataclasses.Field) -> Any:
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default


# ------------------------------------------------------------------------------------- old records
#: metadata keys of records written before the typed fields, by where they go now
OLD_RUNTIME_KEYS = ("workdir", "work_tree", "python", "home", "env", "writable_paths", "ro_binds", "ro_mounts",
                    "keep_background", "image_root", "limits", "image_build")
OLD_GRADING_KEYS = {"grading": "mode", "grading_note": "note", "not_gradable": "not_gradable",
                    "image_only": "image_only", "local_notes": "local_notes", "prepared": "prepared"}
OLD_BUILD_KEYS = ("system_packages", "toolchains", "executable_files")
#: the module that prepared a record's ``local_build`` (the only builder old records knew)
OLD_BUILDER = "compactrl.tasksets.terminal_bench.build"


def from_old_metadata(meta: dict[str, Any], raw: dict[str, Any]) -> dict[str, Any]:
    """The typed fields of an old record (``raw``, its ``metadata`` ``meta``) with the keys they replace
    taken out of ``metadata``; ``{}`` for a record that has none of them. A record that has both a key and
    the typed field it went to is refused (ValueError naming the key)."""
    moved = {"runtime": dict(raw.get("runtime") or {}), "grading": dict(raw.get("grading") or {}),
             "reference": dict(raw.get("reference") or {})}
    rest = dict(meta)
    taken = {k: rest.pop(k) for k in [*OLD_RUNTIME_KEYS, *OLD_GRADING_KEYS, *OLD_BUILD_KEYS, "local_build",
                                      "local_state", "gold_patch", "solution_sh", "steps", "steps_reward"]
             if k in rest}
    if not taken:
        return {}
    for key, value in taken.items():
        where, name = _old_target(key)
        if where in ("steps", "steps_reward", "build"):
            continue
        if name in moved[where]:
            raise ValueError(f"metadata.{key}: the record also has {where}.{name}; keep one")
        moved[where][name] = value
    out: dict[str, Any] = {**moved, "metadata": rest}
    if "steps" in taken:
        out["steps"] = [dict(s) for s in taken["steps"]]
    if "steps_reward" in taken:
        out["steps_reward"] = taken["steps_reward"]
    if "local_build" in taken or any(k in taken for k in OLD_BUILD_KEYS):
        local = taken.get("local_build") or {}
        out["build"] = {"builder": OLD_BUILDER, "plan": local.get("build"), "error": local.get("error"),
                        **{k: taken[k] for k in OLD_BUILD_KEYS if k in taken}}
    return out


def _old_target(key: str) -> tuple[str, str]:
    """``(typed field, its attribute)`` an old metadata key went to."""
    if key in OLD_RUNTIME_KEYS:
        return "runtime", key
    if key == "local_state":
        return "runtime", "state"
    if key in OLD_GRADING_KEYS:
        return "grading", OLD_GRADING_KEYS[key]
    if key in ("gold_patch", "solution_sh"):
        return "reference", key
    if key in OLD_BUILD_KEYS or key == "local_build":
        return "build", key
    return key, key


# ------------------------------------------------------------------------------------- checks
def _known(cls: type, raw: Any, where: str) -> None:
    """ValueError naming ``where`` unless ``raw`` is a dict whose keys are ``cls``'s fields."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object, got {type(raw).__name__}")
    unknown = set(raw) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")


def _strings(value: Any, where: str) -> tuple[str, ...]:
    """``value`` (a list of strings, or None) as a tuple; ValueError naming ``where`` otherwise."""
    if value is None:
        return ()
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(value)

__all__ = ["Build", "Builder", "Check", "Grading", "ImageBuild", "ImageBuilder", "Limits", "Reference", "Runtime", "Step",
           "Task", "TaskKind", "TaskSource", "built_image", "prepared"]
