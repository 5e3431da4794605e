"""The typed fields of :class:`compactrl.task.Task`: serialised with the task, records written with the old
``metadata`` keys read into them, bad input named by field, and :func:`compactrl.task.prepared`."""

from __future__ import annotations

import json
import os

import pytest
from loader_helpers import FIXTURES

from compactrl.task import (
    Build,
    Check,
    Grading,
    ImageBuild,
    Limits,
    Reference,
    Runtime,
    Step,
    Task,
    built_image,
    prepared,
)
from compactrl.tasksets.generators import CodeTaskGenerator
from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig, load_task_dir


def _full() -> Task:
    step = Step(name="1_make", instruction="make", check=Check(kind="harbor", command="bash t.sh"), solution_sh="echo",
                min_reward=1.0, time_limit_s=60.0, grading="script")
    return Task(id="t", kind="terminal", instruction="x", files={"a": "b"}, source="terminal-bench",
                runtime=Runtime(workdir="/app", work_tree="/tree", python="/env/bin/python", home="/root",
                                env={"A": "1"}, writable_paths=("/root", "/logs"), ro_binds=("/opt/go",),
                                ro_mounts=("/envs/a",), keep_background=True, image_root=True,
                                limits=Limits(timeout_s=180, memory_bytes=1 << 30, tmpfs_bytes=5),
                                image_build=ImageBuild(context="/c", dockerfile="/c/Dockerfile"), state="/state"),
                grading=Grading(mode="pytest", note="n", not_gradable="why", image_only=("i",), local_notes=("l",),
                                prepared=True),
                reference=Reference(gold_patch="diff", solution_sh="echo"), steps=(step,), steps_reward="final",
                build=Build(builder="compactrl.tasksets.terminal_bench.build", plan={"key": "k", "steps": []},
                            system_packages=("gfortran",), toolchains=({"tool": "go"},), executable_files=("x.sh",)),
                origin={"task_dir": "/tasks/t"})


def test_every_typed_field_round_trips() -> None:
    task = _full()
    assert Task.from_json(task.to_json()) == task


@pytest.mark.parametrize("name", ["count-errors", "sum-numbers", "decode-payload"])
def test_loaded_terminal_bench_tasks_round_trip(name: str) -> None:
    task = load_task_dir(os.path.join(FIXTURES, "terminal_bench", name), TerminalBenchConfig(backend="local"))
    assert Task.from_json(task.to_json()) == task


def test_a_generated_task_keeps_its_record_and_its_metadata() -> None:
    task = CodeTaskGenerator("tiny").generate(3)
    raw = json.loads(task.to_json())
    assert not {"runtime", "grading", "reference", "steps", "build", "origin"} & set(raw)  # defaults left out
    assert Task.from_json(task.to_json()) == task and "facts" in task.metadata


def test_an_old_record_is_read_into_the_typed_fields() -> None:
    step = {"name": "s", "instruction": "i", "check": {"kind": "script", "command": "true"}, "solution_sh": "echo",
            "min_reward": None, "time_limit_s": None, "grading": "script"}
    old = {"id": "o", "kind": "terminal", "instruction": "x", "files": {}, "check": {"kind": "script", "command": "true"},
           "metadata": {"workdir": "/app", "limits": {"timeout_s": 200}, "writable_paths": ["/root"],
                        "keep_background": True, "not_gradable": "no", "grading": "script", "grading_note": "g",
                        "solution_sh": "echo", "steps": [step], "steps_reward": "mean",
                        "local_build": {"build": {"key": "k"}}, "local_state": "/s", "system_packages": ["p"],
                        "facts": [1]}}
    task = Task.from_json(json.dumps(old))
    assert task.metadata == {"facts": [1]}
    assert task.runtime == Runtime(workdir="/app", limits=Limits(timeout_s=200), writable_paths=("/root",),
                                   keep_background=True, state="/s")
    assert task.grading == Grading(mode="script", note="g", not_gradable="no")
    assert task.reference.solution_sh == "echo" and task.steps[0].check.kind == "script"
    assert task.build == Build(builder="compactrl.tasksets.terminal_bench.build", plan={"key": "k"},
                               system_packages=("p",))
    assert Task.from_json(task.to_json()) == task


@pytest.mark.parametrize("change, field", [
    ({"runtime": {"workdir": "/a", "bogus": 1}}, "runtime: unknown field"),
    ({"runtime": {"writable_paths": "/root"}}, "runtime.writable_paths"),
    ({"runtime": {"limits": {"memory": 1}}}, "runtime.limits"),
    ({"grading": {"image_only": [1]}}, "grading.image_only"),
    ({"build": {"plan": {}}}, "build.builder"),
    ({"runtime": {"workdir": "/a"}, "metadata": {"workdir": "/b"}}, "metadata.workdir"),
    ({"surprise": 1}, "task: unknown field"),
])
def test_bad_records_name_the_field(change: dict, field: str) -> None:
    raw = {**json.loads(_full().to_json()), **change}
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        Task.from_json(json.dumps(raw))


def test_limits_are_read_by_name() -> None:
    assert Limits(cpu_time_s=3).get("cpu_time_s") == 3 and Limits().get("memory_bytes") is None
    with pytest.raises(ValueError, match="limits"):
        Limits().get("nope")


def test_prepared_leaves_tasks_without_a_build_alone_and_asks_the_builder_otherwise() -> None:
    plain = Task(id="p", kind="code", instruction="", files={})
    assert prepared(plain, "local") is plain
    task = load_task_dir(os.path.join(FIXTURES, "terminal_bench_local", "generated-input"),
                         TerminalBenchConfig(backend="local"))
    assert task.build is not None and task.build.plan is not None and task.runtime.state is None
    assert prepared(task, "docker") is task  # the docker backend has its image built when it starts
    bad = Task(id="b", kind="code", instruction="", files={}, build=Build(builder="compactrl.task"))
    with pytest.raises(ValueError, match="build.builder"):
        prepared(bad, "local")


def test_built_image_asks_the_builder_the_task_names(monkeypatch) -> None:
    import compactrl.tasksets.terminal_bench.build as tb_build

    plain = Task(id="p", kind="code", instruction="", files={})
    with pytest.raises(ValueError, match="runtime.image_build"):
        built_image(plain, object())
    image = Runtime(image_build=ImageBuild(context="/ctx", dockerfile="/ctx/Dockerfile"))
    asked = []
    monkeypatch.setattr(tb_build, "engine_image", lambda task, engine: asked.append((task.id, engine)) or "tag")
    engine = object()
    for build in (Build(builder=tb_build.MODULE), None):  # an old record without a build: Terminal-Bench's
        task = Task(id="t", kind="terminal", instruction="", files={}, runtime=image, build=build)
        assert built_image(task, engine) == "tag"
    assert asked == [("t", engine), ("t", engine)]
    other = Task(id="o", kind="terminal", instruction="", files={}, runtime=image, build=Build(builder="compactrl.task"))
    with pytest.raises(ValueError, match="build.builder"):
        built_image(other, engine)
