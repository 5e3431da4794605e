"""Critic diagnostics that say whether the critic predicts success where credit crosses a summary.

Explained variance against lambda-returns (the loss's ``critic/explained_variance``) cannot tell a
useful critic from a useless one when the returns are themselves built from the critic. These
functions read a trace batch that already holds ``value`` (and, for the advantage metrics,
``advantage``) and compare the critic with what actually happened:

* **trace starts**: the value at the first policy token of every trace ``k >= 1`` (the state
  system + task + summary, the one a bootstrapped summary is credited by) against the episode's
  outcome: rank AUC against success, explained variance against the return still to come from
  that point (the episode's outcome when only the end is rewarded), and the mean error, overall
  and per trace index;
* **summary advantages**: mean ``|A|`` over summary tokens, and the correlation between each
  summary's mean advantage and its episode's success;
* **calibration**: binned predicted value against observed success per trace index, as a table
  and as a PNG.

Success is the batch's ``success`` key when it has one, else ``episode_reward > 0``. Metrics that
the batch cannot support (one class only, no trace ``k >= 1``, no summaries) are NaN, and
:func:`diagnose` says why; nothing here raises on such a batch. docs/credit_assignment.md
documents every metric.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tensordict import TensorDictBase

log = logging.getLogger(__name__)

__all__ = [
    "Diagnostics", "roc_auc", "explained_variance", "pearson", "trace_starts", "summary_advantages",
    "diagnose", "critic_diagnostics", "calibration_table", "calibration_plot",
]

NAN = float("nan")


@dataclass(frozen=True)
class Diagnostics:
    """What :func:`diagnose` found: the metric row, and why each NaN metric is NaN."""

    metrics: dict[str, float]
    """Metric name (``critic/...``) -> value, ready for a trainer's metrics row."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Metric name -> why it is NaN (only NaN metrics appear)."""


# -- statistics (pure, numpy) ---------------------------------------------------------------------


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``, tied values sharing the mean of the ranks they span."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    start = np.r_[0, np.cumsum(counts)[:-1]]
    return (start + (counts + 1) / 2.0)[inverse]


def roc_auc(score: np.ndarray, label: np.ndarray) -> float:
    """P(score of a random positive > that of a random negative), ties counted 1/2 (Mann-Whitney).

    1 for a perfect ranking, 0.5 for a constant score, 0 for a reversed one; NaN with one class.
    """
    score, label = np.asarray(score, dtype=np.float64), np.asarray(label, dtype=bool)
    pos, neg = int(label.sum()), int((~label).sum())
    if pos == 0 or neg == 0:
        return NAN
    ranks = _average_ranks(score)
    return float((ranks[label].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def explained_variance(pred: np.ndarray, target: np.ndarray) -> float:
    """``1 - Var(target - pred) / Var(target)``; NaN when the target does not vary.

    Like every explained variance it ignores a constant offset (see the mean error for that).
    """
    pred, target = np.asarray(pred, dtype=np.float64), np.asarray(target, dtype=np.float64)
    var = float(target.var()) if target.size > 1 else 0.0
    if var <= 1e-12:
        return NAN
    return float(1.0 - (target - pred).var() / var)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; NaN when either side does not vary or there are fewer than 2 points."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.size < 2 or float(x.std()) <= 1e-12 or float(y.std()) <= 1e-12:
        return NAN
    return float(np.corrcoef(x, y)[0, 1])


# -- reading the batch ----------------------------------------------------------------------------


def _success(batch: TensorDictBase) -> np.ndarray:
    key = "success" if "success" in batch.keys() else "episode_reward"
    out = batch[key].detach().cpu().numpy()
    return out.astype(bool) if key == "success" else out > 0


def _reward_to_go(batch: TensorDictBase) -> np.ndarray:
    """Per row: the undiscounted reward of this trace and of the later traces of its episode."""
    own = batch["reward"].detach().float().sum(-1).cpu().numpy().astype(np.float64)
    ep, ti = batch["episode_id"].cpu().numpy(), batch["trace_index"].cpu().numpy()
    out = np.empty_like(own)
    for e in np.unique(ep):
        rows = np.flatnonzero(ep == e)
        rows = rows[np.argsort(ti[rows])]
        out[rows] = np.cumsum(own[rows][::-1])[::-1]
    return out


@dataclass(frozen=True)
class TraceStarts:
    """The first policy token of every trace ``k >= 1`` that has one (numpy arrays, one entry each)."""

    trace_index: np.ndarray
    """``k`` of the trace."""
    value: np.ndarray
    """The critic's value at the trace's first policy token."""
    success: np.ndarray
    """Whether the episode succeeded."""
    reward_to_go: np.ndarray
    """Reward the episode earned from this trace on (its outcome when only the end is rewarded)."""


def trace_starts(batch: TensorDictBase) -> TraceStarts:
    """Values at the trace starts ``k >= 1`` of a batch with ``value`` (see :class:`TraceStarts`)."""
    pmask = batch["policy_mask"].cpu().numpy()
    has = pmask.any(-1) & (batch["trace_index"].cpu().numpy() >= 1)
    rows = np.flatnonzero(has)
    first = pmask[rows].argmax(-1)
    value = batch["value"].detach().float().cpu().numpy()[rows, first].astype(np.float64)
    return TraceStarts(batch["trace_index"].cpu().numpy()[rows], value, _success(batch)[rows],
                       _reward_to_go(batch)[rows])


def summary_advantages(batch: TensorDictBase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per trace with summary tokens: (mean advantage over them, their count, the episode's success)."""
    smask = batch["summary_mask"].cpu().numpy()
    count = smask.sum(-1)
    rows = np.flatnonzero(count > 0)
    adv = batch["advantage"].detach().float().cpu().numpy().astype(np.float64)
    mean = (adv * smask).sum(-1)[rows] / count[rows]
    return mean, count[rows], _success(batch)[rows]


# -- the metric row -------------------------------------------------------------------------------


def _start_metrics(ts: TraceStarts, suffix: str, out: dict[str, float], why: dict[str, str]) -> None:
    n = ts.value.size
    out[f"critic/trace_starts{suffix}"] = float(n)
    if n == 0:
        for name in ("auc", "ev", "error"):
            why[f"critic/trace_start_{name}{suffix}"] = "no trace k >= 1 with a policy token in the batch"
            out[f"critic/trace_start_{name}{suffix}"] = NAN
        return
    out[f"critic/trace_start_auc{suffix}"] = roc_auc(ts.value, ts.success)
    if math.isnan(out[f"critic/trace_start_auc{suffix}"]):
        why[f"critic/trace_start_auc{suffix}"] = (
            f"one class only: all {n} trace starts are from {'successful' if ts.success.all() else 'failed'} episodes")
    out[f"critic/trace_start_ev{suffix}"] = explained_variance(ts.value, ts.reward_to_go)
    if math.isnan(out[f"critic/trace_start_ev{suffix}"]):
        why[f"critic/trace_start_ev{suffix}"] = f"the reward to go does not vary over the {n} trace starts"
    out[f"critic/trace_start_error{suffix}"] = float((ts.value - ts.reward_to_go).mean())


def diagnose(batch: TensorDictBase) -> Diagnostics:
    """Every critic metric of a trace batch with ``value`` (and ``advantage`` for the summary ones).

    Keys: ``critic/trace_start_{auc,ev,error}`` and ``critic/trace_starts`` over all traces
    ``k >= 1``, the same with a ``_k{k}`` suffix per trace index present, and
    ``critic/summary_abs_advantage``, ``critic/summary_advantage_outcome_corr``, ``critic/summaries``.
    """
    out: dict[str, float] = {}
    why: dict[str, str] = {}
    if "value" not in batch.keys():
        why["critic/trace_start_auc"] = "the batch has no value key"
        out["critic/trace_start_auc"] = NAN
    else:
        ts = trace_starts(batch)
        _start_metrics(ts, "", out, why)
        for k in np.unique(ts.trace_index).tolist():
            sel = ts.trace_index == k
            _start_metrics(TraceStarts(*(a[sel] for a in vars(ts).values())), f"_k{k}", out, why)
    _summary_metrics(batch, out, why)
    for name, reason in why.items():
        log.debug("%s is NaN: %s", name, reason)
    return Diagnostics(out, why)


def _summary_metrics(batch: TensorDictBase, out: dict[str, float], why: dict[str, str]) -> None:
    names = ("critic/summary_abs_advantage", "critic/summary_advantage_outcome_corr")
    if "advantage" not in batch.keys():
        for name in names:
            out[name], why[name] = NAN, "the batch has no advantage key"
        return
    mean, count, success = summary_advantages(batch)
    out["critic/summaries"] = float(mean.size)
    if mean.size == 0:
        for name in names:
            out[name], why[name] = NAN, "no summary tokens in the batch"
        return
    smask = batch["summary_mask"]
    out[names[0]] = float(batch["advantage"].detach().float()[smask].abs().mean())
    out[names[1]] = pearson(mean, success)
    if math.isnan(out[names[1]]):
        why[names[1]] = (f"{mean.size} summaries: fewer than 2, or their mean advantages or their "
                         "episodes' outcomes do not vary")


def critic_diagnostics(batch: TensorDictBase) -> dict[str, float]:
    """The metrics of :func:`diagnose` (``critic/...`` keys, NaN where the batch cannot support one)."""
    return diagnose(batch).metrics


# -- calibration ----------------------------------------------------------------------------------


def calibration_table(batch: TensorDictBase, bins: int = 5) -> dict[int, list[tuple[float, float, int]]]:
    """Per trace index ``k >= 1``: ``(mean predicted value, observed success rate, count)`` per bin.

    Bins hold near-equal numbers of trace starts in order of predicted value (equal-count bins
    work whatever the range of the values; a critic that is constant gives one point per bin at
    the same x). Fewer points than ``bins`` give one bin per point.
    """
    if bins < 1:
        raise ValueError(f"bins: expected >= 1, got {bins}")
    ts = trace_starts(batch)
    table: dict[int, list[tuple[float, float, int]]] = {}
    for k in np.unique(ts.trace_index).tolist():
        sel = np.flatnonzero(ts.trace_index == k)
        order = sel[np.argsort(ts.value[sel], kind="stable")]
        parts = [p for p in np.array_split(order, min(bins, order.size)) if p.size]
        table[int(k)] = [(float(ts.value[p].mean()), float(ts.success[p].mean()), int(p.size)) for p in parts]
    return table


def calibration_plot(batch: TensorDictBase, path: str | Path, bins: int = 5) -> Path:
    """Write the calibration of the trace-start values as a PNG (matplotlib, Agg backend).

    One line per trace index, the diagonal for reference; with no trace ``k >= 1`` the figure says so.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = calibration_table(batch, bins)
    fig, ax = plt.subplots(figsize=(4.5, 4))
    ax.plot([0, 1], [0, 1], color="0.7", lw=1, ls="--", label="calibrated")
    for k, rows in table.items():
        xs, ys, ns = zip(*rows)
        ax.plot(xs, ys, marker="o", label=f"trace {k} (n={sum(ns)})")
    if not table:
        ax.text(0.5, 0.5, "no trace k >= 1 in the batch", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("critic value at the trace's first policy token")
    ax.set_ylabel("observed success")
    ax.set_title("critic calibration at trace starts")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    tmp.replace(path)
    return path
