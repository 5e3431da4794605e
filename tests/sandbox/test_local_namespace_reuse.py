"""Closing a local sandbox never touches another one. A pid namespace's id (``pid:[inode]``) is
reused by the kernel as soon as the namespace is gone, and a closing sandbox reaps "the processes of
its namespace" by that id, looking again until none is left: had its namespace gone and a sandbox
started meanwhile got the same id, that sandbox would be killed (a test's sandbox shell died with
status 137 while benchmark episodes started and closed sandboxes beside the test suite). A started
sandbox therefore holds its namespace open until it has reaped it, so the id cannot be reused."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest
from sandbox_helpers import local_unavailable, small_task

from compactrl.sandbox.local import LocalSandbox


def _unshare_ok() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "--pid", "--fork", "true"], capture_output=True).returncode == 0


def _new_namespace_ids(n: int) -> list[str]:
    return [subprocess.run(["unshare", "--pid", "--fork", "readlink", "/proc/self/ns/pid"], capture_output=True,
                           text=True, timeout=30).stdout.strip() for _ in range(n)]


@pytest.mark.skipif(not _unshare_ok(), reason="unshare --pid is not available here")
def test_a_namespace_held_open_keeps_its_id() -> None:
    child = subprocess.Popen(["unshare", "--pid", "--fork", "sleep", "600"])
    try:
        for _ in range(200):  # the forked sleep is the namespace's init
            kids = subprocess.run(["pgrep", "-P", str(child.pid)], capture_output=True, text=True).stdout.split()
            if kids:
                break
            subprocess.run(["sleep", "0.05"])
        ns_path = f"/proc/{kids[0]}/ns/pid"
        ns = os.readlink(ns_path)
        fd = os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
        os.kill(int(kids[0]), signal.SIGKILL)  # the namespace's only process; unshare reaps it and exits
        child.wait(timeout=30)
    finally:
        child.kill()
        child.wait()
    try:
        # its last process is gone, but held open its id is given to no new namespace (released, the kernel
        # hands it out again at once: not asserted, other namespaces may be made beside this test)
        assert ns not in _new_namespace_ids(5)
    finally:
        os.close(fd)


@pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))
def test_a_started_sandbox_holds_its_namespace_until_close() -> None:
    sb = LocalSandbox(timeout_s=60)
    try:
        sb.start(small_task())
        assert sb._ns_fd is not None and os.readlink(f"/proc/self/fd/{sb._ns_fd}") == sb.pid_namespace
    finally:
        sb.close()
    assert sb._ns_fd is None
