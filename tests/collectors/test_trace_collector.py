"""TraceCollector: batching, grouping, failure handling, consistency with the env's traces."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from collector_fakes import EchoPolicy, FakeTraceEnv
from hypothesis import given
from hypothesis import strategies as st

from compactrl.collectors import TraceCollector

pytestmark = pytest.mark.timeout(60)


def _collector(n_envs=3, envs=None, **kw):
    envs = envs if envs is not None else [FakeTraceEnv() for _ in range(n_envs)]
    kw.setdefault("episodes_per_batch", 4)
    return TraceCollector([lambda e=e: e for e in envs], EchoPolicy(), **kw), envs


def test_one_act_call_per_round_batches_all_waiting_envs():
    envs = [FakeTraceEnv(num_traces=1, steps_per_trace=3) for _ in range(4)]
    col, _ = _collector(envs=envs, episodes_per_batch=4)
    batch = col.next()
    # 4 envs, 4 episodes of 3 steps each, all in lock-step: exactly 3 calls of batch 4
    assert col.policy.calls == [4, 4, 4]
    assert batch.batch_size == torch.Size([4])


def test_episode_count_and_row_layout():
    col, _ = _collector(n_envs=3, episodes_per_batch=5)
    batch = col.next()
    stats = col.last_episode_stats
    assert len(stats) == 5
    assert batch.batch_size[0] == sum(s.num_traces for s in stats) == 10
    for eid in batch["episode_id"].unique():
        rows = batch["episode_id"] == eid
        assert batch["trace_index"][rows].tolist() == list(range(int(rows.sum())))
        assert set(batch["num_traces"][rows].tolist()) == {int(rows.sum())}


def test_batch_matches_the_traces_the_env_emitted():
    envs = [FakeTraceEnv(num_traces=3, steps_per_trace=2) for _ in range(2)]
    col, _ = _collector(envs=envs, episodes_per_batch=4)
    batch = col.next()
    emitted = {k: tr for e in envs for k, tr in e.emitted_by_key.items()}
    assert batch.batch_size[0] == len(emitted)
    seed_of = {s.episode_id: s.task_seed for s in col.last_episode_stats}
    for i in range(batch.batch_size[0]):
        tr = emitted[(seed_of[int(batch["episode_id"][i])], int(batch["trace_index"][i]))]
        n = len(tr)
        assert batch["attention_mask"][i].sum().item() == n
        assert batch["tokens"][i, :n].tolist() == tr.token_ids
        assert batch["policy_mask"][i, :n].tolist() == tr.policy_mask
        assert batch["summary_mask"][i, :n].tolist() == tr.summary_mask
        assert not batch["policy_mask"][i, n:].any()
    # rewards: 1.0 per even task seed episode, at the last trace
    for s in col.last_episode_stats:
        rows = batch["episode_id"] == s.episode_id
        assert batch["reward"][rows].sum().item() == s.reward == (1.0 if s.task_seed % 2 == 0 else 0.0)
        assert s.success == (s.reward > 0)
        assert s.compactions == 2 and s.num_traces == 3 and s.terminated and not s.truncated


def test_groups_share_task_seed_and_group_id():
    col, _ = _collector(n_envs=3, episodes_per_batch=6, group_size=3)
    batch = col.next()
    stats = col.last_episode_stats
    groups = {}
    for s in stats:
        groups.setdefault(s.group_id, set()).add(s.task_seed)
    assert len(groups) == 2 and all(len(seeds) == 1 for seeds in groups.values())
    assert [len([s for s in stats if s.group_id == g]) for g in groups] == [3, 3]
    for s in stats:
        assert set(batch["group_id"][batch["episode_id"] == s.episode_id].tolist()) == {s.group_id}


def test_episodes_per_batch_must_be_multiple_of_group_size():
    with pytest.raises(ValueError, match="episodes_per_batch"):
        _collector(episodes_per_batch=5, group_size=2)
    with pytest.raises(ValueError, match="exactly one"):
        _collector(episodes_per_batch=None)


def test_tokens_per_batch_closes_after_enough_tokens():
    col, _ = _collector(n_envs=2, episodes_per_batch=None, tokens_per_batch=60)
    batch = col.next()
    assert batch["attention_mask"].sum().item() >= 60
    # lazy planning: at most one wave of episodes beyond the one that crossed the target
    per_episode = batch["attention_mask"].sum().item() / len(col.last_episode_stats)
    assert batch["attention_mask"].sum().item() < 60 + 2 * per_episode + 1


def test_sandbox_error_truncates_episode_and_collection_goes_on():
    bad = FakeTraceEnv(num_traces=2, fail_step=1, fail_mode="sandbox_error")
    envs = [bad, FakeTraceEnv(num_traces=2)]
    col, _ = _collector(envs=envs, episodes_per_batch=6)
    batch = col.next()
    stats = col.last_episode_stats
    assert len(stats) == 6
    failed = [s for s in stats if s.sandbox_error]
    assert failed and all(s.truncated and not s.terminated and not s.success for s in failed)
    for s in failed:  # the truncated episode's finished trace is in the batch, marked truncated
        rows = batch["episode_id"] == s.episode_id
        assert rows.any() and batch["truncated"][rows].all()
    assert bad.closed  # a failed sandbox is closed, and a fresh env would be built by env_fn


def test_exception_in_step_ends_episode_keeps_finished_traces():
    calls = {"n": 0}

    def make():
        calls["n"] += 1
        return FakeTraceEnv(num_traces=2, steps_per_trace=2, fail_step=2 if calls["n"] == 1 else None)

    col = TraceCollector([make], EchoPolicy(), episodes_per_batch=3)
    batch = col.next()
    stats = col.last_episode_stats
    assert len(stats) == 3 and calls["n"] == 2  # rebuilt once after the failure
    first = stats[0]
    assert first.truncated and "container vanished" in first.sandbox_error
    assert first.num_traces == 1  # the trace finished before the failure is kept
    assert (batch["episode_id"] == first.episode_id).sum() == 1
    assert all(not s.truncated for s in stats[1:])


def test_exception_in_reset_is_survived():
    calls = {"n": 0}

    def make():
        calls["n"] += 1
        return FakeTraceEnv(fail_reset=calls["n"] == 1)

    col = TraceCollector([make], EchoPolicy(), episodes_per_batch=2)
    col.next()
    stats = col.last_episode_stats
    assert stats[0].truncated and stats[0].num_traces == 0 and "could not start" in stats[0].sandbox_error
    assert len(stats) == 2


def test_always_failing_envs_raise_clear_error():
    col = TraceCollector([lambda: FakeTraceEnv(fail_reset=True)], EchoPolicy(), episodes_per_batch=1)
    with pytest.raises(RuntimeError, match="without a finished trace"):
        col.next()


def test_iteration_total_batches_seeding_and_state():
    col, _ = _collector(n_envs=2, episodes_per_batch=2, total_batches=3, seed=5)
    batches = list(col)
    assert len(batches) == 3 == len(col)
    ids = torch.cat([b["episode_id"].unique() for b in batches])
    assert len(ids.unique()) == 6  # episode ids never repeat across batches
    col2, _ = _collector(n_envs=2, episodes_per_batch=2, total_batches=3, seed=5)
    seeds1 = [s.task_seed for s in col.last_episode_stats]
    list(col2)
    assert seeds1 == [s.task_seed for s in col2.last_episode_stats]
    # state_dict round trip continues the same task stream
    col3, _ = _collector(n_envs=2, episodes_per_batch=2, seed=5)
    col3.next()
    state = col3.state_dict()
    a = (col3.next(), [s.task_seed for s in col3.last_episode_stats])
    col4, _ = _collector(n_envs=2, episodes_per_batch=2, seed=99)
    col4.load_state_dict(state)
    b = (col4.next(), [s.task_seed for s in col4.last_episode_stats])
    assert a[1] == b[1] and a[0]["episode_id"].tolist() == b[0]["episode_id"].tolist()


def test_replay_buffer_is_extended_and_iterator_yields_none():
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    rb = ReplayBuffer(storage=LazyTensorStorage(100))
    col, _ = _collector(n_envs=2, episodes_per_batch=2, total_batches=2, replay_buffer=rb)
    out = list(col)
    assert out == [None, None]
    assert len(rb) == 8  # 2 batches x 2 episodes x 2 traces


def test_generation_time_is_split_between_summaries_and_other_responses():
    col, _ = _collector(n_envs=2, episodes_per_batch=2)
    col.next()
    for s in col.last_episode_stats:
        assert s.summary_gen_time_s > 0 and s.other_gen_time_s > 0
        assert s.summary_tokens > 0 and s.generated_tokens > s.summary_tokens
    agg = col.last_batch_stats
    assert 0 < agg["summary_token_share"] < 1 and 0 < agg["summary_time_share"] < 1


def test_update_policy_weights_calls_engine_hook():
    class Remote(EchoPolicy):
        def update_weights(self, weights, **kw):
            self.pushed = weights

    col = TraceCollector([FakeTraceEnv], Remote(), episodes_per_batch=1)
    col.update_policy_weights_({"w": 1})
    assert col.policy.pushed == {"w": 1}
    in_process = EchoPolicy()  # no hook: it shares the trained module, so nothing is pushed or changed
    before = repr(vars(in_process))
    TraceCollector([FakeTraceEnv], in_process, episodes_per_batch=1).update_policy_weights_({"w": 1})
    assert repr(vars(in_process)) == before


@given(
    n_envs=st.integers(1, 4),
    groups=st.integers(1, 3),
    group_size=st.integers(1, 3),
    traces=st.lists(st.integers(1, 4), min_size=1, max_size=5),
)
def test_property_whole_episodes_whole_groups(n_envs, groups, group_size, traces):
    envs = [FakeTraceEnv(num_traces_fn=lambda s, t=traces: t[s % len(t)]) for _ in range(n_envs)]
    col = TraceCollector([lambda e=e: e for e in envs], EchoPolicy(), episodes_per_batch=groups * group_size,
                         group_size=group_size, seed=3)
    batch = col.next()
    stats = col.last_episode_stats
    assert len(stats) == groups * group_size
    assert batch.batch_size[0] == sum(s.num_traces for s in stats) == len([t for e in envs for t in e.emitted])
    for s in stats:
        rows = batch["episode_id"] == s.episode_id
        assert int(rows.sum()) == s.num_traces
        assert batch["policy_mask"][rows].sum().item() == s.generated_tokens
        assert batch["summary_mask"][rows].sum().item() == s.summary_tokens
    assert sorted({s.group_id for s in stats}) == sorted({int(g) for g in batch["group_id"]})


def test_configuration_errors_propagate_instead_of_being_survived():
    class BadConfigEnv(FakeTraceEnv):
        def reset(self, *, seed=None, options=None):
            raise ValueError("budget: expected at least 718 tokens, got 512")

    col = TraceCollector([BadConfigEnv], EchoPolicy(), episodes_per_batch=2)
    with pytest.raises(ValueError, match="budget"):
        col.next()


def test_collect_runs_each_entry_once_in_order_with_its_options():
    class OptionEnv(FakeTraceEnv):
        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(seed=seed, options=options)
            self.task = options["task"]
            return obs, {**info, "task_id": options["task"]}

    col = TraceCollector([OptionEnv, OptionEnv], EchoPolicy(), episodes_per_batch=1, reset_options={"shared": 1})
    batch = col.collect([{"task": f"t{i}"} for i in range(5)])
    stats = col.last_episode_stats
    assert [s.task_id for s in stats] == [f"t{i}" for i in range(5)]
    assert len({s.group_id for s in stats}) == 5 and batch.batch_size[0] == sum(s.num_traces for s in stats)


def test_collect_records_a_task_the_env_rejects_and_goes_on():
    class PickyEnv(FakeTraceEnv):
        def reset(self, *, seed=None, options=None):
            if options["task"] == "bad-reset":
                raise ValueError("backend cannot run task bad-reset")
            return super().reset(seed=seed, options=options)

        def step(self, action):
            if self.steps == 1 and self.task_seed == self.bad_step_seed:
                raise ValueError("judge cannot grade this task")
            return super().step(action)

    env = PickyEnv()
    col = TraceCollector([lambda: env], EchoPolicy(), episodes_per_batch=1, seed=0)
    seeds = np.random.default_rng(0).integers(0, 2**31 - 1, size=3)
    env.bad_step_seed = int(seeds[2])  # the third entry's task seed
    col.collect([{"task": "ok"}, {"task": "bad-reset"}, {"task": "bad-step"}])
    ok, bad_reset, bad_step = col.last_episode_stats
    assert ok.sandbox_error is None and ok.num_traces == 2
    assert "bad-reset" in bad_reset.sandbox_error and bad_reset.num_traces == 0 and bad_reset.truncated
    assert "grade" in bad_step.sandbox_error and bad_step.truncated
    # the same errors outside a fixed list are configuration errors
    with pytest.raises(ValueError, match="bad-reset"):
        TraceCollector([PickyEnv], EchoPolicy(), episodes_per_batch=1,
                       reset_options={"task": "bad-reset"}).next()


def test_collect_with_no_trace_at_all_returns_none():
    col = TraceCollector([lambda: FakeTraceEnv(fail_reset=True)], EchoPolicy(), episodes_per_batch=1)
    assert col.collect([{}, {}]) is None
    assert [s.truncated for s in col.last_episode_stats] == [True, True]


def test_a_constructor_config_error_propagates_from_collect():
    def broken():
        raise ValueError("backend: expected sim, local or docker")

    with pytest.raises(ValueError, match="backend"):
        TraceCollector([broken], EchoPolicy(), episodes_per_batch=1).collect([{}])


def test_final_info_scalars_are_kept_and_averaged_under_one_name():
    class InfoEnv(FakeTraceEnv):
        def step(self, action):
            obs, r, term, trunc, info = super().step(action)
            if term or trunc:
                info = {**info, "format_errors": self.task_seed % 2, "test_summary": "2 passed", "num_traces": 99,
                        "nan_figure": float("nan"), "trace_list": [1]}
            return obs, r, term, trunc, info

    col = TraceCollector([InfoEnv], EchoPolicy(), episodes_per_batch=4, seed=1)
    col.next()
    stats = col.last_episode_stats
    assert all(s.info == {"format_errors": s.task_seed % 2, "test_summary": "2 passed"} for s in stats)
    assert col.last_batch_stats["format_errors_per_episode"] == sum(s.task_seed % 2 for s in stats) / 4
    assert "num_traces_per_episode" not in col.last_batch_stats  # a field's figure is not repeated


def test_only_info_trace_is_read():
    class TwoKeysEnv(FakeTraceEnv):
        def step(self, action):
            obs, r, term, trunc, info = super().step(action)
            if info.get("trace") is not None:
                info = {**info, "traces": [info["trace"], info["trace"]]}
            return obs, r, term, trunc, info

    col = TraceCollector([TwoKeysEnv], EchoPolicy(), episodes_per_batch=1)
    batch = col.next()
    assert batch.batch_size[0] == col.last_episode_stats[0].num_traces == 2


@given(n_envs=st.integers(1, 4), traces=st.lists(st.integers(1, 4), min_size=0, max_size=7))
def test_property_collect_runs_every_entry_once_in_order(n_envs, traces):
    class PerTaskEnv(FakeTraceEnv):
        def reset(self, *, seed=None, options=None):
            self.num_traces = options["traces"]
            obs, info = super().reset(seed=seed, options=options)
            self.task = options["name"]
            return obs, {**info, "task_id": options["name"]}

    col = TraceCollector([PerTaskEnv] * n_envs, EchoPolicy(), episodes_per_batch=1)
    batch = col.collect([{"name": f"task-{i}", "traces": k} for i, k in enumerate(traces)])
    stats = col.last_episode_stats
    assert [s.task_id for s in stats] == [f"task-{i}" for i in range(len(traces))]
    assert [s.num_traces for s in stats] == traces
    assert (batch is None) == (not traces) and (batch is None or batch.batch_size[0] == sum(traces))
