"""One HOME for the reference solution, the agent and the verifier (the task image's user's), and
task.toml read as Harbor reads it: unknown keys and tables are ignored, never refused."""

from __future__ import annotations

import os

import pytest
from loader_helpers import FIXTURES, local_unavailable

from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.tasksets.terminal_bench.dockerfile import read_dockerfile, user_home
from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig, load_task_dir
from compactrl.tasksets.terminal_bench.spec import read_spec

pytestmark = pytest.mark.timeout(600)

SHARED_HOME = os.path.join(FIXTURES, "terminal_bench_local", "shared-home")


def test_unknown_task_toml_keys_and_tables_are_ignored_as_harbor_ignores_them() -> None:
    # Harbor's TaskConfig (and each of its tables) is a pydantic model with the default extra="ignore"
    spec = read_spec(SHARED_HOME)
    assert "sources" in spec.ignored_keys  # [[sources]] provenance of a schema_version 1.1 task.toml
    assert "agent.timout_sec (did you mean agent.timeout_sec?)" in spec.ignored_keys
    assert spec.agent_timeout_s == 120.0  # the misspelled key is ignored, not read
    for known in ("task", "schema_version", "environment.os"):
        assert not any(k.split(" ")[0] == known for k in spec.ignored_keys)


def test_a_task_toml_value_harbor_cannot_read_is_still_refused(tmp_path) -> None:
    folder = tmp_path / "t"
    (folder / "tests").mkdir(parents=True)
    (folder / "instruction.md").write_text("do it\n")
    (folder / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (folder / "task.toml").write_text('[verifier]\ntimeout_sec = "ten"\n[[sources]]\nurl = "x"\n')
    with pytest.raises(ValueError, match="verifier.timeout_sec: must be a number"):
        read_spec(str(folder))


@pytest.mark.parametrize(("dockerfile", "home"), [
    ("FROM python:3.13-slim\nWORKDIR /app\n", "/root"),
    ("FROM ubuntu:24.04\nRUN useradd -m dev\nUSER dev\n", "/home/dev"),
    ("FROM ubuntu:24.04\nRUN apt-get update && useradd -m -d /srv/dev -s /bin/bash dev\nUSER dev:dev\n", "/srv/dev"),
    ("FROM ubuntu:24.04\nRUN adduser --disabled-password --home=/opt/app app\nUSER app\nUSER root\n", "/root"),
])
def test_the_home_is_the_image_users(tmp_path, dockerfile: str, home: str) -> None:
    (tmp_path / "Dockerfile").write_text(dockerfile)
    facts = read_dockerfile(str(tmp_path / "Dockerfile"), str(tmp_path))
    assert facts.home == home
    assert user_home("root", []) == "/root"


@pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))
def test_solution_agent_and_verifier_share_the_images_home(cache) -> None:
    # the Dockerfile writes ~/.config as root, the solution copies it under ~, the verifier reads
    # Path.home(): one HOME for all three, root's as in the image
    task = load_task_dir(SHARED_HOME, TerminalBenchConfig(backend="local", prepare=True, local_cache=cache))
    assert task.runtime.home == "/root" and not task.grading.not_gradable
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert "home /root, answer present: True" in gold["info"]["test_log_tail"]
    assert not noop["success"] and noop["sandbox_error"] is None
    assert "home /root, answer present: False" in noop["info"]["test_log_tail"]


@pytest.mark.skipif(bool(local_unavailable()) or os.geteuid() != 0,
                    reason=str(local_unavailable() or "a root layer needs compactrl to run as root"))
def test_a_solution_that_adds_users_runs_as_the_images_root(cache) -> None:
    # useradd, groupadd, usermod, chpasswd, su and chown to the new user: as the image's root does them
    task = load_task_dir(os.path.join(FIXTURES, "terminal_bench_local", "adds-users"),
                         TerminalBenchConfig(backend="local", prepare=True, local_cache=cache))
    assert not task.grading.not_gradable, task.grading.not_gradable
    assert task.runtime.image_root is True
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert not noop["success"] and noop["sandbox_error"] is None
    # the host's account files are untouched
    with open("/etc/passwd") as fh:
        assert not any(line.startswith("alice:") for line in fh)


@pytest.mark.skipif(bool(local_unavailable()) or not os.path.isdir("/root") or os.geteuid() != 0,
                    reason=str(local_unavailable() or "needs /root on the host (a prepared state under root's cache)"))
def test_folders_leading_to_a_mount_in_the_home_are_the_shells(tmp_path) -> None:
    # a prepared state lives under the host's ~/.cache; with HOME=/root its parents lie in the shell's
    # private /root, and a tool's ~/.cache/uv must go beside it, as in the image
    import tempfile

    from compactrl.sandbox.local import LocalSandbox, LocalSandboxConfig
    from compactrl.task import Check, Runtime, Task

    base = tempfile.mkdtemp(prefix=".compactrl-home-test-", dir="/root")
    try:
        state = os.path.join(base, "cache", "state")
        os.makedirs(state)
        task = Task(id="home-mount", kind="terminal", instruction="x", files={}, check=Check(kind="script", command="true"),
                    runtime=Runtime(writable_paths=("/root",), home="/root"))
        sandbox = LocalSandbox(config=LocalSandboxConfig(ro_binds=(state,)))
        sandbox.start(task)
        try:
            res = sandbox.exec(f'echo "$HOME"; mkdir {base}/cache/uv && touch {base}/cache/uv/x && echo made', timeout_s=30)
        finally:
            sandbox.close()
        assert res.exit_code == 0 and res.output.split() == ["/root", "made"], res.output
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
