"""Packing trace rows into token-budget micro-batches."""

from __future__ import annotations

import logging

import pytest
import torch
from algos_helpers import batch_with_values, random_episodes
from hypothesis import given
from hypothesis import strategies as st

from compactrl.algos.packing import micro_batches, pack_rows, padding_share, row_lengths

lengths_st = st.lists(st.integers(0, 300), min_size=1, max_size=60)


@pytest.mark.timeout(60)
@given(lengths=lengths_st, budget=st.integers(1, 2000))
def test_every_row_once_and_within_budget(lengths, budget):
    groups = pack_rows(lengths, budget)
    rows = sorted(i for g in groups for i in g.tolist())
    assert rows == list(range(len(lengths)))
    for g in groups:
        cost = len(g) * max(lengths[i] for i in g.tolist())
        assert cost <= budget or len(g) == 1


@pytest.mark.timeout(60)
@given(lengths=lengths_st, budget=st.integers(300, 5000))
def test_packed_never_computes_more_than_one_padded_tensor(lengths, budget):
    report = padding_share(lengths, budget)
    assert report.real_tokens == sum(lengths)
    assert report.real_tokens <= report.packed_positions <= report.padded_positions
    assert report.real_tokens <= report.sequential_positions
    assert 0.0 <= report.packed_share <= report.padded_share <= 1.0


@pytest.mark.timeout(30)
def test_padding_share_by_hand():
    report = padding_share([10, 1, 10, 1], token_budget=20)
    assert report.padded_positions == 40
    assert report.sequential_positions == 40  # [10, 1] and [10, 1], each 2 * 10
    assert report.packed_positions == 22  # [10, 10] and [1, 1]
    assert report.micro_batches == 2
    assert report.packed_share == 0.0
    assert report.padded_share == pytest.approx(1 - 22 / 40)


@pytest.mark.timeout(30)
def test_oversized_row_goes_alone_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="compactrl.algos.packing"):
        groups = pack_rows([50, 3, 3], token_budget=10)
    assert [g.tolist() for g in groups] == [[0], [1, 2]]
    assert "exceeds" in caplog.text
    with pytest.raises(ValueError, match="token_budget"):
        pack_rows([1], 0)


@pytest.mark.timeout(60)
@given(seed=st.integers(0, 2**31 - 1), budget=st.integers(10, 300))
def test_micro_batches_trim_token_entries_and_keep_rows(seed, budget):
    batch = batch_with_values(random_episodes(seed, n_episodes=4), seed)
    lengths = row_lengths(batch["attention_mask"])
    seen = []
    for part in micro_batches(batch, budget):
        width = part["tokens"].shape[1]
        assert width == int(row_lengths(part["attention_mask"]).max())
        assert part.shape[0] * width <= budget or part.shape[0] == 1
        for j, eid in enumerate(part["episode_id"].tolist()):
            row = next(
                r
                for r in range(batch.shape[0])
                if int(batch["episode_id"][r]) == eid
                and int(batch["trace_index"][r]) == int(part["trace_index"][j])
            )
            seen.append(row)
            n = int(lengths[row])
            assert torch.equal(part["tokens"][j, :n], batch["tokens"][row, :n])
            assert torch.equal(part["value"][j, :n], batch["value"][row, :n])
            assert float(part["episode_reward"][j]) == float(batch["episode_reward"][row])
    assert sorted(seen) == list(range(batch.shape[0]))
