"""The exact summary MDP: how bootstrapping through an aliased summary state loses the summary's credit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from compactrl.algos.boundary_bias import (
    ADAPTIVE,
    SummaryChain,
    advantage_gap,
    expected_summary_advantage,
    gap_table,
    ideal_gap,
    summary_advantage_sd,
    trace_gae_summary_advantage,
    trajectories,
    trajectory_batch,
)

pytestmark = pytest.mark.timeout(120)

prob = st.floats(0.0, 1.0)
chains = st.builds(SummaryChain, p_right=prob, p_wrong=prob, keep_right=prob, before=st.integers(0, 12),
                   hidden=st.integers(0, 24), after=st.integers(1, 12), gamma=st.just(1.0))
discounted = st.builds(SummaryChain, p_right=prob, p_wrong=prob, keep_right=prob, before=st.integers(0, 8),
                       hidden=st.integers(0, 12), after=st.integers(1, 8), gamma=st.floats(0.8, 1.0))
lambdas = st.one_of(st.floats(0.0, 1.0), st.just(ADAPTIVE))


def test_default_chain_reproduces_the_reference_figures():
    """ideal 0.55; bootstrap 0.012 at 0.95, 0.26 at 0.99, 0.43 length-adaptive, 0.55 at 1; cut 0.55."""
    rows = {r["lambda"]: r for r in gap_table(SummaryChain())}
    assert SummaryChain().length - 1 - SummaryChain().summary_at == 127
    for lam, expected in ((0.95, 0.012), (0.99, 0.26), (ADAPTIVE, 0.43), (1.0, 0.55)):
        assert rows[lam]["bootstrap"] == pytest.approx(expected, abs=0.005)
        assert rows[lam]["cut"] == pytest.approx(0.55)
        assert rows[lam]["ideal"] == pytest.approx(0.55)
    assert rows[ADAPTIVE]["bootstrap_lambda"] == pytest.approx(1 - 1 / (1.5 * 204))


@given(chain=chains, lmbda=st.floats(0.0, 1.0))
def test_bootstrap_gap_is_lambda_to_the_hidden_steps_times_the_ideal(chain, lmbda):
    assert advantage_gap(chain, lmbda) == pytest.approx(lmbda**chain.hidden * ideal_gap(chain), abs=1e-12)


@given(chain=chains, lmbda=lambdas)
def test_outcome_noise_reaches_the_summary_through_every_step_to_the_end(chain, lmbda):
    """Under bootstrap the outcome's draw reaches the summary with weight lambda^(hidden + after)
    (the noise is discounted over a longer way than the signal); under cut with weight 1."""
    cut = summary_advantage_sd(chain, lmbda, "cut")
    pooled = sum(chain.prior(c) * chain.success(c) * (1 - chain.success(c)) for c in ("right", "wrong"))
    assert cut == pytest.approx(pooled**0.5, abs=1e-12)
    if lmbda != ADAPTIVE:
        steps = chain.hidden + chain.after
        assert summary_advantage_sd(chain, lmbda, "bootstrap") == pytest.approx(lmbda**steps * cut, abs=1e-12)


@given(chain=discounted, grid=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=6))
def test_bootstrap_gap_is_monotone_in_lambda(chain, grid):
    gaps = [advantage_gap(chain, lam) for lam in sorted(grid)]
    sign = 1.0 if chain.p_right >= chain.p_wrong else -1.0  # the gap has the sign of the ideal one
    assert all(sign * (b - a) >= -1e-12 for a, b in zip(gaps, gaps[1:]))
    assert abs(gaps[-1]) <= abs(ideal_gap(chain)) + 1e-12


@given(chain=chains)
def test_bootstrap_equals_cut_at_lambda_one(chain):
    boot = expected_summary_advantage(chain, 1.0, "bootstrap")
    cut = expected_summary_advantage(chain, 1.0, "cut")
    for c in ("right", "wrong"):
        assert boot[c] == pytest.approx(cut[c], abs=1e-12)
    assert advantage_gap(chain, 1.0) == pytest.approx(ideal_gap(chain), abs=1e-12)


@given(chain=discounted, lmbda=lambdas, other=lambdas)
def test_cut_does_not_depend_on_lambda(chain, lmbda, other):
    a = expected_summary_advantage(chain, lmbda, "cut")
    b = expected_summary_advantage(chain, other, "cut")
    assert a == pytest.approx(b, abs=1e-12)
    # the rollout's reward sits on the summary itself: no discount between summary and outcome
    assert a["right"] - a["wrong"] == pytest.approx(chain.p_right - chain.p_wrong, abs=1e-12)


@given(chain=chains, lmbda=lambdas)
def test_no_aliasing_no_bias(chain, lmbda):
    """When the next trace's first state already shows which value was kept, bootstrap loses nothing."""
    revealing = SummaryChain(chain.p_right, chain.p_wrong, chain.keep_right, chain.before, 0, chain.after)
    assert advantage_gap(revealing, lmbda) == pytest.approx(ideal_gap(revealing), abs=1e-12)


@given(chain=discounted, lmbda=lambdas, boundary=st.sampled_from(["bootstrap", "cut"]))
def test_exact_computation_agrees_with_trace_gae_on_the_enumerated_trajectories(chain, lmbda, boundary):
    measured = trace_gae_summary_advantage(chain, lmbda, boundary)
    expected = expected_summary_advantage(chain, lmbda, boundary)
    assert sum(p for p, _, _ in trajectories(chain)) == pytest.approx(1.0)
    for c in ("right", "wrong"):
        if chain.prior(c) > 1e-9:  # below, the trajectories' probabilities underflow
            assert measured[c] == pytest.approx(expected[c], abs=1e-5)
    assert measured["sd"] == pytest.approx(summary_advantage_sd(chain, lmbda, boundary), abs=1e-5)
    batch = trajectory_batch(chain, boundary)
    assert torch.equal(batch["summary_mask"].sum(-1), torch.tensor([1, 0] * 4))
    assert torch.equal(batch["episode_reward"], torch.tensor([1.0, 1.0, 0.0, 0.0] * 2))


def test_bad_parameters_raise_value_error_naming_the_field():
    with pytest.raises(ValueError, match="p_right"):
        SummaryChain(p_right=1.5)
    with pytest.raises(ValueError, match="after"):
        SummaryChain(after=0)
    with pytest.raises(ValueError, match="lmbda"):
        advantage_gap(SummaryChain(), 1.2)
    with pytest.raises(ValueError, match="boundary"):
        advantage_gap(SummaryChain(), 0.9, "split")


def test_benchmark_prints_the_table_with_matching_trace_gae_columns(capsys):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import boundary_bias as bench

    assert bench.main(["--lambdas", "0.95,adaptive,1"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| 0.95")]
    boot, boot_sd, boot_check, cut, cut_sd, cut_check = (x.strip() for x in rows[0][1:7])
    assert (boot, boot_sd, boot_check) == ("0.012", "0.0006", "(0.012, 0.0006)")
    assert (cut, cut_sd, cut_check) == ("0.550", "0.4168", "(0.550, 0.4168)")
