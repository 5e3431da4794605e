"""The mismatch, asynchronous-rollout and summariser wall-clock experiments' statistics, on cells whose
figures are known (benchmarks/mismatch_experiment.py, async_rollouts_bench.py, summariser_wallclock.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import async_rollouts_bench as ab  # noqa: E402
import boundary_experiment as be  # noqa: E402
import mismatch_experiment as me  # noqa: E402
import summariser_wallclock as sw  # noqa: E402


def _episodes(successes: int, n: int = 8, latencies=()):
    return [[i, int(i < successes), 2, list(latencies)] for i in range(n)]


def test_iteration_means_skip_iteration_zero_and_missing_figures():
    rows = [{"iteration": 0, "mismatch/k3": 9.0}, {"iteration": 1, "mismatch/k3": 1.0, "time/iteration_s": 4.0},
            {"iteration": 2, "mismatch/k3": 3.0, "policy/tis_clip_fraction": 0.5}]
    assert be.iteration_means(rows, "mismatch/", be.MISMATCH_KEYS) == {"mismatch/k3": 2.0,
                                                                      "policy/tis_clip_fraction": 0.5}
    assert be.iteration_means(rows, "time/") == {"time/iteration_s": 4.0}


def test_mismatch_arms_pair_over_the_seeds_both_finished():
    cells = [{"arm": arm, "seed": s, "episodes": _episodes(succ), "wall_clock_s": 60.0, "cpu_s": 30.0,
              "mismatch": {"mismatch/k3": k3, "mismatch/route_disagree_all": 0.1}}
             for arm, seeds, succ, k3 in (("none", (0, 1, 2), 2, 1e-4), ("tis", (0, 1), 4, 2e-4))
             for s in seeds]
    arms = me.summarize(cells)
    assert arms["none"]["final"]["mean"] == 0.25 and arms["tis"]["final"]["mean"] == 0.5
    assert arms["none"]["mismatch"]["mismatch/k3"]["mean"] == pytest.approx(1e-4)
    assert "policy/tis_clip_fraction" not in arms["none"]["mismatch"]  # only figures every cell has
    pairs = me.paired(arms)
    assert set(pairs) == {"tis - none"} and pairs["tis - none"]["n"] == 2
    assert pairs["tis - none"]["mean_diff"] == pytest.approx(0.25)
    text = me.markdown({"sampler_line": "x", "sft_success": 0.1, "config_summary": "y", "arms": arms,
                        "paired": pairs, "command": "c", "machine": "m", "load_average": "1"})
    assert "| tis - none (n=2) | +0.250" in text


def test_the_vllm_sampler_falls_back_to_its_own_cache_where_vllm_refuses_fp8(monkeypatch):
    from compactrl.serving.vllm import client

    monkeypatch.setattr(client, "fp8_kv_refusal", lambda config: "no AVX-512 here")
    changes, line = me.sampler_changes("vllm")
    assert changes["rollout.kv_cache_dtype"] == "auto" and "no AVX-512 here" in line
    monkeypatch.setattr(client, "fp8_kv_refusal", lambda config: None)
    changes, line = me.sampler_changes("vllm")
    assert changes["rollout.kv_cache_dtype"] == "fp8" and changes["rollout.engine_dtype"] == "bfloat16"


def test_async_arms_compare_each_seeds_iteration_time_with_its_synchronous_run():
    cells = [{"arm": f"k{k}", "seed": s, "episodes": _episodes(3), "wall_clock_s": 100.0,
              "timing": {"time/iteration_s": base * (1.0 - 0.2 * k), "time/collect_s": 1.0}}
             for k in (0, 1, 2) for s, base in ((0, 10.0), (1, 20.0))]
    arms = ab.summarize(cells)
    assert arms["k0"]["iteration_s_ratio_to_k0"]["mean"] == pytest.approx(1.0)
    assert arms["k1"]["iteration_s_ratio_to_k0"]["mean"] == pytest.approx(0.8)  # per seed, not of the means
    assert arms["k2"]["times"]["time/iteration_s"]["mean"] == pytest.approx(9.0)
    assert arms["k2"]["times"]["train/stale_dropped"]["mean"] == 0.0  # a figure a cell lacks counts as 0
    assert set(ab.paired_success(arms)) == {"k1 - k0", "k2 - k0"}


def test_wall_clock_per_solved_task_and_latency_quantiles():
    solved = {"arm": "learned", "seed": 0, "episodes": _episodes(4, latencies=(0.1, 0.3)), "final_eval_s": 20.0,
              "timing": {"time/iteration_s": 7.0}, "train_summary_time_share": 0.3}
    figs = sw.cell_figures(solved)
    assert figs["eval_s_per_solved"] == 5.0 and figs["success"] == 0.5
    assert figs["summary_latency_p50_s"] == 0.1 and figs["summary_latency_p90_s"] == 0.3
    assert figs["summary_calls_per_episode"] == 2.0
    none = {**solved, "arm": "frozen", "episodes": _episodes(0)}
    assert math.isinf(sw.cell_figures(none)["eval_s_per_solved"])
    arms = sw.summarize([solved, none])
    assert "eval_s_per_solved" not in arms["frozen"]  # no interval over an unsolved seed
    assert "eval_s_per_solved" not in arms["paired"] and arms["paired"]["success"]["mean_diff"] == 0.5
    assert sw.train_share([{"iteration": 0, "time/summary_s": 9.0}, {"iteration": 1, "time/summary_s": 1.0,
                                                                      "time/generate_s": 3.0}]) == 0.25


def test_the_provenance_names_each_cells_machine_when_several_ran_them():
    cells = [{"arm": "none", "seed": 1, "machine": "B"}, {"arm": "tis", "seed": 0},
             {"arm": "none", "seed": 0, "machine": "B"}]
    machines = be.cell_machines(cells)
    assert machines == {"B": ["none seed0", "none seed1"], "unrecorded": ["tis seed0"]}
    one = {"command": "c", "machine": "m", "load_average": "1"}
    assert "Cells ran on" not in be.provenance_line({**one, "cell_machines": {"B": ["none seed0"]}})
    assert be.provenance_line({**one, "cell_machines": machines}).endswith(
        "Cells ran on: B (none seed0, none seed1); unrecorded (tis seed0).")
