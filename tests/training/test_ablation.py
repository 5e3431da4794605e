"""The ablation experiment runs end to end on the smoke preset and writes its JSON and table."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import boundary_experiment as be  # noqa: E402
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
    assert no_budget["env"]["context_budget"]["budget"] == 4096 and no_budget["eval"]["context_budget"] == 640
    frozen = json.loads((tmp_path / "ppo_frozen_summarizer" / "seed0" / "config.json").read_text())
    assert frozen["rl"]["frozen_summarizer"] and not frozen["rl"]["ppo"]["train_summaries"]
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


# -- the boundary experiment (benchmarks/boundary_experiment.py) -------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_boundary_experiment_resume_never_reruns_a_finished_cell(tmp_path, monkeypatch):
    import compactrl.training.trainer as trainer

    argv = ["--smoke", "--regimes", "default", "--arms", "ppo_bootstrap,grpo", "--seeds", "2", "--jobs", "1",
            "--out", str(tmp_path)]
    assert be.main(argv) == 0
    cells = tmp_path / "cells"
    assert sorted(p.name for p in cells.glob("*.json")) == [
        "default__grpo__seed0.json", "default__grpo__seed1.json", "default__ppo_bootstrap__seed0.json",
        "default__ppo_bootstrap__seed1.json", "default__sft.json"]
    with pytest.raises(SystemExit, match="--resume"):
        be.main(argv)  # finished cells are never overwritten by accident

    kept = {p.name: p.read_bytes() for p in cells.glob("*.json")}
    (cells / "default__grpo__seed1.json").unlink()
    shutil.rmtree(tmp_path / "default" / "grpo" / "seed1")
    calls = []
    real_train = trainer.train
    monkeypatch.setattr(trainer, "train", lambda cfg, out, **kw: calls.append(Path(out)) or real_train(cfg, out, **kw))
    assert be.main([*argv, "--resume"]) == 0
    assert calls == [tmp_path / "default" / "grpo" / "seed1"]  # only the missing cell ran
    for name, data in kept.items():
        if name != "default__grpo__seed1.json":
            assert (cells / name).read_bytes() == data
    results = json.loads((tmp_path / "results.json").read_text())
    arms = results["regimes"]["default"]["arms"]
    assert set(arms) == {"ppo_bootstrap", "grpo"} and all(a["seeds"] == [0, 1] for a in arms.values())
    counts = {arm: a["counts_per_seed"] for arm, a in arms.items()}
    assert counts["grpo"]["policy_steps"] == counts["ppo_bootstrap"]["policy_steps"] > 0  # equal compute
    assert counts["grpo"]["episodes"] == counts["ppo_bootstrap"]["episodes"] > 0
    assert counts["grpo"]["critic_steps"] == 0 < counts["ppo_bootstrap"]["critic_steps"]
    assert "ppo_bootstrap - grpo" in results["regimes"]["default"]["paired"]
    assert "MDE80" in (tmp_path / "results.md").read_text()

    # SFT_FROM: long_noisy's SFT continues default's SFT model on long_noisy's own episodes (a second
    # phase alone), and its arms start from that
    calls.clear()
    assert be.main(["--smoke", "--regimes", "long_noisy", "--arms", "grpo", "--seeds", "1", "--jobs", "1",
                    "--out", str(tmp_path), "--resume"]) == 0
    sft = json.loads((cells / "long_noisy__sft.json").read_text())
    assert sft["model"] == str(tmp_path / "long_noisy" / "sft" / "sft_model") and sft["episodes"]
    assert calls == [tmp_path / "long_noisy" / "sft", tmp_path / "long_noisy" / "grpo" / "seed0"]
    sft_cfg = json.loads((tmp_path / "long_noisy" / "sft" / "config.json").read_text())
    assert sft_cfg["model"]["pretrained"] == json.loads((cells / "default__sft.json").read_text())["model"]
    assert (sft_cfg["sft"]["steps"], sft_cfg["sft"]["copy_steps"]) == (0, 0) and sft_cfg["env"]["difficulty"] == "long_noisy"
    assert sft["rows"][0]["sft/second_final_nll"] > 0 and "sft/final_nll" not in sft["rows"][0]
    cell = json.loads((cells / "long_noisy__grpo__seed0.json").read_text())
    assert json.loads((tmp_path / "long_noisy" / "grpo" / "seed0" / "config.json").read_text())["model"]["pretrained"] \
        == sft["model"] and cell["regime"] == "long_noisy"
    assert cell["machine"] and cell["load_average"] >= 0  # cells of one experiment may come from several machines


def test_boundary_arms_differ_from_the_reference_recipe_only_where_named():
    from compactrl.training.config import preset

    ref = preset("compactionrl")
    base = be.regime_config("full", "default", threads=1)
    cfgs = {arm: be.arm_config(base, arm, seed=3, sft_model="m") for arm in be.ARMS}
    assert cfgs["ppo_bootstrap"].rl.lmbda == ref.rl.lmbda and cfgs["ppo_bootstrap"].rl.boundary == "bootstrap"
    assert cfgs["ppo_bootstrap_lambda095"].rl.lmbda == 0.95
    assert cfgs["ppo_cut"].rl.boundary == "cut" and cfgs["ppo_cut"].rl.lmbda == ref.rl.lmbda
    assert cfgs["grpo"].rl.algo == "grpo" and cfgs["frozen_summarizer"].rl.frozen_summarizer
    for cfg in cfgs.values():  # equal compute: the same policy-update budget for every arm
        assert (cfg.rl.iterations, cfg.rl.episodes_per_iter, cfg.rl.epochs, cfg.rl.minibatches) == \
            (base.rl.iterations, base.rl.episodes_per_iter, base.rl.epochs, base.rl.minibatches)
        assert cfg.seed == 3 and cfg.model.pretrained == "m" and not cfg.sft.enabled
    noisy = be.regime_config("full", "long_noisy", threads=1)
    assert noisy.env.difficulty == "long_noisy" and noisy.env.max_turns == 10
    # the same env as default but for the task preset (flaky runs) and the limits: one SFT model serves both
    assert noisy.env.context_budget.budget == base.env.context_budget.budget
    # its warm start: default's SFT model continued by the second SFT phase alone on long_noisy's episodes
    src, changes = be.SFT_FROM["long_noisy"]
    assert src == "default" and changes["sft.copy_steps"] == changes["sft.steps"] == 0 < noisy.sft.second_steps


def test_auc_is_mean_success_over_iterations():
    assert be.auc([[2, 0.5], [4, 1.0]], sft_success=0.0) == pytest.approx((0.5 + 1.5) / 4)
    assert be.auc([], sft_success=0.3) == 0.3


def test_long_chain_tasks_are_the_sft_models_top_quarter():
    episodes = [[seed, 0, traces] for seed, traces in enumerate([1, 2, 2, 3, 3, 3, 4, 5])]
    tasks, threshold = be.long_chain_tasks(episodes)
    assert threshold == 4 and tasks == {6, 7}


@given(d=st.lists(st.floats(-1, 1), min_size=3, max_size=12), shift=st.floats(-0.5, 0.5))
def test_paired_difference_and_power(d, shift):
    b = [0.5] * len(d)
    a = [x + 0.5 for x in d]
    p = be.paired(a, b)
    assert p["n"] == len(d) and p["ci95"][0] <= p["mean_diff"] + 1e-9 <= p["ci95"][1] + 2e-9
    assert p["mde80"] >= p["ci95"][1] - p["mean_diff"] - 1e-9  # MDE exceeds the CI's half-width
    shifted = be.paired([x + shift for x in a], b)  # a constant shift moves the mean, not the power
    assert shifted["mean_diff"] == pytest.approx(p["mean_diff"] + shift, abs=1e-9)
    assert shifted["mde80"] == pytest.approx(p["mde80"], abs=1e-9)


def test_counts_follow_the_rows_that_updated():
    from compactrl.training.config import override

    cfg = override(be.regime_config("full", "default", threads=1), {"rl.epochs": 2, "rl.minibatches": 2,
                                                                   "rl.critic_updates": 2, "rl.critic_pretrain_steps": 5})
    rows = [{"iteration": 0, "pretrain/batches": 1.0},
            {"iteration": 1, "train/episodes": 16.0, "train/traces_per_episode": 2.0, "train/generated_tokens_per_episode": 10.0,
             "policy/grad_norm": 1.0, "critic/grad_norm": 1.0},
            {"iteration": 2, "train/episodes": 1.0, "train/traces_per_episode": 1.0, "train/generated_tokens_per_episode": 4.0,
             "critic/grad_norm": 1.0}]  # one trace: one minibatch; no policy step
    counts = be.compute_counts(cfg, rows)
    assert counts == {"episodes": 17.0, "critic_pretrain_episodes": 16.0, "policy_steps": 4.0,
                      "critic_steps": 5.0 + 8.0 + 4.0, "generated_tokens": 164.0}
