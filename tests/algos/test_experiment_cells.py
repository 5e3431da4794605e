"""The experiments' cell runner (benchmarks/boundary_experiment.py, used by every arms experiment): a killed
run leaves no worker behind, and a cell whose run directory another process wrote into is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import boundary_experiment as be  # noqa: E402

from compactrl.sandbox.local import _children, _is_zombie  # noqa: E402  (the /proc readers the sandbox uses)


def _alive(pid: int) -> bool:
    try:
        return not _is_zombie(str(pid))
    except (OSError, ValueError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_pool_workers_end_when_the_run_that_started_them_is_killed():
    code = (f"import sys, time; sys.path.insert(0, {str(BENCHMARKS)!r}); import boundary_experiment as be; "
            "be._run_all(time.sleep, [300, 300], jobs=2)")
    parent = subprocess.Popen([sys.executable, "-c", code])
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            workers = [p for p in _children(parent.pid)
                       if b"spawn_main" in (Path("/proc") / str(p) / "cmdline").read_bytes()]
            if len(workers) == 2:
                break
            time.sleep(0.2)
        assert len(workers) == 2, "the pool did not start its two workers"
        time.sleep(1.0)  # past the initializer
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(p) for p in workers):
            time.sleep(0.2)
        assert not any(_alive(p) for p in workers), "a worker outlived the killed run (it sleeps 300 s)"
    finally:
        parent.kill()
        for p in workers:
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def test_a_run_directory_written_by_two_processes_is_refused(tmp_path):
    be.check_rows([{"iteration": i} for i in range(5)], tmp_path)  # a run, in order: accepted
    be.check_rows([], tmp_path)
    for iterations in ([4, 0, 1, 2, 3, 4], [0, 1, 1, 2, 3, 4], [1, 2, 3]):
        with pytest.raises(ValueError, match="rows from another process"):
            be.check_rows([{"iteration": i} for i in iterations], tmp_path)
