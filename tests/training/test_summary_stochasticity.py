"""benchmarks/summary_stochasticity.py: N summaries at one context, and the episode replayed from each."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import summary_stochasticity as ss  # noqa: E402

from compactrl.types import PolicyRequest, TokenResponse  # noqa: E402

pytestmark = pytest.mark.timeout(180)


class _Task:
    def __init__(self, tid: str) -> None:
        self.id, self.metadata = tid, {}


class _Echo:
    """A greedy stand-in that answers every request with ``greedy``."""

    def act(self, requests):
        return [TokenResponse("greedy", [1]) for _ in requests]


def _req(tid: str, prompt, summary: bool) -> PolicyRequest:
    return PolicyRequest(messages=[], prompt_token_ids=prompt, compaction_required=summary, task=_Task(tid))


def test_replay_forces_sample_i_at_the_recorded_context_only():
    ctx = ss.Context("a", (5, 6), None, samples=[TokenResponse("s0", [7]), TokenResponse("s1", [8])])
    replay = ss._Replay(_Echo(), {"a": ctx, "b": ss.Context("b", (9,), None, samples=ctx.samples)}, 1)
    out = replay.act([_req("a", [5], False), _req("a", [5, 6], True), _req("b", [9, 9], True)])
    assert [str(o) for o in out] == ["greedy", "s1", "greedy"]
    assert replay.forced == {"a"} and replay.diverged == {"b"}  # b's prefix is not the recorded one
    later = replay.act([_req("a", [5, 6], True), _req("b", [9], True)])
    assert [str(o) for o in later] == ["greedy", "greedy"]  # only each episode's first summary is forced


def test_agreement_statistics():
    assert ss.jaccard(set(), set()) == 1.0 and ss.jaccard({"A"}, {"A", "B"}) == 0.5
    assert ss.fleiss_kappa(np.array([[3, 0], [0, 3], [3, 0]])) == pytest.approx(1.0)
    assert math.isnan(ss.fleiss_kappa(np.array([[3, 0], [3, 0]])))  # one category: undefined
    # by hand: P_i = (sum_j n_ij^2 - n) / (n (n - 1)) with n = 3 raters, P_e from the pooled shares
    counts = np.array([[2, 1], [1, 2], [3, 0], [0, 3]])
    p_bar = np.mean([(4 + 1 - 3) / 6, (1 + 4 - 3) / 6, 1.0, 1.0])
    p_e = 0.5**2 + 0.5**2
    assert ss.fleiss_kappa(counts) == pytest.approx((p_bar - p_e) / (1 - p_e))


def test_summarize_on_hand_built_contexts():
    rows = [
        {"task_id": "a", "lengths": [10, 30], "kept_keys": [["K"], ["K", "L"]], "keeps_fact": [True, True],
         "value_right": [True, False], "success": [True, False], "greedy_success": True},
        {"task_id": "b", "lengths": [20, 20], "kept_keys": [[], []], "keeps_fact": [False, False],
         "value_right": [False, False], "success": [False, None], "greedy_success": False},
    ]
    fig = ss.summarize(rows)
    assert fig["summary_tokens_cv"] == pytest.approx((10 / 20 + 0) / 2)
    assert fig["kept_keys_jaccard"] == pytest.approx((0.5 + 1.0) / 2)
    assert fig["keeps_fact_rate"] == 0.5 and fig["value_right_rate"] == 0.25
    assert fig["success_mean"] == pytest.approx(1 / 3) and fig["success_greedy_summary"] == 0.5
    assert fig["contexts_mixed_outcome"] == 0.5 and fig["replays_diverged"] == 1.0
    assert fig["success_within_sd"] == pytest.approx(0.25)
    assert fig["success_within_share"] == pytest.approx(((0.25 + 0) / 2) / (2 / 9))
    assert fig["success_if_kept"] == 0.5 and fig["success_if_dropped"] == 0.0


def test_command_writes_strict_json_for_a_tiny_random_model(tmp_path):
    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.tokenizer import load_tokenizer

    model = tmp_path / "m"
    tiny_moe("glm4_moe", hidden_size=32, num_layers=1, num_experts=2, experts_per_token=1).save_pretrained(model)
    load_tokenizer().save_pretrained(model)
    out = tmp_path / "s.json"
    # a budget just above the smallest the wrapper accepts, so that a random model's turns force a summary
    assert ss.main([str(model), "--preset", "smoke", "--contexts", "2", "--samples", "2", "--out", str(out),
                    "--set", "env.context_budget.budget=520", "--set", "env.max_turns=10"]) == 0

    def no_nan(token):
        raise AssertionError(f"{token} in the JSON")

    report = json.loads(out.read_text(), parse_constant=no_nan)
    assert report["samples"] == 2 and report["contexts"] >= 1
    assert report["replays_diverged"] == 0  # the greedy prefix replays token for token
    for row in report["per_context"]:
        assert len(row["lengths"]) == len(row["success"]) == 2
        assert all(0 < n <= 16 for n in row["lengths"])  # smoke preset: 16 new tokens at most
        assert all(isinstance(s, bool) for s in row["success"])
    for key in ("summary_tokens_cv", "kept_keys_jaccard", "success_mean", "success_within_sd"):
        assert report[key] is None or report[key] >= 0


def test_experiment_models_lists_each_regimes_sft_then_its_arms_first_seeds(tmp_path):
    for rel in ["default/sft/sft_model", "default/ppo_cut/seed0/final_model", "default/ppo_cut/seed1/final_model",
                "default/ppo_cut/seed2/final_model", "default/grpo/seed0", "noisy/sft/sft_model"]:
        (tmp_path / rel).mkdir(parents=True)
    found = [(r, a, s) for r, a, s, _ in ss.experiment_models(tmp_path, seeds=2)]
    # grpo seed0 has no final model yet (a running cell): left out; seed 2 is beyond --seeds
    assert found == [("default", "sft", None), ("default", "ppo_cut", 0), ("default", "ppo_cut", 1),
                     ("noisy", "sft", None)]


def test_experiment_models_gives_a_regime_the_sft_model_its_arms_started_from(tmp_path):
    """A regime whose arms start from another regime's SFT model (the experiment's ``SFT_FROM``):
    its ``cells/<regime>__sft.json`` names that model (here by the relative path the experiment ran with)."""
    for rel in ["default/sft/sft_model", "long/ppo_cut/seed0/final_model", "cells"]:
        (tmp_path / rel).mkdir(parents=True)
    (tmp_path / "cells" / "long__sft.json").write_text(json.dumps({"model": "runs/x/default/sft/sft_model"}))
    found = {(r, a): m for r, a, _, m in ss.experiment_models(tmp_path, seeds=1)}
    assert found[("long", "sft")] == tmp_path / "default" / "sft" / "sft_model"
    assert ("long", "ppo_cut") in found and "cells" not in {r for r, _ in found}


def test_experiment_table_gives_the_sft_value_and_each_arms_mean_and_sd_over_seeds():
    rep = {k: 0.5 for _, key, _ in ss.TABLE for k in (key if isinstance(key, tuple) else (key,))}
    reports = [("default", "sft", {**rep, "summary_tokens_cv": 0.1}),
               ("default", "ppo_cut", {**rep, "summary_tokens_cv": 0.2}),
               ("default", "ppo_cut", {**rep, "summary_tokens_cv": 0.4, "keeps_fact_kappa": math.nan})]
    table = ss.experiment_table(reports)
    cv_row = next(line for line in table.splitlines() if line.startswith("| length CV"))
    assert cv_row == "| length CV | 0.100 | 0.300 ± 0.141 |"
    kappa_row = next(line for line in table.splitlines() if line.startswith("| keep/drop kappa"))
    assert kappa_row == "| keep/drop kappa | 0.50 | 0.50 |"  # a NaN seed is left out, one value left
    assert "| figure | SFT (before RL) | ppo_cut (2) |" in table
