"""The thesis experiment's arms and sample-efficiency measure (benchmarks/boundary_experiment.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import boundary_experiment as be  # noqa: E402


def test_episodes_to_threshold_first_crossing_and_censoring():
    prog = [[1, 16.0, 4000.0], [2, 32.0, 8100.0], [3, 48.0, 12000.0], [4, 64.0, 16500.0]]
    assert be.to_threshold([[1, 0.2], [2, 0.45], [3, 0.3], [4, 0.5]], prog, 0.4) == (32.0, 8100.0, True)
    assert be.to_threshold([[1, 0.2], [2, 0.3]], prog, 0.4) == (64.0, 16500.0, False)  # censored at the budget
    assert be.progress([{"iteration": 0, "train/episodes": 5.0},
                        {"iteration": 2, "train/episodes": 16.0, "train/generated_tokens_per_episode": 10.0},
                        {"iteration": 1, "train/episodes": 16.0, "train/generated_tokens_per_episode": 20.0}]) == \
        [[1, 16.0, 320.0], [2, 32.0, 480.0]]


def test_the_thesis_arms_differ_from_grpo_only_where_named():
    base = be.regime_config("full", "variable_chain", threads=1)
    cfgs = {arm: be.arm_config(base, arm, seed=1, sft_model="m") for arm in be.THESIS["arms"].split(",")}
    grpo, split, dr = cfgs["grpo"].rl, cfgs["grpo_split"].rl, cfgs["dr_grpo"].rl
    assert grpo.grpo.trace_advantage == "broadcast" and grpo.grpo.scale_by_std and grpo.whiten_advantages
    assert split.grpo.trace_advantage == "split" and split.grpo.scale_by_std and split.whiten_advantages
    assert dr.grpo.trace_advantage == "broadcast" and not dr.grpo.scale_by_std and not dr.whiten_advantages
    assert dr.grpo.normalization == grpo.grpo.normalization == "token"
    for cfg in cfgs.values():  # equal compute and one start
        assert (cfg.rl.iterations, cfg.rl.episodes_per_iter, cfg.rl.epochs, cfg.rl.minibatches) == \
            (base.rl.iterations, base.rl.episodes_per_iter, base.rl.epochs, base.rl.minibatches)
        assert cfg.model.pretrained == "m" and '"variable_chain"' in cfg.env.env_kwargs
    assert cfgs["ppo_cut"].rl.boundary == "cut" and cfgs["ppo_bootstrap"].rl.boundary == "bootstrap"
    src, changes = be.SFT_FROM["variable_chain"]
    assert (Path(__file__).resolve().parents[2] / src / "config.json").exists() and changes["sft.steps"] == 0


@pytest.mark.parametrize("argv, regimes, arms", [
    ([], list(be.BOUNDARY_REGIMES), list(be.BOUNDARY_ARMS)),
    (["--thesis"], ["variable_chain"], be.THESIS["arms"].split(",")),
])
def test_the_default_selection_keeps_the_boundary_experiment(argv, regimes, arms, tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr(be, "_spread", lambda r, out, groups, extra: seen.update(regimes=r) or 0)
    assert be.main([*argv, "--spread", "1", "--out", str(tmp_path)]) == 0
    assert seen["regimes"] == regimes and set(arms) <= set(be.ARMS)
