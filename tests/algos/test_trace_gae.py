"""GAE across trace boundaries: the trace batch maps to the hand-built policy-token stream and back."""

from __future__ import annotations

import pytest
import torch
from algos_helpers import batch_with_values, episode_stream, random_episodes
from hypothesis import given
from hypothesis import strategies as st

from compactrl.algos.gae import gae, length_adaptive_lambda, trace_gae

seeds = st.integers(0, 2**31 - 1)
unit = st.one_of(st.just(1.0), st.floats(0.9, 1.0))


def _episode_ids(batch) -> list[int]:
    return sorted(set(batch["episode_id"].tolist()))


def _terminated(batch, e: int) -> bool:
    return bool(batch["terminated"][batch["episode_id"] == e][0])


@pytest.mark.timeout(120)
@given(
    seed=seeds,
    gamma=unit,
    lmbda=unit,
    step_rewards=st.booleans(),
    truncation=st.sampled_from(["bootstrap_last", "terminal"]),
)
def test_bootstrap_equals_gae_on_hand_concatenated_stream(seed, gamma, lmbda, step_rewards, truncation):
    batch = batch_with_values(random_episodes(seed, step_rewards=step_rewards), seed)
    trace_gae(batch, gamma=gamma, lmbda=lmbda, boundary="bootstrap", truncation=truncation)
    for e in _episode_ids(batch):
        where, rewards, values = episode_stream(batch, e)
        done = torch.zeros(len(rewards), dtype=torch.bool)
        done[-1] = True
        open_end = not _terminated(batch, e) and truncation == "bootstrap_last"
        adv, target = gae(
            rewards,
            values,
            done,
            gamma=gamma,
            lmbda=lmbda,
            terminated=done & (not open_end),
            next_value=values,
        )
        rows, cols = zip(*where)
        torch.testing.assert_close(batch["advantage"][rows, cols], adv, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batch["value_target"][rows, cols], target, rtol=1e-5, atol=1e-5)
    off = ~batch["policy_mask"]
    assert bool((batch["advantage"][off] == 0).all()) and bool((batch["value_target"][off] == 0).all())


@pytest.mark.timeout(120)
@given(seed=seeds, gamma=unit, lmbda=unit)
def test_cut_equals_gae_per_trace_with_episode_reward_at_its_end(seed, gamma, lmbda):
    batch = batch_with_values(random_episodes(seed, step_rewards=True), seed)
    trace_gae(batch, gamma=gamma, lmbda=lmbda, boundary="cut", truncation="bootstrap_last")
    for r in range(batch.shape[0]):
        cols = batch["policy_mask"][r].nonzero().squeeze(1)
        if cols.numel() == 0:
            continue
        values = batch["value"][r, cols]
        rewards = torch.zeros_like(values)
        rewards[-1] = batch["episode_reward"][r]
        done = torch.zeros(cols.numel(), dtype=torch.bool)
        done[-1] = True
        last = int(batch["trace_index"][r]) == int(batch["num_traces"][r]) - 1
        open_end = last and not bool(batch["terminated"][r])
        adv, _ = gae(
            rewards,
            values,
            done,
            gamma=gamma,
            lmbda=lmbda,
            terminated=done & (not open_end),
            next_value=values,
        )
        torch.testing.assert_close(batch["advantage"][r, cols], adv, rtol=1e-5, atol=1e-5)


def _summary_rows(batch):
    """Rows whose trace ends with a summary (a next trace of the same episode exists)."""
    return [
        r for r in range(batch.shape[0]) if int(batch["trace_index"][r]) < int(batch["num_traces"][r]) - 1
    ]


@pytest.mark.timeout(120)
@given(
    seed=seeds,
    gamma=st.floats(0.5, 1.0),
    lmbda=st.floats(0.0, 0.99),
    boundary=st.sampled_from(["bootstrap", "cut"]),
)
def test_next_trace_value_reaches_the_summary_only_with_bootstrap(seed, gamma, lmbda, boundary):
    """Raising V at the next trace's first policy token by d moves the summary's last advantage by
    gamma * (1 - lambda) * d under bootstrap (its delta gains gamma * d, the next advantage loses
    d, discounted by gamma * lambda), and leaves it alone under cut. At lambda = 1 the values
    telescope away, so the summary is credited by the later return alone."""
    batch = batch_with_values(
        random_episodes(seed, n_episodes=2, max_traces=3, truncated_share=0.0, min_traces=2), seed
    )
    before = trace_gae(batch.clone(), gamma=gamma, lmbda=lmbda, boundary=boundary)["advantage"]
    r = _summary_rows(batch)[0]
    nxt = int(
        (
            (batch["episode_id"] == batch["episode_id"][r])
            & (batch["trace_index"] == batch["trace_index"][r] + 1)
        ).nonzero()
    )
    changed = batch.clone()
    changed["value"][nxt, int(changed["policy_mask"][nxt].nonzero()[0])] += 10.0
    after = trace_gae(changed, gamma=gamma, lmbda=lmbda, boundary=boundary)["advantage"]
    last = int(batch["summary_mask"][r].nonzero()[-1])
    moved = float(after[r, last] - before[r, last])
    expected = gamma * (1 - lmbda) * 10.0 if boundary == "bootstrap" else 0.0
    assert moved == pytest.approx(expected, abs=1e-4)


@pytest.mark.timeout(120)
@given(seed=seeds)
def test_bootstrap_equals_cut_at_gamma_lambda_one_with_outcome_reward(seed):
    """With gamma = lambda = 1 and one outcome reward at the episode's end, A_t = R - V_t either way:
    on every token of terminated episodes, and on the last trace of truncated ones (whose open end
    bootstraps from its own last value in both modes; earlier traces end terminally under cut)."""
    batch = batch_with_values(random_episodes(seed, step_rewards=False), seed)
    boot = trace_gae(batch.clone(), gamma=1.0, lmbda=1.0, boundary="bootstrap")["advantage"]
    cut = trace_gae(batch.clone(), gamma=1.0, lmbda=1.0, boundary="cut")["advantage"]
    last = batch["trace_index"] == batch["num_traces"] - 1
    same = batch["terminated"] | last
    torch.testing.assert_close(boot[same], cut[same], rtol=1e-5, atol=1e-5)
    boot_t = trace_gae(batch.clone(), gamma=1.0, lmbda=1.0, boundary="bootstrap", truncation="terminal")
    cut_t = trace_gae(batch.clone(), gamma=1.0, lmbda=1.0, boundary="cut", truncation="terminal")
    torch.testing.assert_close(boot_t["advantage"], cut_t["advantage"], rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(60)
def test_bootstrap_and_cut_differ_below_lambda_one():
    batch = batch_with_values(
        random_episodes(3, n_episodes=4, max_traces=3, truncated_share=0.0, min_traces=2), 3
    )
    assert _summary_rows(batch)
    boot = trace_gae(batch.clone(), gamma=1.0, lmbda=0.9, boundary="bootstrap")["advantage"]
    cut = trace_gae(batch.clone(), gamma=1.0, lmbda=0.9, boundary="cut")["advantage"]
    assert float((boot - cut).abs().max()) > 1e-3


@pytest.mark.timeout(120)
@given(seed=seeds, alpha=st.floats(0.01, 2.0))
def test_length_adaptive_lambda_uses_episode_length(seed, alpha):
    batch = batch_with_values(random_episodes(seed, truncated_share=0.0), seed)
    trace_gae(batch, gamma=1.0, length_adaptive_alpha=alpha, value_lmbda=1.0)
    for e in _episode_ids(batch):
        where, rewards, values = episode_stream(batch, e)
        done = torch.zeros(len(rewards), dtype=torch.bool)
        done[-1] = True
        lam = float(length_adaptive_lambda(torch.tensor([len(rewards)]), alpha))
        adv, _ = gae(rewards, values, done, gamma=1.0, lmbda=lam)
        _, target = gae(rewards, values, done, gamma=1.0, lmbda=1.0)
        rows, cols = zip(*where)
        torch.testing.assert_close(batch["advantage"][rows, cols], adv, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(batch["value_target"][rows, cols], target, rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(60)
@given(seed=seeds, boundary=st.sampled_from(["bootstrap", "cut"]))
def test_row_order_does_not_matter(seed, boundary):
    batch = batch_with_values(random_episodes(seed, n_episodes=4), seed)
    perm = torch.randperm(batch.shape[0], generator=torch.Generator().manual_seed(seed))
    ref = trace_gae(batch.clone(), gamma=0.99, lmbda=0.95, boundary=boundary)
    shuffled = trace_gae(batch[perm].clone(), gamma=0.99, lmbda=0.95, boundary=boundary)
    torch.testing.assert_close(shuffled["advantage"], ref["advantage"][perm], rtol=1e-6, atol=1e-6)


@pytest.mark.timeout(30)
def test_bad_batches_raise_value_error():
    batch = batch_with_values(random_episodes(1, n_episodes=2, max_traces=3, min_traces=2), 1)
    with pytest.raises(ValueError, match="exactly one of lmbda"):
        trace_gae(batch.clone(), gamma=0.9)
    with pytest.raises(ValueError, match="boundary"):
        trace_gae(batch.clone(), gamma=0.9, lmbda=0.9, boundary="split")
    with pytest.raises(ValueError, match="lacks"):
        trace_gae(batch.exclude("value"), gamma=0.9, lmbda=0.9)
    with pytest.raises(ValueError, match="not whole"):
        trace_gae(batch[1:].clone(), gamma=0.9, lmbda=0.9)  # row 0 is trace 0 of episode 0


@pytest.mark.timeout(60)
@given(seed=seeds, alpha=st.floats(0.01, 2.0))
def test_length_adaptive_lambda_under_cut_uses_trace_length(seed, alpha):
    batch = batch_with_values(random_episodes(seed, truncated_share=0.0), seed)
    trace_gae(batch, gamma=1.0, length_adaptive_alpha=alpha, boundary="cut")
    for r in range(batch.shape[0]):
        cols = batch["policy_mask"][r].nonzero().squeeze(1)
        values = batch["value"][r, cols]
        rewards = torch.zeros_like(values)
        rewards[-1] = batch["episode_reward"][r]
        done = torch.zeros(cols.numel(), dtype=torch.bool)
        done[-1] = True
        lam = float(length_adaptive_lambda(torch.tensor([cols.numel()]), alpha))
        adv, _ = gae(rewards, values, done, gamma=1.0, lmbda=lam)
        torch.testing.assert_close(batch["advantage"][r, cols], adv, rtol=1e-5, atol=1e-5)


def _two_trace_episode(values: list[float]):
    """One episode: trace 0 = prompt + [response, summary], trace 1 = prompt + [response, answer]
    (reward 1 on the answer); ``values`` at the four policy tokens in time order."""
    import math

    from compactrl.collectors.batch import EpisodeMeta, stack_traces
    from compactrl.types import Trace

    pol = [False, True, True]
    t0 = Trace([1, 2, 3], pol, [False, False, True], [math.nan, 0.0, 0.0], trace_index=0, ends_with_summary=True)
    t1 = Trace([1, 4, 5], pol, [False] * 3, [math.nan, 0.0, 0.0], {2: 1.0}, trace_index=1)
    batch = stack_traces([(EpisodeMeta(0, 0, True, False), [t0, t1])])
    batch.set("value", torch.tensor([[0.0, *values[:2]], [0.0, *values[2:]]]))
    return batch


@pytest.mark.timeout(30)
def test_length_adaptive_lambda_by_hand():
    """Bootstrap: one stream of n = 4 tokens, lambda = 1 - 1/(1.5 * 4) = 5/6; cut: two streams of
    n = 2, lambda = 1 - 1/(1.5 * 2) = 2/3, each ending with the episode's reward. gamma = 1."""
    v = [0.2, 0.4, 0.5, 0.7]
    boot = trace_gae(_two_trace_episode(v), gamma=1.0, length_adaptive_alpha=1.5, value_lmbda=1.0)
    # deltas 0.2, 0.1, 0.2, 0.3 (the summary's next value is the next trace's first value)
    a3 = 0.3
    a2 = 0.2 + 5 / 6 * a3
    a1 = 0.1 + 5 / 6 * a2
    a0 = 0.2 + 5 / 6 * a1
    torch.testing.assert_close(boot["advantage"][:, 1:], torch.tensor([[a0, a1], [a2, a3]]))
    torch.testing.assert_close(boot["value_target"][:, 1:], torch.ones(2, 2))  # value lambda 1: the return
    cut = trace_gae(_two_trace_episode(v), gamma=1.0, length_adaptive_alpha=1.5, boundary="cut")
    # trace 0 ends terminally with the episode's reward: deltas 0.2, 1 - 0.4; trace 1: 0.2, 0.3
    torch.testing.assert_close(cut["advantage"][:, 1:], torch.tensor([[0.2 + 2 / 3 * 0.6, 0.6],
                                                                       [0.2 + 2 / 3 * 0.3, 0.3]]))
