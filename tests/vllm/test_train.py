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


def _engine_pids(parent: int) -> list[int]:
    """The vLLM engine processes started by ``parent`` (read from /proc)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"vllm_engine.py" in cmd:
            pids.append(int(d.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


@pytest.mark.timeout(1200)
def test_smoke_run_on_the_engine_survives_a_killed_engine(tmp_path):
    out = tmp_path / "run"
    cmd = [*COMPACTRL, "train", "--preset", "smoke", "--rollout.engine", "vllm", "--out", str(out), "--no-progress"]
    log = (tmp_path / "first.log").open("w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 900
        while not _rows(out):  # row 0 is written once SFT, the engine's start and its first check are done
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the run did not reach iteration 0"
            seen.update(_engine_pids(proc.pid))
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGSTOP)  # hold the trainer while its engine is killed
        try:
            engines = _engine_pids(proc.pid)
            assert len(engines) == 1, engines
            seen.update(engines)
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
                             capture_output=True, text=True, timeout=900)
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
    assert not [p for p in seen if _alive(p)], "an engine process outlived its run"
    assert not [p for p in _engine_pids(1) if _alive(p)], "an orphaned engine process is still running"
