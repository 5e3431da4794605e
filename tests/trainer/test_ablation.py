"""The ablation experiment runs end to end on the smoke preset and writes its JSON and table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import compaction_ablation as ab  # noqa: E402


@pytest.mark.timeout(600)
def test_ablation_smoke_run_writes_results(tmp_path):
    arms = "ppo_bootstrap,grpo,ppo_frozen_summarizer,ppo_no_budget"
    assert ab.main(["--preset", "smoke", "--seeds", "2", "--arms", arms, "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["arms"]) == set(arms.split(","))
    for arm, agg in results["arms"].items():
        assert agg["seeds"] == 2 and len(agg["success_per_seed"]) == 2
        lo, hi = agg["success_ci95"]
        assert lo <= agg["success_mean"] <= hi
        curve = agg["success_by_iteration"]  # the smoke preset evaluates every iteration (JSON: str keys)
        assert list(curve) == ["1", "2"] and curve["2"] == pytest.approx(agg["success_mean"])
        cfg = json.loads((tmp_path / arm / "seed0" / "config.json").read_text())
        assert cfg["model"]["pretrained"].endswith("sft_model") and cfg["sft"]["enabled"] is False
    no_budget = json.loads((tmp_path / "ppo_no_budget" / "seed1" / "config.json").read_text())
    assert no_budget["env"]["context_budget"] == 4096 and no_budget["eval"]["context_budget"] == 640
    frozen = json.loads((tmp_path / "ppo_frozen_summarizer" / "seed0" / "config.json").read_text())
    assert frozen["rl"]["frozen_summarizer"] and not frozen["rl"]["train_summaries"]
    table = (tmp_path / "results.md").read_text()
    assert all(a in table for a in arms.split(",")) and "Wilson" in table and "it. 1: " in table


@given(k=st.integers(0, 200), extra=st.integers(0, 200))
def test_wilson_interval_contains_the_proportion(k, extra):
    n = k + extra
    lo, hi = ab.wilson(k, n)
    assert 0.0 <= lo <= hi <= 1.0
    if n:
        assert lo - 1e-12 <= k / n <= hi + 1e-12


@given(xs=st.lists(st.floats(0, 1), min_size=1, max_size=10))
def test_t_interval_is_centred_on_the_mean(xs):
    mean, lo, hi = ab.t_interval(xs)
    assert lo <= mean + 1e-12 and mean <= hi + 1e-12
    assert abs((lo + hi) / 2 - mean) < 1e-9
