"""The episode states both collectors share: a trace taken, an end by the env or by a failure, a slot freed."""

from __future__ import annotations

import pickle

from compactrl.collectors.episodes import (
    CONFIG_ERRORS,
    EnvSlot,
    Episode,
    EpisodePlan,
    EpisodeStats,
    final_info,
    summarize_episodes,
)
from compactrl.types import Trace


def _trace(summary: bool) -> Trace:
    return Trace([1, 2, 3, 4], [False, True, True, False], [False, summary, summary, False], [0.0] * 4, {},
                 ends_with_summary=summary)


def test_take_trace_counts_what_the_trace_holds() -> None:
    episode = Episode(EpisodeStats(episode_id=3, group_id=1, task_seed=7))
    episode.take_trace({"trace": _trace(True)})
    episode.take_trace({})  # a step that finished no trace
    episode.take_trace({"trace": _trace(False)})
    st = episode.stats
    assert len(episode.traces) == st.num_traces == 2
    assert (st.compactions, st.generated_tokens, st.summary_tokens, st.trace_tokens) == (1, 4, 2, 8)


def test_an_end_by_the_env_and_a_failed_end() -> None:
    done = Episode(EpisodeStats(0, 0, 0, reward=1.0))
    done.end({"success": False, "tests_passed": 3, "trace": "x", "ratio": float("nan")}, True, True)
    assert (done.stats.terminated, done.stats.truncated, done.stats.success) == (True, False, False)
    assert done.stats.info == {"tests_passed": 3}
    broken = Episode(EpisodeStats(1, 0, 0, reward=1.0))
    broken.end({"sandbox_error": "container vanished"}, True, False)
    assert (broken.stats.terminated, broken.stats.truncated, broken.stats.sandbox_error) == (
        False, True, "container vanished")
    failed = Episode(EpisodeStats(2, 0, 0, success=True), traces=[_trace(False)])
    failed.end_failed("RuntimeError: boom")
    assert (failed.stats.truncated, failed.stats.success, failed.stats.sandbox_error) == (True, False, "RuntimeError: boom")
    assert len(failed.traces) == 1  # what it finished is kept


def test_a_slot_frees_its_episode_and_closes_its_env_once() -> None:
    class Env:
        closes = 0

        def close(self) -> None:
            Env.closes += 1
            raise RuntimeError("already gone")  # logged, never raised

    slot = EnvSlot(env_fn=Env, env=Env(), obs="o", info={"k": 1}, episode=Episode(EpisodeStats(0, 0, 0)))
    episode = slot.finish()
    assert episode.stats.wall_clock_s >= 0.0 and (slot.episode, slot.obs, slot.info) == (None, None, {})
    slot.close_env()
    slot.close_env()
    assert slot.env is None and Env.closes == 1


def test_plans_travel_and_config_errors_are_named() -> None:
    plan = EpisodePlan(group_id=2, task_seed=11, options={"task": "t"})
    assert pickle.loads(pickle.dumps(plan)) == plan  # plans go to Ray workers
    assert CONFIG_ERRORS == (ValueError, TypeError)
    assert final_info({"a": 1, "b": [1], "compacted": True}) == {"a": 1}


def test_summaries_average_the_info_figures_under_one_name() -> None:
    stats = [EpisodeStats(0, 0, 0, success=True, info={"tests_passed": 2}), EpisodeStats(1, 0, 0, info={"steps": 9})]
    out = summarize_episodes(stats)
    assert out["success_rate"] == 0.5 and out["tests_passed_per_episode"] == 2.0
    assert out["steps_per_episode"] == 0.0  # the field's figure, not the info's
    assert summarize_episodes([]) == {}
