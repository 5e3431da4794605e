"""``compactrl gateway`` as a real process: serves, records, ends a session, stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import requests
from server_helpers import server_url

from compactrl.gateway.recording import load_session

REPO = Path(__file__).resolve().parents[2]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode}")
        try:
            if requests.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            time.sleep(0.2)  # polling a process we do not control: no readiness signal to wait on
    raise TimeoutError(f"{url} not healthy after {timeout} s")


@pytest.mark.timeout(300)
def test_gateway_process_records_a_session_and_stops_cleanly(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "compactrl.cli", "gateway", "--tiny", "glm4_moe", "--port", "0", "--threads", "1",
         "--record-dir", str(tmp_path), "--served-model-name", "tiny"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, output = server_url(proc)
        _wait_healthy(url, proc)
        client = openai.OpenAI(base_url=f"{url}/s/cli-1/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list()] == ["tiny"]
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        assert r.choices[0].message.role == "assistant"
        done = requests.post(f"{url}/v1/sessions/cli-1/reward", json={"reward": 0.5}, timeout=10)
        assert done.status_code == 200
        assert requests.post(f"{url}/v1/sessions/cli-1/reward", json={"reward": 0.5}, timeout=10).status_code == 400
        session = load_session(tmp_path / "cli-1.jsonl")
        assert session.reward == 0.5 and len(session.calls) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert any(line.startswith("compactrl gateway: model 'tiny' on http://127.0.0.1:") for line in output)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
