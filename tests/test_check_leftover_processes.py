"""scripts/check_leftover_processes.py: finds a run's surviving processes by the marker they inherited."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_leftover_processes.py"

pytestmark = pytest.mark.timeout(60)


def _check(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=30,
                          env=env)


def _sleeper(env_extra: dict) -> subprocess.Popen:
    # its own session, like a daemon that left the process tree (podman's conmon)
    return subprocess.Popen(["sleep", "600"], env={**os.environ, **env_extra}, start_new_session=True)


def test_a_marked_survivor_fails_the_check_and_is_named():
    run = uuid.uuid4().hex
    marked, unmarked = _sleeper({"CHECK_RUN": run}), _sleeper({"CHECK_RUN": "another-run"})
    try:
        res = _check(f"CHECK_RUN={run}")
        assert res.returncode == 1
        assert f"pid {marked.pid} " in res.stderr and f"pid {unmarked.pid} " not in res.stderr
        assert "1 process(es) of this run still alive" in res.stderr
        assert _check(f"CHECK_RUN={run[:8]}*").returncode == 1  # shell-style patterns
    finally:
        for p in (marked, unmarked):
            p.kill()
            p.wait()
    assert _check(f"CHECK_RUN={run}").returncode == 0  # dead (and reaped): nothing left


def test_kill_ends_the_survivors_and_still_fails():
    run = uuid.uuid4().hex
    proc = _sleeper({"CHECK_RUN": run})
    try:
        res = _check("--kill", f"CHECK_RUN={run}")
        assert res.returncode == 1 and "killed them; 0 still alive" in res.stderr
        assert proc.wait(timeout=10) == -9
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_checker_and_its_ancestors_are_not_leftovers():
    run = uuid.uuid4().hex
    res = _check(f"CHECK_RUN={run}", env={**os.environ, "CHECK_RUN": run})  # the checker carries the marker
    assert res.returncode == 0, res.stderr
    assert _check("no-equals-sign").returncode == 2


def test_a_process_that_ends_as_the_wait_runs_out_is_not_a_leftover():
    """The last poll can see a process that is gone (or a zombie) by the time it is reported."""
    import importlib.util
    import signal

    spec = importlib.util.spec_from_file_location("check_leftover_processes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    live, zombie, reaped = (_sleeper({}) for _ in range(3))
    try:
        zombie.send_signal(signal.SIGKILL)  # dead, not reaped: a zombie until wait()
        reaped.kill()
        reaped.wait()
        os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # blocks until it has exited; not reaped
        assert module._stat(zombie.pid)[0] == "Z"
        left = module.survivors([live.pid, zombie.pid, reaped.pid])
        assert list(left) == [live.pid] and left[live.pid].startswith(f"pid {live.pid} ")
    finally:
        for p in (live, zombie):
            p.kill()
            p.wait()
