"""Where each RL iteration's wall-clock goes: the ``time/*`` split of every row, the report's section and
``plots/wall_clock.png`` (invariants, no timing thresholds)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactrl.collectors.episodes import EpisodeStats
from compactrl.training.config import override, preset
from compactrl.training.run_dir import TIME_COMPONENTS, WORKER_TIME, RunDir, plot_wall_clock, time_report
from compactrl.training.trainer import time_split, train

KEYS = [k for k, _ in TIME_COMPONENTS]

# smoke, and smoke with a budget just above the smallest the wrapper accepts and room for turns: summaries
NO_COMPACTION = {"env.context_budget.budget": 2048, "eval.episodes": 0}
COMPACTION = {"env.context_budget.budget": 520, "env.max_turns": 10, "eval.episodes": 0}


def _assert_split(row: dict) -> None:
    parts = [row[k] for k in KEYS]
    assert all(isinstance(v, float) and v >= 0 for v in parts), row
    assert math.fsum(parts) == pytest.approx(row["time/iteration_s"], rel=1e-9, abs=1e-9)
    old = row["time/collect_s"] + row["time/update_s"] + row["time/weight_sync_s"]  # the older names still hold
    assert old == pytest.approx(row["time/iteration_s"], rel=1e-9, abs=1e-9)
    assert row["time/learner_s"] == row["time/update_s"] and row["time/sync_s"] == row["time/weight_sync_s"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("compacting", [False, True], ids=["no_compaction", "compaction"])
def test_a_short_run_splits_every_iteration_and_reports_it(tmp_path, compacting):
    train(override(preset("smoke"), COMPACTION if compacting else NO_COMPACTION), tmp_path / "run")
    run = RunDir(tmp_path / "run")
    rows = run.rows()[1:]  # row 0 (SFT, critic pre-training) is no RL iteration
    assert len(rows) == 2
    for row in rows:
        _assert_split(row)
        # in-process, synchronous collection: generation and env stepping measured here, nothing waited for
        assert row["time/generate_s"] > 0 and row["time/env_s"] > 0 and row["time/learner_s"] > 0
        assert row["time/wait_s"] == 0 and not any(k in row for k, _ in WORKER_TIME)
        assert (row["time/summary_s"] > 0) == (row["train/compactions_per_episode"] > 0)
    assert any(r["train/compactions_per_episode"] > 0 for r in rows) == compacting
    report = (tmp_path / "run" / "report.md").read_text()
    section = report.split("## Where the time goes", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{k}`" in section for k in KEYS) and "of generation time" in section
    assert ("Summaries took 0.0% of generation time" in section) == (not compacting)
    png = tmp_path / "run" / "plots" / "wall_clock.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 0
    assert "![wall clock](plots/wall_clock.png)" in section
    # TensorBoard holds every row's numbers, the split included
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    assert set(KEYS) <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("time/summary_s")] == [1, 2]


def _remote(batch_stats: dict, episodes: list) -> SimpleNamespace:
    """A source whose episodes ran elsewhere (as the Ray collector): no ``last_batch_time``."""
    collector = SimpleNamespace(last_episode_stats=episodes, last_batch_stats=batch_stats)
    return SimpleNamespace(collector=collector, last_batch_stats=batch_stats)


seconds = st.floats(0, 100, allow_nan=False)


@given(collect=seconds, learner=seconds, sync=seconds, gen=seconds, summ=seconds, env=seconds,
       waited=st.none() | seconds)
def test_the_split_sums_to_the_iteration_and_is_never_negative(collect, learner, sync, gen, summ, env, waited):
    local = SimpleNamespace(collector=SimpleNamespace(
        last_batch_time={"generate_s": gen, "summary_s": summ, "env_s": env}), last_batch_stats={})
    episodes = [EpisodeStats(0, 0, 0, other_gen_time_s=gen, summary_gen_time_s=summ, env_time_s=env)] * 2
    remote = _remote({} if waited is None else {"wait_s": waited}, episodes)
    for source in (local, remote):
        split = time_split(source, collect_s=collect, learner_s=learner, sync_s=sync)
        assert all(split[k] >= 0 for k in KEYS)
        if source is remote or gen + summ + env <= collect:  # measured inside the collection, as they are
            assert math.fsum(split[k] for k in KEYS) == pytest.approx(collect + learner + sync, rel=1e-9, abs=1e-9)
    # episodes that ran elsewhere: the driver waited, their own (summed) times apart
    assert split["time/generate_s"] == split["time/summary_s"] == split["time/env_s"] == 0
    assert split["time/wait_s"] == (collect if waited is None else min(waited, collect))
    assert split["time/workers_generate_s"] == 2 * gen and split["time/workers_summary_s"] == 2 * summ
    assert split["time/workers_env_s"] == 2 * env


def test_report_and_plot_name_the_workers_time_and_skip_rows_without_a_split(tmp_path):
    old = [{"iteration": 0}, {"iteration": 1, "time/iteration_s": 1.0, "time/collect_s": 0.5}]
    assert time_report(old) == [] and plot_wall_clock(old, tmp_path / "a.png") is False
    assert not (tmp_path / "a.png").exists()
    row = {"iteration": 1, "time/iteration_s": 4.0, **dict.fromkeys(KEYS, 0.0), "time/wait_s": 3.0,
           "time/learner_s": 1.0, "time/workers_generate_s": 6.0, "time/workers_summary_s": 2.0,
           "time/workers_env_s": 1.0}
    text = "\n".join(time_report([{"iteration": 0}, row]))
    assert "| waiting for rollouts (`time/wait_s`) | 3 | 75.0% |" in text
    assert "Summaries took 25.0% of generation time (the rollout workers' own time)" in text
    assert "generation (actions) 6 s" in text
    assert plot_wall_clock([row], tmp_path / "b.png") and (tmp_path / "b.png").stat().st_size > 0
