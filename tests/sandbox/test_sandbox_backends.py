"""Backend-specific behaviour: the unshare fallback, work dirs from the task, script checks, and
removal of containers left by crashed processes."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys

import pytest
from sandbox_helpers import REAL_BACKENDS, make_backend, small_task

from compactrl.sandbox import local as local_mod
from compactrl.sandbox.base import SandboxError
from compactrl.task import Check, Runtime, Task


@pytest.mark.timeout(120)
def test_auto_falls_back_to_unshare_and_says_so(monkeypatch, caplog):
    if local_mod._probe("unshare", 65534) is not None:
        pytest.skip(f"unshare unusable here: {local_mod._probe('unshare', 65534)}")
    real_which = local_mod.shutil.which
    monkeypatch.setattr(local_mod.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    monkeypatch.setattr(local_mod, "_probe_cache", {})
    with caplog.at_level(logging.WARNING, logger="compactrl.sandbox.local"):
        assert local_mod.choose_isolation("auto") == "unshare"
    assert "isolating with unshare" in caplog.text and "bwrap is not installed" in caplog.text
    monkeypatch.setattr(local_mod.shutil, "which", lambda name: None)
    monkeypatch.setattr(local_mod, "_probe_cache", {})
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        local_mod.choose_isolation("auto")


@pytest.mark.timeout(180)
def test_unshare_fallback_isolates_like_bubblewrap():
    if local_mod._probe("unshare", 65534) is not None:
        pytest.skip(f"unshare unusable here: {local_mod._probe('unshare', 65534)}")
    sb = make_backend("local", isolation="unshare", max_processes=64)
    sb.start(small_task())
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        assert sb.isolation == "unshare"
        port = server.getsockname()[1]
        res = sb.exec(f"(echo x > /dev/tcp/127.0.0.1/{port}) 2>&1; touch /usr/x /etc/x 2>&1; id -u; hostname")
        assert ("refused" in res.output or "unreachable" in res.output) and res.output.count("Read-only file system") == 2, res.output
        assert res.output.split()[-2:] == ["65534", "sandbox"] or os.geteuid() != 0, res.output
        res = sb.exec("bomb() { bomb | bomb & }; bomb; sleep 2", timeout_s=6)
        assert sb.exec("echo ok").output == "ok\n"
        assert sb.exec(f"test -e {__file__} && echo visible || echo hidden").output == "hidden\n"
        report = sb.run_tests()
        assert report.success and report.passed == ("tests/test_calc.py::test_add",)
        ns, session = sb.pid_namespace, sb.session_dir
    finally:
        server.close()
        sb.close()
    assert local_mod._ns_processes(ns) == [] and not os.path.exists(session)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", REAL_BACKENDS)
def test_script_checks_pass_on_exit_code_zero(name):
    checker = "import sys\nsys.exit(0 if open('answer.txt').read().strip() == '42' else 1)\n"
    sb = make_backend(name)
    sb.start(small_task({"answer.txt": "41\n"}, kind="script", command="python3 .check/check.py",
                        hidden_files={".check/check.py": checker}))
    try:
        assert not sb.run_tests().success
        sb.exec("echo 42 > answer.txt")
        report = sb.run_tests()
        assert report.success and report.passed == () and ".check/check.py" not in sb.list_files()
    finally:
        sb.close()


@pytest.mark.timeout(120)
def test_local_workdir_from_task_runtime():
    task = Task(id="w", kind="code", instruction="", files={"a.txt": "hi\n"}, runtime=Runtime(workdir="/testbed"))
    sb = make_backend("local")
    sb.start(task)
    try:
        assert sb.exec("pwd; cat a.txt; echo $HOME").output == "/testbed\nhi\n/testbed\n"
    finally:
        sb.close()


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_docker_repo_in_the_image():
    """A task whose repository is in the image (SWE-bench style): empty files, workdir set."""
    task = Task(id="img", kind="code", instruction="", files={}, runtime=Runtime(workdir="/srv"),
                check=Check(kind="script", command="test -f /srv/made.txt"))
    sb = make_backend("docker")
    sb.start(task)
    try:
        assert sb.exec("pwd").output == "/srv\n"
        assert sb.list_files() == []
        sb.write_file("made.txt", "x\n")
        assert sb.run_tests().success
        assert sb.exec("touch /usr/ok-here && echo writable").output == "writable\n"  # root not read-only
    finally:
        sb.close()


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_containers_of_dead_processes_are_removed():
    import docker

    from compactrl.sandbox.docker import DEFAULT_IMAGE, LABEL, reap_stale_containers

    make_backend("docker")  # skips when no engine
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    client = docker.from_env()
    try:
        orphan = client.containers.create(DEFAULT_IMAGE, command=["true"],
                                          labels={LABEL: "1", "compactrl.owner": f"{socket.gethostname()}:{dead.pid}"})
        alive = client.containers.create(DEFAULT_IMAGE, command=["true"],
                                         labels={LABEL: "1", "compactrl.owner": f"{socket.gethostname()}:{os.getpid()}"})
        try:
            removed = reap_stale_containers(client)
            assert orphan.id in removed and alive.id not in removed
            assert client.api.containers(all=True, filters={"id": orphan.id}) == []
        finally:
            alive.remove(force=True)
    finally:
        client.close()


@pytest.mark.docker
@pytest.mark.timeout(60)
def test_unreachable_engine_is_a_sandbox_error():
    make_backend("docker")  # skips when the SDK is missing
    from compactrl.sandbox.docker import DockerSandbox

    sb = DockerSandbox(base_url="unix:///nonexistent/compactrl.sock")
    with pytest.raises(SandboxError, match="no Docker-compatible engine reachable"):
        sb.start(small_task())
    with pytest.raises(SandboxError, match="not started"):
        sb.exec("true")


def test_docker_network_must_name_a_mode():
    from compactrl.sandbox.docker import DockerSandboxConfig

    assert DockerSandboxConfig().network == "none"
    with pytest.raises(ValueError, match="network must be a network mode"):
        DockerSandboxConfig(network=" ")


@pytest.mark.docker
@pytest.mark.timeout(120)
def test_docker_network_is_the_configured_mode():
    """``network="host"`` (as a harness that gives its containers the network): a listener on the host's
    loopback is reached; by default (``"none"``) it is not (test_sandbox_security.py)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(30)
    port = server.getsockname()[1]
    sb = make_backend("docker", network="host")
    try:
        sb.start(small_task())
        res = sb.exec(f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=10)\""
                      " && echo CONNECTED", timeout_s=30)
        assert "CONNECTED" in res.output, res.output
        conn, _ = server.accept()
        conn.close()
    finally:
        sb.close()
        server.close()
