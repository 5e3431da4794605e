"""What a training run leaves on disk, and how a killed run is resumed.

Layout of a run directory::

    config.json          resolved TrainConfig (a resume reads it back; extending a run rewrites rl.iterations)
    environment.json     one entry per start or resume: the commit, library versions, CPU model and
                         instruction-set flags, torch's kernel level and threads (compactrl.provenance);
                         row 0 of metrics.jsonl carries the first one as ``provenance``
    metrics.jsonl        one JSON row per iteration (row 0: evaluation after SFT, before RL)
    tb/                  TensorBoard event files (torch.utils.tensorboard)
    checkpoint.pt        last checkpoint: RNG states, iteration, collector, and which learner directory is its
    learner/iter-<k>/    the learner's state of that checkpoint (policy, critic, optimisers; a DCP directory)
    sft_model/           the policy after the SFT warm start (Hugging Face format), the RL start point
    plots/*.png          learning curves (and plots/curves.png, all of them on one page); plots/wall_clock.png:
                         each RL iteration's time, stacked by phase (:data:`TIME_COMPONENTS`)
    report.md            short summary: configuration, SFT vs final held-out success, curves, where the time goes
    run.lock             held (``flock``) by the process training into the directory, naming it: a second
                         one, a resume started while the run goes on, stops with a ValueError

Consistency rule: an iteration's metrics row is appended *before* its checkpoint is written, and
every checkpoint records how many rows it covers. On resume, rows past the checkpoint are
dropped (they belong to an iteration that will be redone), so the final file has exactly one row
per completed iteration whatever the moment of the kill. Every file is written to a temporary
name and renamed into place, so a kill never leaves a half-written checkpoint or config.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

CURVES = (
    ("eval/success_rate", "held-out success rate"),
    ("train/success_rate", "training success rate"),
    ("train/reward_mean", "training reward per episode"),
    ("train/traces_per_episode", "traces per episode"),
    ("train/summary_tokens_per_episode", "summary tokens per episode"),
    ("loss/critic", "value loss"),
    ("critic/explained_variance", "critic explained variance (vs its own lambda-returns)"),
    ("eval/critic/trace_start_auc", "held-out: AUC of the value at trace starts vs success"),
    ("policy/clip_fraction", "clip fraction"),
    ("policy/approx_kl", "approx. KL(sampling || current)"),
    ("mismatch/route_disagree_task", "tokens routed apart from the learner (task tokens)"),
    ("mismatch/route_disagree_summary", "tokens routed apart from the learner (summary tokens)"),
)
"""(metric key, title) of every learning curve the run draws."""

TIME_COMPONENTS = (
    ("time/generate_s", "generation (actions)"),
    ("time/summary_s", "generation (summaries)"),
    ("time/env_s", "environment"),
    ("time/learner_s", "learner (advantages + update)"),
    ("time/sync_s", "weight sync"),
    ("time/wait_s", "waiting for rollouts"),
    ("time/other_s", "other"),
)
"""(metric key, label) of the phases an RL iteration's ``time/iteration_s`` is split into; every
iteration's row holds each, and they sum to ``time/iteration_s`` (docs/training.md, "Where the time goes")."""

WORKER_TIME = (("time/workers_generate_s", "generation (actions)"), ("time/workers_summary_s", "generation (summaries)"),
               ("time/workers_env_s", "environment"))
"""(metric key, label) of the rollout workers' own times, summed over workers (rows of a run whose episodes
ran elsewhere or concurrently: Ray rollout workers, mini-swe-agent sessions); not part of the sum above."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


class RunDir:
    """A run directory: config, metrics rows, TensorBoard, checkpoints, plots and report."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.metrics_path = self.path / "metrics.jsonl"
        self.checkpoint_path = self.path / "checkpoint.pt"
        self.config_path = self.path / "config.json"
        self.environment_path = self.path / "environment.json"
        self.sft_model_path = self.path / "sft_model"
        self.final_model_path = self.path / "final_model"
        self._tb = None

    # -- config ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def claimed(self) -> Iterator[None]:
        """Hold the directory for this process (an exclusive ``flock`` on ``run.lock``, made if need be)
        while the block runs. Another process holding it, a run or a resume still going on, is a
        :class:`ValueError` naming it: two writers would interleave their metrics rows and checkpoints.
        The kernel drops the lock when its holder dies, so a killed run leaves nothing to clean up."""
        made = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        lock = self.path / "run.lock"
        with open(lock, "a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.seek(0)
                holder = fh.read().strip() or "a process that did not say which"
                raise ValueError(f"out: {self.path} is in use by another training process ({holder}); "
                                 "wait for it or stop it, or choose another --out") from None
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            fh.flush()
            try:
                yield
            finally:
                if made and [p.name for p in self.path.iterdir()] == [lock.name]:
                    lock.unlink()  # stopped before writing anything (a bad config, --resume of nothing):
                    self.path.rmdir()  # leave no directory behind
                fcntl.flock(fh, fcntl.LOCK_UN)

    def create(self, config_json: str, *, resume: bool) -> None:
        """Make the directory for a new run, or check it for a resumed one."""
        if resume:
            if not self.config_path.exists():
                raise ValueError(f"--resume: {self.path} has no config.json (not a run directory)")
            return
        if self.config_path.exists():
            raise ValueError(f"out: {self.path} already holds a run; pass --resume to continue it or another --out")
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.config_path, config_json)

    def record_machine(self, stamp: dict[str, Any], *, resume: bool) -> None:
        """Add this start's (or resume's) machine stamp to ``environment.json``."""
        attempts = self.machines() if resume else []
        attempts.append({"resume": resume, **stamp})
        atomic_write_text(self.environment_path, json.dumps(attempts, indent=1, sort_keys=True) + "\n")

    def machines(self) -> list[dict[str, Any]]:
        """Every start's machine stamp, oldest first (empty for a run made before stamps existed)."""
        if not self.environment_path.exists():
            return []
        return json.loads(self.environment_path.read_text())

    def write_config(self, config_json: str) -> None:
        """Replace the stored configuration (a resumed run that is extended)."""
        atomic_write_text(self.config_path, config_json)

    def read_config(self) -> dict[str, Any]:
        return json.loads(self.config_path.read_text())

    # -- metrics -----------------------------------------------------------------------------------

    def rows(self) -> list[dict[str, Any]]:
        if not self.metrics_path.exists():
            return []
        rows = []
        for line in self.metrics_path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a row cut short by a kill: it and anything after it are not complete
        return rows

    def truncate_rows(self, keep: int) -> None:
        """Keep the first ``keep`` rows (those covered by the last checkpoint)."""
        rows = self.rows()[:keep]
        atomic_write_text(self.metrics_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))

    def append_row(self, row: dict[str, Any]) -> None:
        clean = {k: _jsonable(v) for k, v in row.items()}
        with open(self.metrics_path, "a") as fh:
            fh.write(json.dumps(clean, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        tb = self.tensorboard(row.get("iteration", 0))
        step = int(row.get("iteration", 0))
        for k, v in clean.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "iteration" and math.isfinite(v):
                tb.add_scalar(k, v, step)
        tb.flush()

    def tensorboard(self, first_step: int = 0):
        """The TensorBoard writer; events at or after ``first_step`` from an earlier attempt are purged."""
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.path / "tb"), purge_step=first_step)
        return self._tb

    # -- checkpoints -------------------------------------------------------------------------------

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Write ``state`` atomically (temp file, fsync, rename)."""
        tmp = self.checkpoint_path.with_name(".checkpoint.pt.tmp")
        torch.save(state, tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, self.checkpoint_path)

    def learner_dir(self, name: str) -> Path:
        """Where the learner's state of checkpoint ``name`` lives (a DCP directory, written by every rank)."""
        return self.path / "learner" / name

    def prune_learner_dirs(self, keep: str) -> None:
        """Remove every learner directory but ``keep`` (the one the checkpoint file names now), including
        one a kill left half-written."""
        import shutil

        root = self.path / "learner"
        for d in root.iterdir() if root.is_dir() else ():
            if d.name != keep:
                shutil.rmtree(d, ignore_errors=True)

    def save_batch(self, iteration: int, batch: Any) -> Path:
        """Write iteration ``iteration``'s trace batch (a TensorDict: tokens, masks, sampling log-probs,
        versions, routes, ...) to ``batches/iter-<k>.pt`` as a dict of tensors (temp file, rename); a
        resumed run that repeats the iteration overwrites it."""
        path = self.path / "batches" / f"iter-{iteration}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save({k: v.detach().cpu() for k, v in batch.items()}, tmp)
        os.replace(tmp, path)
        return path

    def load_batch(self, iteration: int) -> Any:
        """The batch :meth:`save_batch` wrote for ``iteration``, as a TensorDict."""
        from tensordict import TensorDict

        data = torch.load(self.path / "batches" / f"iter-{iteration}.pt", weights_only=True)
        return TensorDict(data, batch_size=[next(iter(data.values())).shape[0]])

    def load_checkpoint(self) -> dict[str, Any] | None:
        if not self.checkpoint_path.exists():
            return None
        return torch.load(self.checkpoint_path, weights_only=False)

    # -- outputs -----------------------------------------------------------------------------------

    def plot(self) -> list[Path]:
        """Draw every learning curve present in the metrics (matplotlib, Agg backend)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = self.rows()
        out_dir = self.path / "plots"
        out_dir.mkdir(exist_ok=True)
        titles = self._titles()
        series = [(k, titles.get(k, t), _series(rows, k)) for k, t in CURVES]
        series = [s for s in series if s[2][0]]
        written = []
        for key, title, (xs, ys) in series:
            fig, ax = plt.subplots(figsize=(5, 3.2))
            _draw(ax, key, title, xs, ys, rows)
            fig.tight_layout()
            path = out_dir / (key.replace("/", "_") + ".png")
            fig.savefig(path, dpi=90)
            plt.close(fig)
            written.append(path)
        if series:
            cols = 4
            nrows = math.ceil(len(series) / cols)
            fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows), squeeze=False)
            for ax, (key, title, (xs, ys)) in zip(axes.flat, series):
                _draw(ax, key, title, xs, ys, rows)
            for ax in list(axes.flat)[len(series):]:
                ax.axis("off")
            fig.tight_layout()
            fig.savefig(out_dir / "curves.png", dpi=80)
            plt.close(fig)
            written.append(out_dir / "curves.png")
        if plot_wall_clock(rows, out_dir / "wall_clock.png"):
            written.append(out_dir / "wall_clock.png")
        return written

    def _titles(self) -> dict[str, str]:
        """Titles that say how each success curve was sampled (from the stored config)."""
        try:
            cfg = self.read_config()
            t_eval, t_train = float(cfg["eval"]["temperature"]), float(cfg["model"]["temperature"])
        except (OSError, KeyError, TypeError, ValueError):
            return {}
        decoding = "greedy" if t_eval == 0 else f"T={t_eval:g}"
        return {"eval/success_rate": f"held-out success rate ({decoding})",
                "train/success_rate": f"training success rate (sampled, T={t_train:g})"}

    def write_report(self, text: str) -> None:
        atomic_write_text(self.path / "report.md", text)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _time_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The RL iterations' rows that hold the time split (row 0 and rows from before it existed do not)."""
    return [r for r in rows if all(isinstance(r.get(k), (int, float)) for k, _ in TIME_COMPONENTS)]


def plot_wall_clock(rows: list[dict[str, Any]], path: Path) -> bool:
    """One stacked bar per RL iteration, its :data:`TIME_COMPONENTS`, into ``path``; False (nothing
    written) when no row holds them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = _time_rows(rows)
    if not timed:
        return False
    xs = [int(r["iteration"]) for r in timed]
    fig, ax = plt.subplots(figsize=(min(max(7.0, 0.2 * len(xs) + 4), 20.0), 3.6))
    bottom = [0.0] * len(xs)
    for key, label in TIME_COMPONENTS:
        ys = [float(r[key]) for r in timed]
        ax.bar(xs, ys, bottom=bottom, label=label, width=0.8)
        bottom = [b + y for b, y in zip(bottom, ys)]
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("where each iteration's wall-clock goes", fontsize=10)
    ax.set_xlabel("iteration")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)
    return True


def time_report(rows: list[dict[str, Any]]) -> list[str]:
    """The report's "Where the time goes" section: each :data:`TIME_COMPONENTS` phase's mean seconds per
    iteration and share of the iterations' time, the summaries' share of generation time, and the rollout
    workers' own times when the rows hold them; nothing when no row holds the split."""
    timed = _time_rows(rows)
    if not timed:
        return []
    n, total = len(timed), sum(float(r["time/iteration_s"]) for r in timed)
    lines = ["## Where the time goes", "",
             f"Mean over {n} RL iterations of {total / n:.3g} s each (evaluation not included); "
             "the phases sum to the iteration's time.", "",
             "| phase | mean s / iteration | share of iteration time |", "|---|---|---|"]
    for key, label in TIME_COMPONENTS:
        part = sum(float(r[key]) for r in timed)
        lines.append(f"| {label} (`{key}`) | {part / n:.3g} | {part / total if total else 0.0:.1%} |")
    workers = {k: sum(float(r.get(k) or 0.0) for r in timed) for k, _ in WORKER_TIME}
    gen, summ = ("time/generate_s", "time/summary_s") if not any(workers.values()) else \
        ("time/workers_generate_s", "time/workers_summary_s")
    g, s = sum(float(r.get(gen) or 0.0) for r in timed), sum(float(r.get(summ) or 0.0) for r in timed)
    lines += ["", f"Summaries took {s / (g + s) if g + s else 0.0:.1%} of generation time"
              + (" (the rollout workers' own time)." if gen != "time/generate_s" else ".")]
    if any(workers.values()):
        lines += ["", "The episodes ran outside the trainer's wall-clock (rollout workers, or concurrent "
                  "sessions), counted above as waiting. Their own time, summed over workers (it can exceed "
                  "the waiting when workers run in parallel), per iteration: "
                  + ", ".join(f"{label} {workers[k] / n:.3g} s" for k, label in WORKER_TIME) + "."]
    return lines + ["", "![wall clock](plots/wall_clock.png)", ""]


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(int(r["iteration"]))
            ys.append(float(v))
    return xs, ys


def _draw(ax, key: str, title: str, xs, ys, rows) -> None:
    if key.startswith("eval/"):  # evaluations are sparse points: markers with a 95% interval, no line
        _, se = _series(rows, "eval/success_stderr")
        err = [1.96 * s for s in se] if key == "eval/success_rate" and len(se) == len(ys) else None
        ax.errorbar(xs, ys, yerr=err, fmt="o", ms=5, capsize=3)
    else:
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("iteration (0 = after SFT)")
    ax.grid(alpha=0.3)


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        v = v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, (np.floating, np.integer)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
