"""The flat GAE solver: equal to TorchRL's reference, to a float64 loop, stable on 10^6-token streams."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torchrl.objectives.value.functional import generalized_advantage_estimate

import compactrl.algos.gae as gae_module
from compactrl.algos.gae import gae, gae_loop, length_adaptive_lambda

unit = st.one_of(st.just(1.0), st.floats(0.9, 1.0))
solvers = pytest.mark.parametrize("solver", ["auto", "blocked", "blocked-scan"])
_FORCED = {
    "auto": {},
    # the blocked scan with BLAS GEMMs at every level, even where the scalar loop or the log-step
    # scan would take over, and blocks with resets by masked GEMM ...
    "blocked": {"_SCALAR_MAX": 0, "_GRAIN": 0},
    # ... or by the log-step scan
    "blocked-scan": {"_SCALAR_MAX": 0, "_GRAIN": 0, "_SEGMENT_SOLVE_MAX": 0},
}


@contextlib.contextmanager
def _solver(kind: str):
    """Force one code path of the solver, so that every path meets every property."""
    saved = {name: getattr(gae_module, name) for name in _FORCED[kind]}
    try:
        for name, value in _FORCED[kind].items():
            setattr(gae_module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(gae_module, name, value)


def _streams(seed: int, shape: tuple[int, ...], p_done: float, p_term: float):
    g = torch.Generator().manual_seed(seed)
    reward, value, next_value = (torch.randn(shape, generator=g) for _ in range(3))
    done = torch.rand(shape, generator=g) < p_done
    terminated = done & (torch.rand(shape, generator=g) < p_term)
    return reward, value, next_value, done, terminated


def _torchrl(reward, value, next_value, done, terminated, gamma, lmbda):
    """TorchRL's loop with next-state values spelled out: value[t+1] inside, next_value at a boundary."""
    boundary = done.clone()
    boundary[..., -1] = True
    nsv = torch.where(boundary, next_value, torch.cat([value[..., 1:], next_value[..., -1:]], -1))
    adv, target = generalized_advantage_estimate(
        gamma,
        lmbda,
        value[..., None],
        nsv[..., None],
        reward[..., None],
        boundary[..., None],
        terminated[..., None],
    )
    return adv[..., 0], target[..., 0]


@pytest.mark.timeout(120)
@solvers
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.one_of(st.tuples(st.integers(1, 400)), st.tuples(st.integers(1, 4), st.integers(1, 200))),
    p_done=st.sampled_from([0.0, 0.01, 0.1, 0.5]),
    p_term=st.sampled_from([0.0, 0.5, 1.0]),
    gamma=unit,
    lmbda=unit,
)
def test_gae_equals_torchrl(solver, seed, shape, p_done, p_term, gamma, lmbda):
    reward, value, next_value, done, terminated = _streams(seed, shape, p_done, p_term)
    with _solver(solver):
        adv, target = gae(
            reward, value, done, gamma=gamma, lmbda=lmbda, terminated=terminated, next_value=next_value
        )
    ref_adv, ref_target = _torchrl(reward, value, next_value, done, terminated, gamma, lmbda)
    assert adv.shape == target.shape == value.shape
    # TorchRL's float32 loop accumulates rounding over an episode; relative to the stream's scale
    scale = max(1.0, float(ref_adv.abs().max()))
    torch.testing.assert_close(adv, ref_adv, rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(target, ref_target, rtol=1e-5, atol=1e-5 * scale)
    exact, _ = gae_loop(
        reward, value, done, gamma=gamma, lmbda=lmbda, terminated=terminated, next_value=next_value
    )
    torch.testing.assert_close(adv.double(), exact, rtol=1e-5, atol=1e-6 * scale)


@pytest.mark.timeout(120)
@solvers
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.one_of(st.tuples(st.integers(1, 300)), st.tuples(st.integers(1, 3), st.integers(1, 150))),
    p_done=st.sampled_from([0.0, 0.02, 0.3]),
    gamma=unit,
)
def test_per_token_lambda_equals_loop(solver, seed, shape, p_done, gamma):
    reward, value, next_value, done, terminated = _streams(seed, shape, p_done, 0.5)
    lmbda = torch.rand(shape, generator=torch.Generator().manual_seed(seed + 1))
    with _solver(solver):
        adv, target = gae(
            reward, value, done, gamma=gamma, lmbda=lmbda, terminated=terminated, next_value=next_value
        )
    ref_adv, ref_target = gae_loop(
        reward, value, done, gamma=gamma, lmbda=lmbda, terminated=terminated, next_value=next_value
    )
    torch.testing.assert_close(adv.double(), ref_adv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(target.double(), ref_target, rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(60)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 5), steps=st.integers(1, 100), lmbda=unit)
def test_rows_are_independent_streams(seed, rows, steps, lmbda):
    reward, value, next_value, done, terminated = _streams(seed, (rows, steps), 0.05, 0.5)
    adv, _ = gae(reward, value, done, gamma=0.99, lmbda=lmbda, terminated=terminated, next_value=next_value)
    for r in range(rows):
        one, _ = gae(
            reward[r],
            value[r],
            done[r],
            gamma=0.99,
            lmbda=lmbda,
            terminated=terminated[r],
            next_value=next_value[r],
        )
        torch.testing.assert_close(adv[r], one, rtol=1e-5, atol=1e-5)


def _float64_reference(reward: list[float], value: list[float], done: list[bool], gamma: float, lmbda: float):
    out, nxt = [0.0] * len(reward), 0.0
    for t in range(len(reward) - 1, -1, -1):
        end = done[t] or t == len(reward) - 1
        nxt = reward[t] - value[t] + (0.0 if end else gamma * value[t + 1] + gamma * lmbda * nxt)
        out[t] = nxt
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.timeout(120)
@given(
    seed=st.integers(0, 2**31 - 1),
    steps=st.integers(500, 40_000),
    p_done=st.sampled_from([0.0, 1e-3, 0.03, 0.3]),
    gamma=unit,
    lmbda=unit,
)
def test_medium_streams_match_float64(seed, steps, p_done, gamma, lmbda):
    """Lengths where the blocked scan recurses and hands short carry streams to the scalar loop."""
    reward, value, _, done, _ = _streams(seed, (steps,), p_done, 1.0)
    done[-1] = True
    adv, _ = gae(reward, value, done, gamma=gamma, lmbda=lmbda)
    ref = _float64_reference(reward.tolist(), value.tolist(), done.tolist(), gamma, lmbda)
    torch.testing.assert_close(adv.double(), ref, rtol=1e-5, atol=1e-5 * max(1.0, float(ref.abs().max())))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("gamma,lmbda", [(0.99, 0.95), (1.0, 0.9999), (1.0, 1.0)])
def test_million_token_stream_matches_float64(gamma, lmbda):
    n = 1_000_000
    reward, value, _, done, _ = _streams(7, (n,), 2e-5, 1.0)
    done[-1] = True
    adv, _ = gae(reward, value, done, gamma=gamma, lmbda=lmbda)
    ref = _float64_reference(reward.tolist(), value.tolist(), done.tolist(), gamma, lmbda)
    err = (adv.double() - ref).abs()
    # float32 output: the error is bounded by a few ulps of the largest partial sum in the stream
    assert float(err.max()) <= 2e-6 * float(ref.abs().max()), float(err.max())
    assert bool(torch.isfinite(adv).all())


@pytest.mark.timeout(30)
def test_gamma_lambda_one_gives_returns_to_go():
    reward = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    value = torch.zeros(5)
    done = torch.tensor([False, True, False, False, True])
    adv, _ = gae(reward, value, done, gamma=1.0, lmbda=1.0)
    assert adv.tolist() == [3.0, 2.0, 12.0, 9.0, 5.0]


@pytest.mark.timeout(30)
def test_truncated_end_bootstraps_from_next_value():
    reward, value = torch.tensor([0.0, 1.0]), torch.tensor([0.5, 0.25])
    done = torch.tensor([False, True])
    adv, target = gae(
        reward,
        value,
        done,
        gamma=0.5,
        lmbda=1.0,
        terminated=torch.tensor([False, False]),
        next_value=torch.tensor([9.0, 2.0]),
    )
    last = 1.0 + 0.5 * 2.0 - 0.25
    assert adv.tolist() == pytest.approx([0.0 + 0.5 * 0.25 - 0.5 + 0.5 * last, last])
    assert target.tolist() == pytest.approx((adv + value).tolist())


@pytest.mark.timeout(30)
def test_bad_input_raises_value_error():
    r, v = torch.zeros(4), torch.zeros(4)
    d = torch.tensor([False, False, False, True])
    with pytest.raises(ValueError, match="next_value is required"):
        gae(r, v, torch.zeros(4, dtype=torch.bool), gamma=0.9, lmbda=0.9)
    with pytest.raises(ValueError, match="next_value is required"):
        gae(r, v, d, gamma=0.9, lmbda=0.9, terminated=torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="terminated must imply done"):
        gae(r, v, d, gamma=0.9, lmbda=0.9, terminated=torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="gamma"):
        gae(r, v, d, gamma=1.5, lmbda=0.9)
    with pytest.raises(ValueError, match="lmbda"):
        gae(r, v, d, gamma=0.9, lmbda=torch.full((4,), -0.1))
    with pytest.raises(ValueError, match="reward has shape"):
        gae(torch.zeros(3), v, d, gamma=0.9, lmbda=0.9)
    with pytest.raises(ValueError, match="bool"):
        gae(r, v, d.float(), gamma=0.9, lmbda=0.9)


@pytest.mark.timeout(30)
def test_length_adaptive_lambda():
    lam = length_adaptive_lambda(torch.tensor([1, 10, 1000]), alpha=0.05)
    assert lam.tolist() == pytest.approx([0.0, 0.0, 1 - 1 / 50])
    assert math.isclose(float(length_adaptive_lambda(torch.tensor([100]), 1.0)), 0.99)
    with pytest.raises(ValueError, match="alpha"):
        length_adaptive_lambda(torch.tensor([3]), 0.0)


@pytest.mark.parametrize("fn", ["gae", "trace_gae"])
def test_gae_runs_with_its_own_threads_and_restores_the_callers(monkeypatch, fn):
    """The scan runs with ``THREADS`` intra-op threads (1: it collapses on a busy machine with
    more) and the caller's setting is back after, also when the solver raises."""
    seen = []
    real = gae_module._const_scan

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(gae_module, "_const_scan", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        r, v = torch.randn(2000, dtype=torch.float64), torch.randn(2000, dtype=torch.float64)
        d = torch.zeros(2000, dtype=torch.bool)
        d[-1] = True
        if fn == "gae":
            expected = gae_loop(r, v, d, gamma=0.99, lmbda=0.95)[0]
            assert torch.allclose(gae(r, v, d, gamma=0.99, lmbda=0.95)[0], expected)
        else:
            _trace_batch_gae()
        assert seen and set(seen) == {1} and torch.get_num_threads() == 2
        monkeypatch.setattr(gae_module, "THREADS", None)  # the caller's threads, as before it picked
        gae(r, v, d, gamma=0.99, lmbda=0.95)
        assert seen[-1] == 2
        monkeypatch.setattr(gae_module, "THREADS", 1)
        with pytest.raises(ValueError):
            gae(r, v, d, gamma=1.5, lmbda=0.95)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _trace_batch_gae():
    from tensordict import TensorDict

    from compactrl.algos.gae import trace_gae

    n, width = 2, 1200
    policy = torch.zeros(n, width, dtype=torch.bool)
    policy[:, 100:] = True
    batch = TensorDict({
        "value": torch.randn(n, width), "reward": torch.zeros(n, width), "policy_mask": policy,
        "episode_id": torch.tensor([0, 0]), "trace_index": torch.tensor([0, 1]),
        "terminated": torch.tensor([True, True]),
    }, batch_size=[n])
    trace_gae(batch, gamma=1.0, lmbda=0.95)
    assert batch["advantage"][:, 100:].abs().sum() > 0
