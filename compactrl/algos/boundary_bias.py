"""Why bootstrapping GAE through a lossy summary is biased when lambda < 1: an exact small MDP.

An episode of two traces. The first ends with a one-token summary that keeps either the right
value (probability ``keep_right``) or a look-alike. The next trace's state (system + task +
summary) shows the kept value but not whether it is the right one, so for ``hidden`` policy tokens
the states after a right and after a wrong summary look the same to the critic; then a state
reveals it (a test run with the edit that used the value), and ``after`` tokens later the episode
ends with reward 1 with probability ``p_right`` or ``p_wrong``. The critic is perfect: its value of
a state is the expected return given what the state shows.

Under ``boundary="bootstrap"`` the summary's next value is the aliased first state of the next
trace, worth the same after either summary, so the summary's own TD error carries no signal; the
difference arrives at the reveal, ``hidden`` steps later, and reaches the summary discounted by
``(gamma * lambda)^hidden``. Under ``boundary="cut"`` the summary ends its trace with the episode's
outcome as reward, and gets the whole difference at any lambda. At lambda = 1 both equal the
Monte-Carlo advantage.

Everything is computed exactly (expectations over the four trajectories, float64, no sampling);
:func:`trajectory_batch` builds those trajectories as a trace batch so that the same numbers can be
checked against :func:`~compactrl.algos.gae.trace_gae`. ``benchmarks/boundary_bias.py`` prints the
table that docs/credit_assignment.md quotes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["SummaryChain", "expected_summary_advantage", "advantage_gap", "ideal_gap", "gap_table",
           "summary_advantage_sd",
           "trajectories", "trajectory_batch", "trace_gae_summary_advantage", "ADAPTIVE"]

ADAPTIVE = "adaptive"
"""Pass as ``lmbda`` for the length-adaptive lambda ``1 - 1/(alpha * n)`` (``n`` as in ``trace_gae``)."""

CHOICES = ("right", "wrong")


@dataclass(frozen=True)
class SummaryChain:
    """The MDP's parameters (defaults: ~127 policy tokens between the summary and the outcome)."""

    p_right: float = 0.8
    """Success probability after a summary that kept the right value."""
    p_wrong: float = 0.25
    """Success probability after a summary that kept the look-alike."""
    keep_right: float = 0.5
    """Probability that the policy's summary keeps the right value (the critic's prior)."""
    before: int = 76
    """Policy tokens of the first trace before its summary token."""
    hidden: int = 75
    """Policy tokens of the next trace whose states do not show which value was kept."""
    after: int = 52
    """Policy tokens from the reveal to the end; the last one earns the outcome."""
    gamma: float = 1.0
    """Discount per policy token."""

    def __post_init__(self) -> None:
        for name in ("p_right", "p_wrong", "keep_right", "gamma"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name}: expected a value in [0, 1], got {v!r}")
        for name, low in (("before", 0), ("hidden", 0), ("after", 1)):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= low):
                raise ValueError(f"{name}: expected an integer >= {low}, got {v!r}")

    @property
    def summary_at(self) -> int:
        """Time step (policy token) of the summary."""
        return self.before

    @property
    def length(self) -> int:
        """Policy tokens of the episode."""
        return self.before + 1 + self.hidden + self.after

    def success(self, choice: str) -> float:
        return self.p_right if choice == "right" else self.p_wrong

    def prior(self, choice: str) -> float:
        return self.keep_right if choice == "right" else 1.0 - self.keep_right


def _streams(chain: SummaryChain, boundary: str) -> list[tuple[int, int]]:
    """``[start, end)`` of each GAE stream: the episode (bootstrap) or each trace (cut)."""
    if boundary == "bootstrap":
        return [(0, chain.length)]
    if boundary == "cut":
        return [(0, chain.summary_at + 1), (chain.summary_at + 1, chain.length)]
    raise ValueError(f"boundary: expected 'bootstrap' or 'cut', got {boundary!r}")


def _rewards(chain: SummaryChain, boundary: str, outcome: float) -> np.ndarray:
    """Rewards given the outcome (or its expectation): at the last token; under cut also at the
    summary (the rollout's reward at the end of every trace, ``cut_reward="episode"``)."""
    r = np.zeros(chain.length)
    r[-1] = outcome
    if boundary == "cut":
        r[chain.summary_at] = outcome
    return r


def _revealed(chain: SummaryChain) -> np.ndarray:
    """Whether the state before token ``t`` shows which value was kept (from the reveal on)."""
    t = np.arange(chain.length)
    return t >= chain.summary_at + 1 + chain.hidden


def _returns(chain: SummaryChain, rewards: np.ndarray, boundary: str) -> np.ndarray:
    """Discounted return from each step to the end of its stream."""
    g = np.zeros_like(rewards)
    for start, end in _streams(chain, boundary):
        acc = 0.0
        for t in range(end - 1, start - 1, -1):
            acc = rewards[t] + chain.gamma * acc
            g[t] = acc
    return g


def perfect_values(chain: SummaryChain, boundary: str) -> dict[str, np.ndarray]:
    """Per choice, the value a perfect critic gives each step: E[return | what the state shows]."""
    ret = {c: _returns(chain, _rewards(chain, boundary, chain.success(c)), boundary) for c in CHOICES}
    pooled = sum(chain.prior(c) * ret[c] for c in CHOICES)
    shown = _revealed(chain)
    return {c: np.where(shown, ret[c], pooled) for c in CHOICES}


def _lambdas(chain: SummaryChain, lmbda: float | str, boundary: str, alpha: float) -> np.ndarray:
    lam = np.empty(chain.length)
    for start, end in _streams(chain, boundary):
        if lmbda == ADAPTIVE:
            lam[start:end] = min(max(1.0 - 1.0 / (alpha * (end - start)), 0.0), 1.0)
        elif isinstance(lmbda, (int, float)) and 0.0 <= lmbda <= 1.0:
            lam[start:end] = float(lmbda)
        else:
            raise ValueError(f"lmbda: expected a value in [0, 1] or {ADAPTIVE!r}, got {lmbda!r}")
    return lam


def _summary_gae(chain: SummaryChain, lam: np.ndarray, boundary: str, rewards: np.ndarray,
                 values: np.ndarray) -> float:
    """GAE's advantage at the summary token (every stream ends terminally)."""
    ends = {end - 1 for _, end in _streams(chain, boundary)}
    acc = 0.0
    for t in range(chain.length - 1, chain.summary_at - 1, -1):
        v_next = 0.0 if t in ends else values[t + 1]
        carry = 0.0 if t in ends else chain.gamma * lam[t] * acc
        acc = rewards[t] + chain.gamma * v_next - values[t] + carry
    return float(acc)


def expected_summary_advantage(chain: SummaryChain, lmbda: float | str, boundary: str = "bootstrap", *,
                               alpha: float = 1.5) -> dict[str, float]:
    """E[GAE advantage of the summary token | right / wrong summary], exactly.

    GAE is linear in the TD errors and the perfect critic's values depend only on the choice (the
    outcome's draw comes after every state), so the expected advantage is GAE over the expected
    rewards with those values.
    """
    lam = _lambdas(chain, lmbda, boundary, alpha)
    return {c: _summary_gae(chain, lam, boundary, _rewards(chain, boundary, chain.success(c)), v)
            for c, v in perfect_values(chain, boundary).items()}


def summary_advantage_sd(chain: SummaryChain, lmbda: float | str, boundary: str = "bootstrap", *,
                         alpha: float = 1.5) -> float:
    """SD of the summary's advantage around its mean for its choice, pooled over the choices by
    their probability: the part of the outcome's noise that reaches the summary (exact, over the
    outcome's two values)."""
    lam = _lambdas(chain, lmbda, boundary, alpha)
    var = 0.0
    for c, v in perfect_values(chain, boundary).items():
        p = chain.success(c)
        spread = _summary_gae(chain, lam, boundary, _rewards(chain, boundary, 1.0), v) - \
            _summary_gae(chain, lam, boundary, _rewards(chain, boundary, 0.0), v)
        var += chain.prior(c) * p * (1.0 - p) * spread**2
    return math.sqrt(var)


def advantage_gap(chain: SummaryChain, lmbda: float | str, boundary: str = "bootstrap", *,
                  alpha: float = 1.5) -> float:
    """E[A | right summary] - E[A | wrong summary] at the summary token."""
    a = expected_summary_advantage(chain, lmbda, boundary, alpha=alpha)
    return a["right"] - a["wrong"]


def ideal_gap(chain: SummaryChain) -> float:
    """The difference in expected (discounted) return the summary's choice makes."""
    return float((chain.p_right - chain.p_wrong) * chain.gamma ** (chain.length - 1 - chain.summary_at))


def gap_table(chain: SummaryChain, lambdas=(0.95, 0.99, ADAPTIVE, 1.0), *, alpha: float = 1.5) -> list[dict]:
    """One row per lambda: the gap and the advantage's SD under bootstrap and under cut, and the
    lambda used on each stream."""
    rows = []
    for lam in lambdas:
        row = {"lambda": lam, "ideal": ideal_gap(chain)}
        for boundary in ("bootstrap", "cut"):
            row[boundary] = advantage_gap(chain, lam, boundary, alpha=alpha)
            row[f"{boundary}_sd"] = summary_advantage_sd(chain, lam, boundary, alpha=alpha)
            row[f"{boundary}_lambda"] = float(_lambdas(chain, lam, boundary, alpha)[chain.summary_at])
        rows.append(row)
    return rows


# -- the same MDP as trajectories, for trace_gae --------------------------------------------------


def trajectories(chain: SummaryChain) -> list[tuple[float, str, float]]:
    """``(probability, choice, outcome)`` of the four trajectories (probabilities sum to 1)."""
    return [(chain.prior(c) * (p if o else 1.0 - p), c, float(o))
            for c in CHOICES for p in (chain.success(c),) for o in (1, 0)]


_PROMPT = 2
"""Non-policy tokens at the start of each trace (system + task, or + summary): not time steps."""


def trajectory_batch(chain: SummaryChain, boundary: str = "bootstrap"):
    """The four trajectories as a trace batch (two traces each) with the perfect critic's ``value``.

    Episode ``i`` is ``trajectories(chain)[i]``; its first trace's last token is the summary.
    """
    import torch

    from compactrl.collectors.batch import EpisodeMeta, stack_traces
    from compactrl.types import Trace

    values = perfect_values(chain, boundary)
    n0, n1 = chain.summary_at + 1, chain.hidden + chain.after
    episodes = []
    for e, (_p, _c, outcome) in enumerate(trajectories(chain)):
        t0 = Trace([1] * (_PROMPT + n0), [False] * _PROMPT + [True] * n0,
                   [False] * (_PROMPT + n0 - 1) + [True], [math.nan] * _PROMPT + [0.0] * n0,
                   trace_index=0, episode_id=e, ends_with_summary=True)
        t1 = Trace([1] * (_PROMPT + n1), [False] * _PROMPT + [True] * n1, [False] * (_PROMPT + n1),
                   [math.nan] * _PROMPT + [0.0] * n1, {_PROMPT + n1 - 1: outcome}, trace_index=1, episode_id=e)
        episodes.append((EpisodeMeta(e, e, True, False), [t0, t1]))
    batch = stack_traces(episodes)
    value = torch.zeros(batch["tokens"].shape, dtype=torch.float64)
    for e, (_p, choice, _o) in enumerate(trajectories(chain)):
        v = torch.from_numpy(values[choice])
        value[2 * e, _PROMPT:_PROMPT + n0] = v[:n0]
        value[2 * e + 1, _PROMPT:_PROMPT + n1] = v[n0:]
    batch.set("value", value)
    return batch


def trace_gae_summary_advantage(chain: SummaryChain, lmbda: float | str, boundary: str = "bootstrap", *,
                                alpha: float = 1.5) -> dict[str, float]:
    """:func:`expected_summary_advantage` and :func:`summary_advantage_sd` measured instead:
    ``trace_gae`` on :func:`trajectory_batch`, the summary token's advantage averaged over the
    trajectories of each choice by their probability (NaN for a choice of probability 0), and
    ``"sd"`` its pooled within-choice SD."""
    from compactrl.algos.gae import trace_gae

    batch = trajectory_batch(chain, boundary)
    kwargs = {"length_adaptive_alpha": alpha} if lmbda == ADAPTIVE else {"lmbda": lmbda}
    trace_gae(batch, gamma=chain.gamma, boundary=boundary, truncation="terminal", **kwargs)
    at_summary = batch["advantage"][batch["summary_mask"]].double().tolist()  # one per episode, in order
    out, var = {}, 0.0
    for c in CHOICES:
        paths = [(p, a) for (p, choice, _), a in zip(trajectories(chain), at_summary) if choice == c]
        weight = sum(p for p, _ in paths)
        out[c] = sum(p / weight * a for p, a in paths) if weight > 0 else math.nan  # p / weight: no underflow
        var += sum(p * (a - out[c]) ** 2 for p, a in paths) if weight > 0 else 0.0
    out["sd"] = math.sqrt(var)
    return out
