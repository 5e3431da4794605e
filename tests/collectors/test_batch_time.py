"""Where a batch's collection time goes (``TraceCollector.last_batch_time``): measured per round, never
counting a round twice, with summaries apart."""

from __future__ import annotations

import time

import pytest
from collector_fakes import EchoPolicy, FakeTraceEnv
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.collectors import TraceCollector
from compactrl.collectors.episodes import episode_time_totals
from compactrl.collectors.trace_collector import BATCH_TIME_KEYS

pytestmark = pytest.mark.timeout(60)


class SlowEnv(FakeTraceEnv):
    """Every step takes a little while, so env time is measurably positive."""

    def step(self, action):
        time.sleep(0.001)
        return super().step(action)


def _collect(num_traces: int, n_envs: int, episodes: int, fail_step=None) -> TraceCollector:
    # a sandbox failure still hands over the trace in progress, so no batch ends up without one
    envs = [SlowEnv(num_traces=num_traces, fail_step=fail_step, fail_mode="sandbox_error") for _ in range(n_envs)]
    col = TraceCollector([lambda e=e: e for e in envs], EchoPolicy(), episodes_per_batch=episodes)
    col.next()
    return col


@settings(max_examples=12, deadline=None)
@given(num_traces=st.integers(1, 3), n_envs=st.integers(1, 3), episodes=st.integers(1, 5),
       fail_step=st.none() | st.integers(0, 4))
def test_batch_time_is_the_episodes_shares_summed_and_fits_in_the_collection(num_traces, n_envs, episodes, fail_step):
    t0 = time.perf_counter()
    col = _collect(num_traces, n_envs, episodes, fail_step)
    wall = time.perf_counter() - t0
    spent = col.last_batch_time
    assert set(spent) == set(BATCH_TIME_KEYS) and all(v >= 0 for v in spent.values())
    # one process, one env stepped at a time, each act call shared out: the episodes' sums are the batch's
    assert spent == pytest.approx(episode_time_totals(col.last_episode_stats), rel=1e-9, abs=1e-12)
    assert sum(spent.values()) <= wall  # unlike the episodes' overlapping wall-clock times
    assert spent["env_s"] > 0 and spent["generate_s"] > 0
    compacted = sum(s.compactions for s in col.last_episode_stats)
    assert spent["summary_s"] > 0 or compacted == 0
    if fail_step is None:  # a summary the sandbox failed under was generated, not counted as a compaction
        assert (spent["summary_s"] > 0) == (compacted > 0) == (num_traces > 1)


def test_each_batch_starts_its_own_count():
    col = _collect(2, 2, 2)
    col.next()  # the second batch: its own episodes' times, not the two batches' together
    assert col.last_batch_time == pytest.approx(episode_time_totals(col.last_episode_stats), rel=1e-9)


@settings(max_examples=10, deadline=None)
@given(num_traces=st.integers(1, 3), n_envs=st.integers(1, 3), episodes=st.integers(1, 4))
def test_each_summary_call_records_the_round_it_waited_for(num_traces, n_envs, episodes):
    """A summary call's latency is its whole round's wall-clock: at least its token share, one per summary
    request; the batch's quantiles are ordered and name as many calls."""
    from compactrl.collectors.episodes import latency_quantiles, summarize_episodes

    col = _collect(num_traces, n_envs, episodes)
    stats = col.last_episode_stats
    for s in stats:
        assert len(s.summary_latencies_s) == s.compactions  # no failure here: every summary call compacted
        assert sum(s.summary_latencies_s) >= s.summary_gen_time_s - 1e-12
    agg = summarize_episodes(stats)
    calls = sum(s.compactions for s in stats)
    if calls == 0:
        assert "summary_calls" not in agg
    else:
        assert agg["summary_calls"] == calls
        assert 0 <= agg["summary_latency_p50_s"] <= agg["summary_latency_p90_s"] <= agg["summary_latency_max_s"]
    assert latency_quantiles([3.0, 1.0, 2.0, 4.0]) == {"summary_calls": 4.0, "summary_latency_p50_s": 2.0,
                                                       "summary_latency_p90_s": 4.0, "summary_latency_max_s": 4.0}
