"""The compaction ablation on Ray: its arm x seed runs are Ray tasks, and a resumed run trains only
the runs that did not finish."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import compaction_ablation as ab  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_resumed_ablation_on_ray_trains_only_its_unfinished_runs(ray_cluster, tmp_path):
    argv = ["--preset", "smoke", "--seeds", "2", "--arms", "ppo_bootstrap", "--out", str(tmp_path), "--ray",
            "--jobs", "2"]

    def invocation() -> dict:
        assert ab.main(argv) == 0
        return json.loads((tmp_path / "results.json").read_text())

    first = invocation()
    assert sorted(first["cells_run"]) == ["ppo_bootstrap/seed0", "ppo_bootstrap/seed1"]
    kept = tmp_path / "ppo_bootstrap" / "seed0" / "metrics.jsonl"
    before = kept.read_bytes(), kept.stat().st_mtime_ns
    shutil.rmtree(tmp_path / "ppo_bootstrap" / "seed1")  # as if the first invocation stopped before it

    resumed = invocation()
    assert resumed["cells_run"] == ["ppo_bootstrap/seed1"]
    assert (kept.read_bytes(), kept.stat().st_mtime_ns) == before, "a finished run was trained again"
    agg = resumed["arms"]["ppo_bootstrap"]
    assert agg["seeds"] == 2 and len(agg["success_per_seed"]) == 2
    assert invocation()["cells_run"] == []  # everything finished: the table is re-rendered only
