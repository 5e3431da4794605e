"""The GRPO variants peers run on multi-trace rollouts: broadcast, split by the trace count, Dr. GRPO.

Invariants: ``broadcast`` (the default) is the group formula, checked against a plain-loop version; ``split`` is
``broadcast / K`` per trace, so an episode's traces carry one advantage together; both equal on
single-trace episodes; without std scaling the advantages of a group sum to 0 over its episodes.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from algos_helpers import batch_with_values, random_episodes
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.algos.loss_config import GRPOConfig
from compactrl.algos.losses import GRPOLoss, advantage_estimator, grpo_advantage
from compactrl.training.config import RLConfig


def _reference(batch, *, scale_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """The broadcast advantage from its formula, by plain loops over groups (no shared code with the library):
    ``A = (R - mean_g R) / (std_g R + eps)`` (std with n - 1; no division without ``scale_by_std``), 0 for a group
    of one episode, on every policy token of every trace of the episode."""
    episodes, groups = batch["episode_id"].tolist(), batch["group_id"].tolist()
    reward = dict(zip(episodes, batch["episode_reward"].tolist()))
    group_of = dict(zip(episodes, groups))
    adv: dict[int, float] = {}
    for g in set(groups):
        members = [e for e in reward if group_of[e] == g]
        rs = [reward[e] for e in members]
        n, mean = len(rs), sum(rs) / len(rs)
        sd = math.sqrt(sum((r - mean) ** 2 for r in rs) / (n - 1)) if n > 1 else 0.0
        for e in members:
            centred = reward[e] - mean
            adv[e] = 0.0 if n == 1 else (centred / (sd + eps) if scale_by_std else centred)
    per_row = torch.tensor([adv[e] for e in episodes], dtype=torch.float32)[:, None]
    return per_row * batch["policy_mask"].to(torch.float32)


def _batch(seed: int, n_episodes: int, max_traces: int, groups: int, rewards: list[float] | None = None):
    batch = batch_with_values(random_episodes(seed, n_episodes=n_episodes, max_traces=max_traces, groups=groups,
                                              truncated_share=0.0), seed)
    if rewards is not None:
        batch["episode_reward"] = torch.tensor(rewards, dtype=torch.float32)[batch["episode_id"]]
    return batch


_batches = st.builds(
    lambda seed, n, k, g, rewards: _batch(seed, n, k, g, rewards[:n]),
    st.integers(0, 10_000), st.integers(2, 8), st.integers(1, 6), st.integers(1, 3),
    st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=8, max_size=8),
)


@settings(max_examples=40, deadline=None)
@given(batch=_batches, scale=st.booleans())
def test_broadcast_is_the_default_and_the_group_formula(batch, scale):
    expected = _reference(batch, scale_by_std=scale)
    default = grpo_advantage(batch.clone(), scale_by_std=scale)["advantage"]
    torch.testing.assert_close(default, expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(grpo_advantage(batch.clone(), scale_by_std=scale, trace_advantage="broadcast")["advantage"],
                       default)
    assert GRPOConfig().trace_advantage == "broadcast"


@settings(max_examples=40, deadline=None)
@given(batch=_batches, scale=st.booleans())
def test_split_gives_each_trace_the_episode_advantage_over_k(batch, scale):
    broadcast = grpo_advantage(batch.clone(), scale_by_std=scale)["advantage"]
    split = grpo_advantage(batch.clone(), scale_by_std=scale, trace_advantage="split")["advantage"]
    k = batch["num_traces"].to(torch.float32)[:, None]
    torch.testing.assert_close(split * k, broadcast)
    single = batch["num_traces"] == 1  # one trace: the two variants agree exactly
    assert torch.equal(split[single], broadcast[single])
    pol = batch["policy_mask"]
    for e in batch["episode_id"].unique():  # per trace, the K traces' constants sum to the episode's A
        rows = batch["episode_id"] == e
        per_trace = [float(split[r][pol[r]][0]) for r in rows.nonzero().flatten() if pol[r].any()]
        episode_a = float(broadcast[rows][pol[rows]][0]) if pol[rows].any() else 0.0
        assert sum(per_trace) == pytest.approx(episode_a, abs=1e-5)
    assert bool((split[~pol] == 0).all())


def test_split_without_num_traces_counts_the_episode_rows():
    batch = _batch(3, 6, 4, 2, [1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    expected = grpo_advantage(batch.clone(), trace_advantage="split")["advantage"]
    del batch["num_traces"]
    torch.testing.assert_close(grpo_advantage(batch, trace_advantage="split")["advantage"], expected)


@settings(max_examples=30, deadline=None)
@given(batch=_batches, split=st.booleans())
def test_dr_grpo_advantages_of_a_group_sum_to_zero_over_its_episodes(batch, split):
    """Without std scaling the advantage is the reward minus the group's mean: zero-sum per group
    (per episode for ``broadcast``; per episode once its traces' ``A / K`` are added up for ``split``)."""
    mode = "split" if split else "broadcast"
    adv = grpo_advantage(batch.clone(), scale_by_std=False, trace_advantage=mode)["advantage"]
    pol = batch["policy_mask"]
    for g in batch["group_id"].unique():
        total = 0.0
        for e in batch["episode_id"][batch["group_id"] == g].unique():
            rows = (batch["episode_id"] == e).nonzero().flatten()
            per_row = [float(adv[r][pol[r]][0]) for r in rows if pol[r].any()]
            total += sum(per_row) if split else (per_row[0] if per_row else 0.0)
        assert total == pytest.approx(0.0, abs=1e-5)


def test_the_config_reaches_the_advantage_through_the_trainer_and_the_loss():
    batch = _batch(5, 8, 5, 2, [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    assert int(batch["num_traces"].max()) > 1
    split_cfg = GRPOConfig(trace_advantage="split")
    rl = RLConfig(algo="grpo", whiten_advantages=False, grpo=split_cfg)
    expected = grpo_advantage(batch.clone(), trace_advantage="split")["advantage"]
    torch.testing.assert_close(advantage_estimator(rl)(batch.clone())["advantage"], expected)
    torch.testing.assert_close(GRPOLoss(torch.nn.Linear(1, 1), split_cfg).compute_advantage(batch.clone())["advantage"],
                               expected)
    broadcast = advantage_estimator(dataclasses.replace(rl, grpo=GRPOConfig()))(batch.clone())["advantage"]
    assert not torch.equal(broadcast, expected)


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="trace_advantage"):
        GRPOConfig(trace_advantage="mean")
    with pytest.raises(ValueError, match="trace_advantage"):
        grpo_advantage(_batch(0, 2, 2, 1), trace_advantage="per_token")
    with pytest.raises(ValueError, match="rl.grpo.trace_advantage"):
        from compactrl.training.config import TrainConfig, override

        override(TrainConfig(), {"rl.grpo.trace_advantage": "mean"})
