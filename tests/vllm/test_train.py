"""``compactrl train --preset smoke --rollout.engine vllm``: a run whose engine is killed mid-run stops
with an error naming the dead engine, resumes from its checkpoint with a new engine, and ends with
the held-out figures and the report of the default engine; no engine process outlives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPACTRL = [sys.executable, "-m", "compactrl.cli"]
MARK = "COMPACTRL_TEST_ENGINE_MARK"
"""Set in the runs' environment, which their engine processes inherit."""


def _engine_pids(parent: int, mark: str | None = None) -> list[int]:
    """The vLLM engine processes started by ``parent`` (read from /proc); with ``mark``, only those whose
    environment holds it (this test's runs: not an engine of another test or job on the machine)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes()
            if ppid == parent and b"serving/vllm/engine.py" in cmd and (
                    mark is None or f"{MARK}={mark}".encode() in (d / "environ").read_bytes().split(b"\0")):
                pids.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def _started(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), None when it is gone: a pid with
    its start time names one process, where the pid alone may be reused (pid_max can be 32768)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int, started: int | None = None) -> bool:
    """Process ``pid`` runs (not a zombie), and is the one that started at ``started`` when given."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and (started is None or int(fields[19]) == started)


def _rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


@pytest.mark.timeout(1200)
def test_smoke_run_on_the_engine_survives_a_killed_engine(tmp_path):
    out = tmp_path / "run"
    mark = f"{os.getpid()}-{time.time_ns()}"
    env = {**os.environ, MARK: mark}
    cmd = [*COMPACTRL, "train", "--preset", "smoke", "--rollout.engine", "vllm", "--out", str(out), "--no-progress"]
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    seen: dict[int, int] = {}  # engine pid -> its start time
    try:
        deadline = time.monotonic() + 900
        while not _rows(out):  # row 0 is written once SFT, the engine's start and its first check are done
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not reach iteration 0"
            seen.update({p: t for p in _engine_pids(proc.pid) if p not in seen and (t := _started(p)) is not None})
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGSTOP)  # hold the trainer while its engine is killed
        try:
            engines = _engine_pids(proc.pid)
            assert len(engines) == 1, engines
            seen.update({p: t for p in engines if p not in seen and (t := _started(p)) is not None})
            os.kill(engines[0], signal.SIGKILL)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    first = (tmp_path / "first.log").read_text()
    assert rc == 1, first[-3000:]
    assert f"the vLLM engine process (pid {engines[0]}) was killed by signal 9" in first
    assert f"compactrl train --resume --out {out}" in first
    done = {r["iteration"] for r in _rows(out)}
    assert 2 not in done  # stopped before the end

    resumed = subprocess.run([*COMPACTRL, "train", "--resume", "--out", str(out), "--no-progress"], cwd=REPO,
                             env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert "held-out success after SFT" in resumed.stdout
    rows = _rows(out)
    assert [r["iteration"] for r in rows] == [0, 1, 2]  # each iteration once
    for r in rows[1:]:
        assert r["engine/probe_max_abs_dlogp"] < 1e-4 and r["engine/sync_version"] == r["iteration"]
        assert r["mismatch/max_abs_dlogp"] < 1e-4 and abs(r["mismatch/k3"]) < 1e-6
    report = (out / "report.md").read_text()
    assert "## Held-out success" in report and "| 2 |" in report and "a vLLM engine process (float32)" in report
    time.sleep(1)
    assert not [p for p, t in seen.items() if _alive(p, t)], "an engine process outlived its run"
    assert not [p for p in _engine_pids(1, mark) if _alive(p)], "an orphaned engine process is still running"
