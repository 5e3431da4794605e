"""Every example script smoke-runs with a tiny budget (``COMPACTRL_EXAMPLE_TINY=1``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("train_*.py"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_smoke_runs(script):
    env = {**os.environ, "COMPACTRL_EXAMPLE_TINY": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out success after SFT" in proc.stderr and "iteration 1" in proc.stderr


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"train_ppo.py", "train_grpo.py"}
