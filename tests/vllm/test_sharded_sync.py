"""The vLLM engine synced from a 2-rank FSDP2 learner, and ``compactrl train`` with 2 learner ranks and the
engine, on Ray and under torchrun.

Invariants: after a sync the engine scores the probe batch as the ranks do (fp32: within 1e-5); the
engine's probe check takes the ranks' own log-probs as the truth, so weights corrupted on their way are
caught there too; a run finishes and no process it started (engine, rank, follower) outlives it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from compactrl.training.config import override, preset

REPO = Path(__file__).resolve().parents[2]
MARK = "COMPACTRL_TEST_SHARDED_MARK"


def _marked(mark: str) -> list[int]:
    """Live processes whose environment holds ``MARK=mark`` (everything a run started inherits it)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"{MARK}={mark}".encode() in (d / "environ").read_bytes().split(b"\0"):
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    pids.append(int(d.name))
        except OSError:
            continue
    return pids


@pytest.mark.timeout(900)
def test_the_engine_synced_from_two_ranks_scores_like_the_ranks(tmp_path):
    import torch

    from compactrl.distributed import local_ray
    from compactrl.serving.vllm.policy import SyncCheckError, VLLMPolicy, max_abs_diff
    from compactrl.tokenizer import shared_tokenizer
    from compactrl.training.learner import LearnerSyncError
    from compactrl.training.ranks import make_learner
    from compactrl.training.rollouts import build_policy

    cfg = override(preset("smoke"), {"rl.algo": "grpo", "learner.ranks": 2, "learner.sync_bucket_mb": 0.05})
    policy, _ = build_policy(cfg, shared_tokenizer())
    engine = VLLMPolicy.from_model(policy.model, policy.tokenizer, tmp_path / "engine", seed=0)

    class Source:  # the engine as the trainer's rollout source syncs it
        def update_weights(self, model, version, reference=None):
            engine.update_weights(model, version=version, reference=reference)

    import contextlib

    import ray

    running = contextlib.nullcontext() if ray.is_initialized() else local_ray(num_cpus=2,
                                                                               object_store_bytes=128 * 1024**2)
    with running:
        learner = make_learner(cfg, policy, None)
        try:
            learner.update(learner.advantages(_batch()))  # the ranks' weights move away from the engine's
            learner.sync(Source(), version=1)
            assert engine.version == 1
            worst, _ = max_abs_diff(engine.score(engine.probe), learner.probe_log_probs(engine.probe))
            assert worst < 1e-5 and engine.last_sync["engine/probe_max_abs_dlogp"] < 1e-5
            # a rank's corrupted bucket: caught before any engine sees it
            learner.ranks.call("corrupt_next_sync")
            with pytest.raises(LearnerSyncError):
                learner.sync(Source(), version=2)
            assert engine.version == 1
            # weights corrupted between the learner and the engine: the engine's check, against the ranks
            learner.pull()
            bad = copy.deepcopy(policy.model)
            with torch.no_grad():
                next(bad.parameters()).add_(0.5)
            with pytest.raises(SyncCheckError, match="probe"):
                engine.update_weights(bad, version=3, reference=learner.probe_log_probs)
        finally:
            learner.close()
            engine.close()


def _batch():
    """One group of two one-trace episodes, rewards 1 and 0: a GRPO step that changes the weights."""
    from compactrl.collectors.batch import EpisodeMeta, stack_traces
    from compactrl.types import Trace

    episodes = []
    for e, n in enumerate((30, 17)):
        pm = [False] * 4 + [True] * n
        ids = [(7 * i + 11 * e) % 3000 + 5 for i in range(len(pm))]
        episodes.append((EpisodeMeta(e, 0, True, False),
                         [Trace(ids, pm, [False] * len(pm), [-2.0 if p else float("nan") for p in pm],
                                {len(pm) - 1: float(e == 0)}, trace_index=0)]))
    return stack_traces(episodes)


def _smoke(tmp_path: Path, launch: str) -> None:
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark, "OMP_NUM_THREADS": "1"}
    out = tmp_path / launch
    args = ["train", "--preset", "smoke", "--learner.ranks", "2", "--rollout.engine", "vllm", "--out", str(out),
            "--no-progress"]
    if launch == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "compactrl.cli", *args]
    else:
        cmd = [sys.executable, "-m", "compactrl.cli", *args]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    last = rows[-1]
    assert last["engine/sync_version"] == 2.0 and last["engine/probe_max_abs_dlogp"] < 1e-5
    assert last["learner/probe_max_abs_dlogp"] < 1e-4
    assert json.loads((out / "config.json").read_text())["learner"]["ranks"] == 2
    deadline = time.monotonic() + 30
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _marked(mark) == [], "a process of the run outlived it"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("launch", ["ray", "torchrun"])
def test_a_smoke_run_with_two_learner_ranks_and_the_engine_finishes_clean(tmp_path, launch):
    _smoke(tmp_path, launch)
