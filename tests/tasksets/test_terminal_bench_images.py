"""Terminal-Bench tasks in their own images (docker backend: built from the task's Dockerfile,
cached by content digest, a missing base image named at once) and the places outside the work dir
that task images give (local backend: private writable folders, ``/tests`` and ``/solution``)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import time

import pytest
from loader_helpers import FIXTURES, TB_TASK, docker_unavailable, local_unavailable

from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.sandbox import make_sandbox
from compactrl.sandbox.base import SandboxError
from compactrl.sandbox.docker import DEFAULT_IMAGE, DockerSandboxConfig
from compactrl.sandbox.local import LocalSandboxConfig
from compactrl.task import ImageBuild, prepared
from compactrl.tasksets.terminal_bench.base_images import dockerfile_bases
from compactrl.tasksets.terminal_bench.folders import WRITABLE_PATHS, load_task_dir
from compactrl.tasksets.terminal_bench.image_build import _context_tar, build_task_image, task_image_tag

pytestmark = pytest.mark.timeout(300)
IMAGE_TASK = os.path.join(FIXTURES, "terminal_bench_images", "solution-files")
# the fixtures' bases, replaced by the default sandbox image (no registry is reachable in CI)
SUBSTITUTES = {"python:3.13-slim": DEFAULT_IMAGE, "ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest": DEFAULT_IMAGE}


# ------------------------------------------------------------------------------ no engine needed
def test_dockerfile_bases_skip_stages_flags_and_scratch() -> None:
    text = ("# FROM commented:out\nFROM --platform=linux/amd64 golang:1.22 AS build\nRUN go build\n"
            "from build AS again\nFROM scratch\nFROM python:3.13-slim\nCOPY --from=build /x /x\n")
    assert dockerfile_bases(text) == [(1, "golang:1.22"), (5, "python:3.13-slim")]


def test_base_images_config_is_normalised_and_checked() -> None:
    cfg = DockerSandboxConfig(base_images={"b:1": "local-b", "a:1": "local-a"})
    assert cfg.base_images == (("a:1", "local-a"), ("b:1", "local-b"))
    assert DockerSandboxConfig(base_images=[["a:1", "x"]]).base_images == (("a:1", "x"),)
    hash(cfg)  # stays a frozen, hashable config
    for bad in ({"a:1": ""}, ["a:1"], 5):
        with pytest.raises(ValueError, match="base_images"):
            DockerSandboxConfig(base_images=bad)
    with pytest.raises(ValueError, match="build_timeout_s"):
        DockerSandboxConfig(build_timeout_s=0)


def test_context_digest_follows_content_and_modes(tmp_path) -> None:
    context = str(tmp_path / "ctx")
    shutil.copytree(os.path.join(IMAGE_TASK, "environment"), context)
    _, first = _context_tar(context, "FROM x\n")
    assert _context_tar(context, "FROM x\n")[1] == first  # deterministic (no mtimes, no owners)
    assert _context_tar(context, "FROM y\n")[1] != first  # the Dockerfile counts
    os.chmod(os.path.join(context, "words.txt"), 0o600)
    second = _context_tar(context, "FROM x\n")[1]
    assert second != first  # a mode is content to COPY
    with open(os.path.join(context, "words.txt"), "a") as fh:
        fh.write("delta\n")
    assert _context_tar(context, "FROM x\n")[1] not in (first, second)
    assert task_image_tag("Evo Eval/4", "ab" * 32) == f"compactrl-task/evo-eval-4:{'ab' * 12}"


def test_loader_names_the_build_and_the_places_outside_the_work_dir() -> None:
    task = load_task_dir(IMAGE_TASK)
    build = task.runtime.image_build
    assert build == ImageBuild(context=os.path.join(IMAGE_TASK, "environment"),
                               dockerfile=os.path.join(IMAGE_TASK, "environment", "Dockerfile"))
    assert task.runtime.writable_paths == tuple(WRITABLE_PATHS) and "/tests" in WRITABLE_PATHS
    # COPY and RUN rm honoured without the image; the copy to /opt is replayed by the local backend
    assert sorted(task.files) == ["bin/shout.sh", "words.txt"]
    steps = task.build.plan["steps"]
    assert {"op": "copy_out", "pairs": [["reference.txt", "/opt/reference/reference.txt"]]} in steps
    assert task.grading.image_only == ()
    # the other solution/ files are written to /solution before solve.sh runs, as the harness puts them
    script = task.reference.solution_sh
    assert script.startswith("if mkdir -p /solution") and "base64 -d > /solution/shout_all.py" in script
    assert script.endswith(open(os.path.join(IMAGE_TASK, "solution", "solve.sh")).read())


def test_writable_paths_are_validated() -> None:
    assert LocalSandboxConfig(writable_paths=("/root", "/opt")).writable_paths == ("/root", "/opt")
    for bad in (("relative",), ("/",), ("/usr/local",), ("/etc",), ("/tmp/x",), ("/proc",), "/root"):
        with pytest.raises(ValueError, match="writable_paths"):
            LocalSandboxConfig(writable_paths=bad)


# ------------------------------------------------------------------------------------ local
def test_local_gives_writable_folders_tests_and_solution() -> None:
    why = local_unavailable()
    if why:
        pytest.skip(why)
    task = load_task_dir(IMAGE_TASK)
    gold = run_task(task, GoldPolicy(), "local")
    assert gold["success"], gold  # /solution, /root and /tests (read from Python) all worked
    assert gold["info"]["test_summary"].startswith("Tests: 2 passed, 0 failed"), gold
    noop = run_task(task, NoopPolicy(), "local")
    assert not noop["success"] and noop["sandbox_error"] is None, noop
    sb = make_sandbox("local", writable_paths=("/data",))
    try:
        sb.start(prepared(task, sb.backend))
        out = sb.exec("touch /data/a /root/b /logs/c && echo ok; touch /usr/x /etc/x 2>&1 | wc -l; ls -A /tests").output
        assert out.split() == ["ok", "2"], out  # the tests were copied for grading only
    finally:
        sb.close()


def test_local_solution_files_arrive_byte_exact(tmp_path) -> None:
    why = local_unavailable()
    if why:
        pytest.skip(why)
    folder = str(tmp_path / "task")
    shutil.copytree(IMAGE_TASK, folder)
    blob = bytes(range(256)) * 3
    with open(os.path.join(folder, "solution", "blob.bin"), "wb") as fh:
        fh.write(blob)
    task = load_task_dir(folder)
    sb = make_sandbox("local")
    try:
        sb.start(prepared(task, sb.backend))
        sb.write_file("solution.sh", task.reference.solution_sh)
        out = sb.exec("bash solution.sh >/dev/null && sha256sum /solution/blob.bin && stat -c %a /solution/solve.sh")
        assert out.output.split() == [hashlib.sha256(blob).hexdigest(), "/solution/blob.bin", "755"], out
    finally:
        sb.close()


# ------------------------------------------------------------------------------------ docker
def _docker_client():
    why = docker_unavailable()
    if why:
        pytest.skip(why)
    import docker

    return docker.from_env(timeout=120)


@pytest.mark.docker
def test_docker_builds_the_task_image_and_grades_in_it() -> None:
    _docker_client()
    task = load_task_dir(IMAGE_TASK)
    kwargs = {"base_images": SUBSTITUTES}
    gold = run_task(task, GoldPolicy(), "docker", sandbox_kwargs=kwargs)
    assert gold["success"] and gold["info"]["test_summary"].startswith("Tests: 2 passed, 0 failed"), gold
    noop = run_task(task, NoopPolicy(), "docker", sandbox_kwargs=kwargs)
    assert not noop["success"] and noop["sandbox_error"] is None, noop
    sb = make_sandbox("docker", **kwargs)
    try:
        sb.start(prepared(task, sb.backend))
        assert sb.image.startswith("compactrl-task/solution-files:")
        # what only the image has: RUN chmod, RUN rm, a COPY outside the work dir
        out = sb.exec("test -x bin/shout.sh && echo exec; ls bin; cat /opt/reference/reference.txt; pwd").output
        assert out.split("\n")[:4] == ["exec", "shout.sh", "only in the image", "/app"], out
    finally:
        sb.close()


@pytest.mark.docker
def test_docker_image_is_cached_by_content(tmp_path) -> None:
    client = _docker_client()
    folder = str(tmp_path / "task")
    shutil.copytree(IMAGE_TASK, folder)
    build = dataclasses.asdict(load_task_dir(folder).runtime.image_build)
    cfg = DockerSandboxConfig(base_images=SUBSTITUTES)
    tag = build_task_image(client, "cached", build, cfg)
    created = client.images.get(tag).id
    started = time.monotonic()
    assert build_task_image(client, "cached", build, cfg) == tag  # same content: reused
    assert client.images.get(tag).id == created and time.monotonic() - started < 30
    with open(os.path.join(folder, "environment", "words.txt"), "a") as fh:
        fh.write("delta\n")
    changed = build_task_image(client, "cached", build, cfg)
    assert changed != tag and changed.startswith("compactrl-task/cached:")
    for name in (tag, changed):
        client.images.remove(name, force=True)


@pytest.mark.docker
def test_docker_missing_base_image_is_named_at_once() -> None:
    _docker_client()
    task = load_task_dir(IMAGE_TASK)
    started = time.monotonic()
    rec = run_task(task, GoldPolicy(), "docker",
                   sandbox_kwargs={"base_images": {"other:1": DEFAULT_IMAGE}, "base_families": False})
    assert time.monotonic() - started < 60
    assert not rec["success"] and "base image 'python:3.13-slim'" in rec["sandbox_error"], rec
    assert "base_images" in rec["sandbox_error"] and "pull" in rec["sandbox_error"]
    sb = make_sandbox("docker", base_images={"python:3.13-slim": "compactrl-no-such-image:0"})
    with pytest.raises(SandboxError, match=r"'compactrl-no-such-image:0' \(substitute for 'python:3.13-slim'\)"):
        sb.start(prepared(task, sb.backend))


@pytest.mark.docker
def test_docker_work_dir_inherited_from_the_base_image(tmp_path) -> None:
    import io

    client = _docker_client()
    base = "compactrl-test/base-with-workdir:1"
    client.images.build(fileobj=io.BytesIO(f"FROM {DEFAULT_IMAGE}\nWORKDIR /srv/app\n".encode()), tag=base, pull=False)
    folder = str(tmp_path / "task")
    shutil.copytree(IMAGE_TASK, folder)
    dockerfile = os.path.join(folder, "environment", "Dockerfile")
    with open(dockerfile) as fh:
        text = fh.read().replace("WORKDIR /app\n", "").replace("/app/bin/", "bin/")
    with open(dockerfile, "w") as fh:
        fh.write(text)
    task = load_task_dir(folder)
    assert not task.runtime.workdir  # the loader cannot know what an unknown base sets
    sb = make_sandbox("docker", base_images={"python:3.13-slim": base})
    try:
        sb.start(prepared(task, sb.backend))
        assert sb.exec("pwd; ls").output.split() == ["/srv/app", "bin", "words.txt"]
        assert sb.read_file("words.txt") == "alpha\nbeta\ngamma\n"
    finally:
        sb.close()
        client.images.remove(sb.image, force=True)


@pytest.mark.docker
def test_docker_without_building_uses_the_default_image() -> None:
    _docker_client()
    task = load_task_dir(TB_TASK)
    sb = make_sandbox("docker", build_images=False)
    try:
        sb.start(prepared(task, sb.backend))
        assert sb.image == DEFAULT_IMAGE and sb.read_file("logs/api.log")  # files put in, as before
    finally:
        sb.close()
