"""Critic diagnostics: trace-start values against the outcome, summary advantages, calibration."""

from __future__ import annotations

import math
from itertools import product

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from compactrl.algos.diagnostics import (
    calibration_plot,
    calibration_table,
    critic_diagnostics,
    diagnose,
    explained_variance,
    roc_auc,
)
from compactrl.collectors.batch import EpisodeMeta, stack_traces
from compactrl.types import Trace

pytestmark = pytest.mark.timeout(60)


def _trace(k: int, last: bool, outcome: float, step_reward: float = 0.0) -> Trace:
    """Prompt (3 tokens), a 2-token response with ``step_reward``, a tool output, then a 3-token
    summary (or, in the last trace, a 2-token answer that earns ``outcome``)."""
    pol = [False] * 3 + [True] * 2 + [False] * 2 + [True] * (2 if last else 3)
    summ = [False] * 7 + [not last] * (len(pol) - 7)
    rewards = {4: step_reward} if step_reward else {}
    if last:
        rewards[len(pol) - 1] = outcome
    return Trace(list(range(1, len(pol) + 1)), pol, summ, [-0.1 if p else math.nan for p in pol], rewards,
                 trace_index=k, episode_id=0, ends_with_summary=not last)


def _batch(outcomes, n_traces: int = 2, step_reward: float = 0.0):
    episodes = [
        (EpisodeMeta(e, e, True, False),
         [_trace(k, k == n_traces - 1, o, step_reward if k == 0 else 0.0) for k in range(n_traces)])
        for e, o in enumerate(outcomes)
    ]
    batch = stack_traces(episodes)
    batch.set("value", torch.full(batch["tokens"].shape, 7.0))  # only trace starts may be read
    return batch


def _set_starts(batch, values_by_episode_and_k):
    first = batch["policy_mask"].float().argmax(-1)
    for r in range(batch.shape[0]):
        e, k = int(batch["episode_id"][r]), int(batch["trace_index"][r])
        if (e, k) in values_by_episode_and_k:
            batch["value"][r, first[r]] = values_by_episode_and_k[(e, k)]
    return batch


OUTCOMES = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]


def _with_critic(fn, n_traces=2):
    batch = _batch(OUTCOMES, n_traces)
    return _set_starts(batch, {(e, k): fn(o) for (e, o), k in product(enumerate(OUTCOMES), range(1, n_traces))})


def test_perfect_critic_has_auc_one_and_explains_all_variance():
    m = critic_diagnostics(_with_critic(lambda o: o))
    assert m["critic/trace_start_auc"] == 1.0
    assert m["critic/trace_start_ev"] == pytest.approx(1.0)
    assert m["critic/trace_start_error"] == pytest.approx(0.0)
    assert m["critic/trace_starts"] == len(OUTCOMES)
    assert m["critic/trace_start_auc_k1"] == 1.0


def test_constant_critic_has_auc_half_and_explains_nothing():
    m = critic_diagnostics(_with_critic(lambda o: 0.3))
    assert m["critic/trace_start_auc"] == 0.5
    assert m["critic/trace_start_ev"] == pytest.approx(0.0)
    assert m["critic/trace_start_error"] == pytest.approx(0.3 - np.mean(OUTCOMES))


def test_anti_correlated_critic_has_auc_zero():
    m = critic_diagnostics(_with_critic(lambda o: 1.0 - o))
    assert m["critic/trace_start_auc"] == 0.0
    assert m["critic/trace_start_ev"] < 0


def test_each_trace_index_is_scored_on_its_own():
    batch = _batch(OUTCOMES, n_traces=3)
    starts = {}
    for e, o in enumerate(OUTCOMES):
        starts[(e, 1)], starts[(e, 2)] = o, 1.0 - o  # trace 1 perfect, trace 2 reversed
    m = critic_diagnostics(_set_starts(batch, starts))
    assert m["critic/trace_start_auc_k1"] == 1.0 and m["critic/trace_start_auc_k2"] == 0.0
    assert m["critic/trace_starts_k1"] == m["critic/trace_starts_k2"] == len(OUTCOMES)
    assert m["critic/trace_start_auc"] == pytest.approx(0.5)  # pooled: half the pairs right, half reversed


def test_ties_count_half():
    assert roc_auc(np.array([0.2, 0.5, 0.5, 0.9]), np.array([0, 1, 0, 1])) == pytest.approx(3.5 / 4)


@given(st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=2, max_size=30))
def test_auc_equals_the_pairwise_definition(pairs):
    score = np.array([s for s, _ in pairs], dtype=float)
    label = np.array([y for _, y in pairs])
    pos, neg = score[label], score[~label]
    if pos.size == 0 or neg.size == 0:
        assert math.isnan(roc_auc(score, label))
        return
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    assert roc_auc(score, label) == pytest.approx(wins / (pos.size * neg.size))


def test_explained_variance_is_against_the_reward_still_to_come():
    """A reward earned before the summary is not the next trace's to predict."""
    batch = _batch(OUTCOMES, step_reward=0.5)
    batch = _set_starts(batch, {(e, 1): o for e, o in enumerate(OUTCOMES)})
    assert critic_diagnostics(batch)["critic/trace_start_ev"] == pytest.approx(1.0)
    assert math.isnan(explained_variance(np.zeros(3), np.ones(3)))


def test_degenerate_batches_give_nan_with_a_reason():
    no_advantage = diagnose(_with_critic(lambda o: o))
    batch = _batch([1.0, 1.0, 1.0])
    d = diagnose(batch)
    assert math.isnan(d.metrics["critic/trace_start_auc"]) and "one class" in d.reasons["critic/trace_start_auc"]
    assert math.isnan(d.metrics["critic/trace_start_ev"]) and "does not vary" in d.reasons["critic/trace_start_ev"]
    assert math.isnan(no_advantage.metrics["critic/summary_abs_advantage"])
    assert "no advantage" in no_advantage.reasons["critic/summary_abs_advantage"]
    single = diagnose(_batch(OUTCOMES, n_traces=1).set("advantage", torch.zeros(len(OUTCOMES), 9)))
    assert single.metrics["critic/trace_starts"] == 0.0
    for name in ("critic/trace_start_auc", "critic/trace_start_ev", "critic/summary_abs_advantage"):
        assert math.isnan(single.metrics[name]) and single.reasons[name]
    assert math.isnan(critic_diagnostics(batch.exclude("value"))["critic/trace_start_auc"])


def test_summary_advantage_metrics():
    batch = _with_critic(lambda o: o, n_traces=3)
    sign = torch.where(batch["episode_reward"] > 0, 2.0, -1.0)[:, None]
    batch.set("advantage", torch.where(batch["summary_mask"], sign, torch.full_like(sign, 100.0)))
    m = critic_diagnostics(batch)
    n_pos = sum(o > 0 for o in OUTCOMES)
    assert m["critic/summaries"] == 2 * len(OUTCOMES)
    assert m["critic/summary_abs_advantage"] == pytest.approx((2 * n_pos + (len(OUTCOMES) - n_pos)) / len(OUTCOMES))
    assert m["critic/summary_advantage_outcome_corr"] == pytest.approx(1.0)
    batch.set("advantage", -batch["advantage"])
    assert critic_diagnostics(batch)["critic/summary_advantage_outcome_corr"] == pytest.approx(-1.0)


def test_calibration_table_and_plot(tmp_path):
    batch = _with_critic(lambda o: 0.9 if o else 0.1, n_traces=3)
    table = calibration_table(batch, bins=2)
    assert sorted(table) == [1, 2]
    for rows in table.values():
        assert [(round(x, 6), y, n) for x, y, n in rows] == [(0.1, 0.0, 4), (0.9, 1.0, 4)]
    assert sum(n for _, _, n in calibration_table(batch, bins=50)[1]) == len(OUTCOMES)
    with pytest.raises(ValueError, match="bins"):
        calibration_table(batch, bins=0)
    for name, b in (("cal.png", batch), ("empty.png", _batch(OUTCOMES, n_traces=1))):
        path = calibration_plot(b, tmp_path / "plots" / name)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["cal.png", "empty.png"]


@pytest.mark.timeout(180)
def test_on_a_collected_batch_with_a_real_critic(tmp_path):
    """End to end: a tiny random model's episodes (budget tight enough to force summaries), a critic
    from the policy, GAE across traces; every metric is a number in its range or NaN with a reason."""
    from compactrl.algos.gae import trace_gae
    from compactrl.collectors.trace_collector import TraceCollector
    from compactrl.policies.critic import ValueModel
    from compactrl.tokenizer import load_tokenizer
    from compactrl.training.config import override, preset
    from compactrl.training.rollouts import build_policy, make_env_fns

    cfg = override(preset("smoke"), {"env.context_budget.budget": 520, "env.max_turns": 8})
    policy, _ = build_policy(cfg, load_tokenizer())
    collector = TraceCollector(make_env_fns(cfg.env, split="test", count=2), policy, episodes_per_batch=4, seed=3,
                               give_task_to_policy=False)
    try:
        batch = collector.next()
    finally:
        collector.shutdown()
    assert int(batch["trace_index"].max()) >= 1  # summaries were forced
    critic = ValueModel.from_policy(policy, head_init_std=0.5)
    with torch.no_grad():
        batch.set("value", critic.value(batch["tokens"], batch["attention_mask"]).float())
    trace_gae(batch, gamma=1.0, length_adaptive_alpha=1.5)
    d = diagnose(batch)
    assert d.metrics["critic/trace_starts"] == float((batch["trace_index"] >= 1).sum())
    for name, v in d.metrics.items():
        if math.isnan(v):
            assert d.reasons[name], name
        elif "auc" in name:
            assert 0.0 <= v <= 1.0, name
    assert calibration_plot(batch, tmp_path / "cal.png").stat().st_size > 0
