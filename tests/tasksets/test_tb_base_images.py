"""Base images mapped per family (``compactrl.tasksets.terminal_bench.base_images``): which family a published
base belongs to, what its substitute is built from, and (docker, real Podman) a task whose Dockerfile
starts from a base the engine lacks and ``RUN``s a generator: the family substitute is built, the
task's image on it, and gold passes / noop fails in it."""

from __future__ import annotations

import dataclasses
import os

import pytest
from loader_helpers import FIXTURES, docker_unavailable

from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.sandbox import make_sandbox
from compactrl.sandbox.docker import GRADER_DEPS_DIR, DockerSandboxConfig
from compactrl.tasksets.terminal_bench import base_images as bi
from compactrl.tasksets.terminal_bench.folders import load_task_dir
from compactrl.tasksets.terminal_bench.image_build import build_task_image

pytestmark = pytest.mark.timeout(900)
LEDGER_TASK = os.path.join(FIXTURES, "terminal_bench_images", "generated-ledger")


# ------------------------------------------------------------------------------ no engine needed
@pytest.mark.parametrize("image,name,tag", [
    ("python:3.12-slim", "python", "3.12-slim"),
    ("public.ecr.aws/docker/library/golang:1.26.2-bookworm", "golang", "1.26.2-bookworm"),
    ("docker.io/library/ubuntu", "ubuntu", "latest"),
    ("ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest@sha256:" + "0" * 64,
     "ghcr.io/laude-institute/t-bench/ubuntu-24-04", "latest"),
    ("localhost:5000/team/img", "localhost:5000/team/img", "latest"),
])
def test_references_are_normalised(image, name, tag) -> None:
    assert bi.parse_reference(image) == (name, tag)


@pytest.mark.parametrize("image,family,root", [
    # the bases of the official 1.x set and of the 2.x sets read here (benchmarks/data/...SOURCES.md)
    ("ghcr.io/laude-institute/t-bench/python-3-13:20250620", "t-bench/python-3-13", "debian-bookworm"),
    ("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624", "t-bench/ubuntu-24-04", "ubuntu-noble"),
    ("python:3.9-slim-bookworm", "python", "debian-bookworm"),
    ("python:3.12.7-slim-bookworm", "python", "debian-bookworm"),
    ("ubuntu:24.04", "ubuntu", "ubuntu-noble"),
    ("ubuntu:22.04", "ubuntu", "ubuntu-jammy"),
    ("debian:bullseye-slim", "debian", "debian-bullseye"),
    ("buildpack-deps:jammy", "buildpack-deps", "ubuntu-jammy"),
    ("gcc:13.3.0-bookworm", "gcc", "debian-bookworm"),
    ("golang:1.22.7-bookworm", "golang", "debian-bookworm"),
    ("public.ecr.aws/docker/library/node:20.18.1-bookworm", "node", "debian-bookworm"),
    ("eclipse-temurin:17.0.12_7-jdk-jammy", "eclipse-temurin", "ubuntu-jammy"),
])
def test_published_bases_map_to_their_family(image, family, root) -> None:
    recipe = bi.recipe_for(image)
    assert (bi.family_of(image).name, recipe.family, recipe.root) == (family, family, root)
    text = "\n".join(recipe.steps)
    if family == "golang":  # the tag's Go line, Ubuntu's build copied from a stage; never a download
        assert "COPY --from=go /opt/go /usr/local/go" in text and "GOTOOLCHAIN=local" in text
        assert "WORKDIR /go" in text and "golang-1.22-go" in " ".join(recipe.stages[0][2])
        assert "cp -rL /usr/lib/go-1.26 /opt/go" in bi.recipe_for("golang:1.26.2-bookworm").stages[0][2][-1]
    if family.startswith("t-bench/"):
        assert text.endswith("WORKDIR /app") and "tmux asciinema" in text
    if family == "gcc":
        assert "build-essential" in text and any("GCC 12" in n for n in recipe.notes)


def test_python_family_uses_this_machines_interpreter_or_says_it_does_not() -> None:
    recipe = bi.recipe_for("python:3.13-slim")
    assert recipe.python == "3.13"
    if recipe.python_prefix:  # copied into /usr/local; only pip/setuptools/wheel of its site-packages
        tree = [rel for _, rel in bi._python_tree(recipe.python_prefix, "3.13")]
        assert "bin/python3.13" in tree and "lib/python3.13/os.py" in tree
        assert not any(r.startswith("lib/python3.13/test/") for r in tree)
        site = {r.split("/")[3] for r in tree if r.startswith("lib/python3.13/site-packages/")}
        assert site and all(bi._KEEP_SITE.match(s) for s in site), site
    else:
        assert any("distribution's python3" in n for n in recipe.notes)
    assert "python3-pip" not in "\n".join(bi.recipe_for("python:3.13").steps) or not recipe.python_prefix


@pytest.mark.parametrize("image,reason", [
    ("mcr.microsoft.com/dotnet/sdk:8.0.405", "Microsoft"),
    ("alpine:latest", "apk"),
    ("localstack/localstack:4.3", "application image"),
    ("ghcr.io/laude-institute/t-bench/deveval:latest", "not published"),
    ("swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest", "tasks prepare"),
    ("quay.io/someone/thing:1", "no known family"),
    ("python:2.7-slim", "no substitute for the tag"),
])
def test_bases_without_a_substitute_say_why(image, reason) -> None:
    with pytest.raises(bi.NoSubstitute, match=reason):
        bi.recipe_for(image)


def test_every_family_is_documented() -> None:
    names = [f.name for f in bi.FAMILIES]
    assert len(names) == len(set(names))
    with open(os.path.join(os.path.dirname(FIXTURES), "..", "docs", "task_formats.md")) as fh:
        docs = fh.read()
    section = docs[docs.index("### Base images"):]
    for f in bi.FAMILIES:
        assert f"`{f.name}`" in section, f.name


def test_test_time_installs_become_grader_requirements() -> None:
    scripts = ["#!/bin/bash\nsource $TEST_DIR/setup-uv-pytest.sh\nuv add numpy==2.3.1\nbash $TEST_DIR/run-uv-pytest.sh\n",
               "apt-get install -y curl\nuv init\nuv add pytest==8.4.1\n",
               "pip install pytest requests psutil && python3 -m pip install 'pandas==2.3.0' -r extra.txt\n"]
    assert bi.test_requirements(scripts) == ["numpy==2.3.1", "requests", "psutil", "pandas==2.3.0"]
    assert bi.test_requirements(["pip install pytest==8.4.1\npytest $TEST_DIR -rA\n"]) == []
    assert bi.test_requirements(["uvx \\\n  --with pytest==8.4.1 \\\n  --with numpy==2.1.3 --with 'scipy' pytest /tests\n"]) == [
        "numpy==2.1.3", "scipy"]
    lines = bi.grader_layer(["numpy==2.3.1"], "app")
    assert lines[0] == "USER root" and lines[-1] == "USER app"
    assert f"--target {GRADER_DEPS_DIR} numpy==2.3.1" in lines[1] and f"[ -d {bi.GRADER_PIP_DIR}/pip ]" in lines[1]
    assert bi.grader_layer([], None) == []


def test_heredocs_become_context_files_for_builders_without_them() -> None:
    from compactrl.tasksets.terminal_bench.image_build import _context_tar, expand_heredocs

    text = ("FROM python:3.12-slim\nCOPY <<EOT /app/logs/a.log\nline 1\nline 2\nEOT\nRUN <<EOF\nset -e\nmkdir -p /data\nEOF\n"
            "RUN python3 <<-'PY' > /data/x\n\tprint(6 * 7)\n\tPY\nRUN echo '<<not a heredoc' > /y\n")
    out, files = expand_heredocs(text)
    assert out.split("\n") == [
        "FROM python:3.12-slim", "COPY .compactrl-heredoc/0 /app/logs/a.log",
        "COPY .compactrl-heredoc/1 /tmp/.compactrl-heredoc-1", "RUN sh /tmp/.compactrl-heredoc-1",
        "COPY .compactrl-heredoc/2 /tmp/.compactrl-heredoc-2", "RUN python3 < /tmp/.compactrl-heredoc-2 > /data/x",
        "RUN echo '<<not a heredoc' > /y", ""]
    assert files == {".compactrl-heredoc/0": b"line 1\nline 2\n", ".compactrl-heredoc/1": b"set -e\nmkdir -p /data\n",
                     ".compactrl-heredoc/2": b"print(6 * 7)\n"}
    assert expand_heredocs("FROM a\nRUN true\n") == ("FROM a\nRUN true\n", {})
    # `<< 'GO'` (a space before the word) is a heredoc too; `<<<` is a here-string
    out, files = expand_heredocs("FROM a\nRUN cat > /app/main.go << 'GO'\npackage main\nGO\nRUN cat <<< hi > /x\n")
    assert out.split("\n")[1:4] == ["COPY .compactrl-heredoc/0 /tmp/.compactrl-heredoc-0",
                                    "RUN cat > /app/main.go < /tmp/.compactrl-heredoc-0", "RUN cat <<< hi > /x"]
    assert files == {".compactrl-heredoc/0": b"package main\n"}
    import tempfile

    with tempfile.TemporaryDirectory() as ctx:  # the bodies are part of the image's digest
        assert _context_tar(ctx, out, files)[1] != _context_tar(ctx, out, {**files, ".compactrl-heredoc/0": b"x"})[1]


def test_survey_counts_bases_per_family(tmp_path) -> None:
    for i, text in enumerate(["FROM python:3.12-slim\n", "FROM golang:1.22 AS b\nFROM python:3.12-slim\n",
                              "FROM quay.io/x/y:1\n"]):
        os.makedirs(tmp_path / f"t{i}" / "environment")
        (tmp_path / f"t{i}" / "environment" / "Dockerfile").write_text(text)
    counts = bi.survey([str(tmp_path)])
    assert counts["python"]["python:3.12-slim"] == 2 and counts["golang"]["golang:1.22"] == 1
    assert counts["(none)"]["quay.io/x/y:1"] == 1


# ------------------------------------------------------------------------------ real engine
def _client():
    reason = docker_unavailable()
    if reason:
        pytest.skip(reason)
    if os.geteuid() != 0:
        pytest.skip("building an OS root (debootstrap) needs root")
    import docker

    return docker.from_env(timeout=1800)


def _root_ready(client) -> None:
    """The debian root is built by scripts/ci_docker.sh's set-up (debootstrap: the download is there,
    not in the test); without it the test skips."""
    try:
        client.images.get(bi.ROOTS["debian-bookworm"].tag)
    except Exception:
        pytest.skip(f"{bi.ROOTS['debian-bookworm'].tag} is not on the engine: run scripts/ci_docker.sh, which builds it")


@pytest.mark.docker
def test_task_on_a_family_base_builds_its_generated_data_and_grades() -> None:
    """``FROM debian:bookworm-slim`` (not on the engine, no registry): the debian family's substitute
    is built (once; cached after), the task's Dockerfile on it RUNs the generator, and the files it
    made are there for gold and noop alike: gold passes, noop fails."""
    client = _client()
    _root_ready(client)
    task = load_task_dir(LEDGER_TASK)
    assert task.files == {} or "ledger" not in " ".join(task.files)  # the data is made in the image
    build_task_image(client, task.id, dataclasses.asdict(task.runtime.image_build), DockerSandboxConfig())
    sb = make_sandbox("docker")
    try:
        sb.start(task)  # the image is cached: this start builds nothing
        out = sb.exec("grep -h VERSION_CODENAME /etc/os-release; ls /app/ledger | wc -l;"
                      " test -s /usr/local/share/ca-certificates/compactrl-host-ca.crt && echo ca-added; pwd")
        assert out.exit_code == 0 and out.output.split() == ["VERSION_CODENAME=bookworm", "12", "ca-added", "/app"], out
    finally:
        sb.close()
    gold = run_task(task, GoldPolicy(), "docker")
    noop = run_task(task, NoopPolicy(), "docker")
    assert gold["success"], gold
    assert not noop["success"] and not noop.get("sandbox_error"), noop


@pytest.mark.docker
def test_base_families_off_names_the_missing_base_and_its_family() -> None:
    _client()
    task = load_task_dir(LEDGER_TASK)
    rec = run_task(task, GoldPolicy(), "docker", sandbox_kwargs={"base_families": False})
    assert not rec["success"] and "base image 'debian:bookworm-slim'" in rec["sandbox_error"], rec
    text = ("FROM mcr.microsoft.com/dotnet/sdk:8.0\n")
    import tempfile

    with tempfile.TemporaryDirectory() as ctx:
        with open(os.path.join(ctx, "Dockerfile"), "w") as fh:
            fh.write(text)
        from compactrl.sandbox.base import SandboxError

        with pytest.raises(SandboxError, match=r"no family substitute: \.NET"):
            build_task_image(_client(), "dotnet-task", {"context": ctx, "dockerfile": os.path.join(ctx, "Dockerfile")},
                             DockerSandboxConfig())


@pytest.mark.docker
def test_background_processes_survive_their_command_in_a_task_image() -> None:
    """As Terminal-Bench's tmux session does (a server the solution starts is up for the tests): a
    process a command leaves in the background is still running at the next command, and one that
    holds the command's output open does not hold the command up."""
    client = _client()
    _root_ready(client)
    task = load_task_dir(LEDGER_TASK)
    assert task.runtime.keep_background
    count = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 1000'"
    sb = make_sandbox("docker")
    try:
        sb.start(task)
        assert sb.exec("sleep 1000 >/dev/null 2>&1 & echo started").output.strip() == "started"
        assert sb.exec(count).output.strip() == "1"
        out = sb.exec("sleep 1000 & echo holds-the-output", timeout_s=20)
        assert out.output.strip() == "holds-the-output" and not out.timed_out
        assert sb.exec(count).output.strip() == "2"
    finally:
        sb.close()
