"""Does GAE across trace boundaries help? Five arms x seeds x two task regimes, equal compute, one command.

Arms (every one from the same SFT model of its regime, with the reference recipe --
``--preset compactionrl``: gamma 1, adaptive lambda, value lambda 1, critic pre-training --
except where the table says):

=========================  ===================================================================
arm                        what changes
=========================  ===================================================================
ppo_bootstrap              the reference recipe: GAE runs across trace boundaries
ppo_bootstrap_lambda095    the same with the advantages' lambda fixed at 0.95
ppo_cut                    GAE restarts at every trace (reference recipe otherwise)
grpo                       group-relative outcome advantage (4 rollouts per task), no critic
frozen_summarizer          PPO bootstrap; summaries written by a frozen copy of the SFT model
=========================  ===================================================================

Regimes: ``default`` (the main job's ``tiny`` tasks at budget 860) and ``long_noisy`` (the
``long_noisy`` generator preset, ``tiny``'s tasks with half the test runs flaking, at the same
budget: every flaked submit must be repeated, which lengthens the chains; 10 turns, 6 compactions;
docs/environments.md). ``long_noisy``'s SFT model is ``default``'s continued by a short SFT phase on
``long_noisy``'s own episodes (``SFT_FROM``).

Equal compute: every arm of a regime gets the same policy-training episodes and the same number
of policy optimiser steps (``rl.iterations`` x ``epochs`` x ``minibatches``). PPO arms also
pre-train their critic (``rl.critic_pretrain_steps``) on extra rollouts before the first policy
update; those episodes and critic steps are counted and reported, never taken from the policy's
budget. The table reports each arm's counts: episodes, critic pre-training episodes, policy steps,
critic steps, generated tokens.

Evaluation is cheap in the middle and full at the end: the trainer evaluates ``eval.episodes``
held-out tasks every ``eval.every`` iterations (the curve), and each finished run's final model is
evaluated on ``--final-episodes`` held-out tasks (the same task seeds for every arm and seed, and
for the regime's SFT model), recording each episode's task seed, success and chain length.
Reported per regime and arm: final success (mean over seeds, 95% t-interval; pooled Wilson
interval), area under the held-out curve (mean success over iterations 0..N, SFT at 0), success on
the longest-chain tasks (those where the SFT model's chain was in its top quarter), and paired
comparisons over seeds (same seed = same SFT model, same tasks) with the minimum detectable
effect at 80% power.

One cell is (regime, arm, seed). A finished cell is written to ``cells/`` at once and never run
again under ``--resume``; ``results.json`` and ``results.md`` are regenerated from the cells.
Cells run in ``--jobs`` processes (one torch thread each), or, with ``--ray`` / ``--ray-address``, as
Ray tasks, at most ``--jobs`` at once (docs/distributed.md); on a cluster ``--out`` must be on a
filesystem every node sees at the same path::

    python benchmarks/boundary_experiment.py --out runs/boundary               # the full experiment
    python benchmarks/boundary_experiment.py --out runs/boundary --resume      # continue / re-render
    python benchmarks/boundary_experiment.py --smoke --out /tmp/boundary-smoke # seconds (CI)
    python benchmarks/boundary_experiment.py --ray-address auto --jobs 80 --out /shared/boundary  # a cluster
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compaction_ablation import _T975, t_interval, wilson  # noqa: E402  (one set of statistics)

log = logging.getLogger("boundary_experiment")

ARMS: dict[str, dict[str, Any]] = {
    "ppo_bootstrap": {"rl.algo": "ppo", "rl.boundary": "bootstrap"},
    "ppo_bootstrap_lambda095": {"rl.algo": "ppo", "rl.boundary": "bootstrap", "rl.lmbda": 0.95},
    "ppo_cut": {"rl.algo": "ppo", "rl.boundary": "cut"},
    "grpo": {"rl.algo": "grpo"},
    "frozen_summarizer": {"rl.algo": "ppo", "rl.boundary": "bootstrap", "rl.frozen_summarizer": True,
                          "rl.ppo.train_summaries": False},
    # the GRPO variants peers run on multi-trace rollouts (docs/experiments.md, the thesis experiment)
    "grpo_split": {"rl.algo": "grpo", "rl.grpo.trace_advantage": "split"},
    "dr_grpo": {"rl.algo": "grpo", "rl.grpo.scale_by_std": False, "rl.grpo.normalization": "token",
                "rl.whiten_advantages": False},
}
BOUNDARY_ARMS = ("ppo_bootstrap", "ppo_bootstrap_lambda095", "ppo_cut", "grpo", "frozen_summarizer")
"""The boundary experiment's arms (the default of ``--arms``)."""
VARIABLE_CHAIN_ENV = {"env.env_kwargs": json.dumps({"task_preset": "variable_chain"}), "env.max_turns": 16,
                      "env.context_budget.budget": 1024, "env.context_budget.reserve": 96,
                      "env.context_budget.max_compactions": 6}
"""The ``variable_chain`` generator preset at a budget its 400-token task listing and 96-token summaries fit."""
REGIMES: dict[str, dict[str, Any]] = {
    "default": {},
    "long_noisy": {"env.difficulty": "long_noisy", "env.max_turns": 10, "env.context_budget.max_compactions": 6,
                   "sft.second_steps": 300},  # its SFT run is that phase alone (SFT_FROM); the arms skip SFT
    # the thesis experiment's regime: trace counts that vary within a group by the agent's choices;
    # the critic's learning rate is the library default (3e-4), not the boundary cells' 1e-3
    # and the curve has a point at every iteration (episodes-to-threshold needs the resolution)
    "variable_chain": {**VARIABLE_CHAIN_ENV, "sft.second_steps": 300, "rl.critic_lr": 3e-4, "eval.every": 1},
}
THESIS = {"regimes": "variable_chain", "arms": "ppo_bootstrap,ppo_cut,grpo,grpo_split,dr_grpo", "seeds": 16}
"""``--thesis``: the experiment of docs/experiments.md's "PPO vs the GRPO variants" section."""
BOUNDARY_REGIMES = ("default", "long_noisy")
"""The boundary experiment's regimes (the default of ``--regimes``)."""
DEFAULT_SFT = "benchmarks/results/boundary_experiment/default/sft/sft_model"
"""The boundary experiment's ``default`` SFT model (committed): the warm start ``variable_chain`` continues."""
SFT_FROM: dict[str, tuple[str, dict[str, Any]]] = {
    "long_noisy": ("default", {"sft.copy_steps": 0, "sft.steps": 0}),
    "variable_chain": (DEFAULT_SFT, {"sft.copy_steps": 0, "sft.steps": 0}),
}
"""Regimes whose SFT starts from another regime's SFT model: ``regime -> (source, changes)``, the
source a regime of this run or the directory of a saved model (relative to the repository). With
``changes`` the regime's SFT run continues the source's model with them (on the regime's own env);
without, its arms start from the source's model as it is. ``long_noisy`` has ``default``'s tasks
and budget, but a model never shown a flaked test run stops at 0.08 there: its warm start is
``default``'s SFT model plus the second SFT phase alone (``reproduce_first`` demonstrations, which
repeat a flaked submit; 300 steps, ``REGIMES``) on ``long_noisy``'s own episodes."""
PAIRS = [("ppo_bootstrap", "ppo_cut"), ("ppo_bootstrap", "ppo_bootstrap_lambda095"), ("ppo_bootstrap", "grpo"),
         ("ppo_cut", "grpo"), ("ppo_bootstrap", "frozen_summarizer"),
         ("ppo_bootstrap", "grpo_split"), ("ppo_bootstrap", "dr_grpo"), ("ppo_cut", "grpo_split"), ("ppo_cut", "dr_grpo")]
"""Paired comparisons reported per regime: the hypothesis first (bootstrap vs cut)."""

BUDGETS: dict[str, dict[str, Any]] = {
    # chosen from a measured cell (docs/experiments.md): 4 policy iterations x 16 episodes, a curve
    # point at iterations 2 and 4 on 16 tasks, 64 held-out tasks at the end; the critic's learning
    # rate stays the one its 80 cells ran with
    "full": {"preset": "compactionrl", "seeds": 8, "final_episodes": 64, "changes": {
        "rl.iterations": 4, "rl.episodes_per_iter": 16, "rl.critic_pretrain_steps": 16, "rl.critic_lr": 1e-3,
        "eval.every": 2, "eval.episodes": 16}},
    "smoke": {"preset": "smoke", "seeds": 2, "final_episodes": 2, "changes": {}},
}
PRESET_REGIMES = {"smoke": {"long_noisy": {"env.difficulty": "long_noisy"},
                             "variable_chain": {**VARIABLE_CHAIN_ENV, "env.max_turns": 3}}}
"""Where a preset cannot take a regime's env as it is (the smoke preset's budget, turns and SFT steps stay)."""


# -- configs -------------------------------------------------------------------------------------


def regime_config(budget: str, regime: str, threads: int, extra: dict[str, Any] | None = None):
    """The training config every arm of ``regime`` starts from (and its SFT run uses); ``extra``:
    dotted overrides on top (``--set``)."""
    from compactrl.training.config import override, preset

    b = BUDGETS[budget]
    changes = {**b["changes"], **PRESET_REGIMES.get(b["preset"], REGIMES).get(regime, REGIMES[regime]),
               "threads": threads, **(extra or {})}
    return override(preset(b["preset"]), changes)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``["rl.lr=3e-4", "sft.steps=80"]`` -> ``{"rl.lr": 0.0003, "sft.steps": 80}`` (JSON values, else strings)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set: expected KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def arm_config(base, arm: str, seed: int, sft_model: str):
    from compactrl.training.config import override

    # PPO arms evaluate at iteration 0 too, after critic pre-training: that row scores the critic the
    # policy updates start with (its success is the SFT model's and stays out of the curve)
    changes = {**ARMS[arm], "seed": seed, "model.pretrained": sft_model, "sft.enabled": False,
               "eval.initial": ARMS[arm].get("rl.algo") == "ppo"}
    if ARMS[arm].get("rl.algo") == "grpo":
        changes["rl.group_size"] = min(4, base.rl.episodes_per_iter)
    return override(base, changes)


# -- one cell --------------------------------------------------------------------------------------


def final_evaluation(cfg, model_dir: str, episodes: int) -> list[list]:
    """``[task_seed, success, traces]`` of each of ``episodes`` held-out episodes of ``model_dir``
    (greedy; the same task seeds for every model of a regime; a frozen-summariser arm's summaries by
    its frozen start, ``cfg.model.pretrained``)."""
    import torch

    from compactrl.eval.episodes import evaluate_policy
    from compactrl.tokenizer import load_tokenizer
    from compactrl.training.config import override
    from compactrl.training.rollouts import build_policy, evaluation_policy, make_env_fns

    torch.set_num_threads(cfg.threads)
    tokenizer = load_tokenizer()
    _, policy = build_policy(override(cfg, {"model.pretrained": model_dir}), tokenizer)
    if cfg.rl.frozen_summarizer:  # summaries by the frozen start (the SFT model), as in training
        policy = evaluation_policy(cfg, policy, build_policy(cfg, tokenizer)[0])
    fns = make_env_fns(cfg.env, split=cfg.eval.split, count=cfg.env.num_envs, budget=cfg.eval.context_budget or None)
    _, stats = evaluate_policy(fns, policy, episodes=episodes, seed=cfg.eval.seed, pad_id=tokenizer.pad_token_id or 0)
    # the fourth entry: how long each of the episode's summary calls kept it waiting (seconds)
    return [[s.task_seed, int(s.success), s.num_traces, [round(x, 4) for x in s.summary_latencies_s]] for s in stats]


def compute_counts(cfg, rows: list[dict]) -> dict[str, float]:
    """What a run spent: episodes, optimiser steps and generated tokens, from its metrics rows.

    An iteration whose row has ``policy/grad_norm`` (``critic/grad_norm``) updated the policy (the
    critic); the update takes ``epochs x min(minibatches, traces)`` such steps on a batch (times
    ``critic_updates`` for the critic), and the pre-training phase ``rl.critic_pretrain_steps``.
    """
    rl = cfg.rl
    iters = [r for r in rows if r.get("iteration", 0) > 0]

    def steps(r: dict) -> float:
        traces = r.get("train/episodes", 0.0) * r.get("train/traces_per_episode", 0.0)
        return rl.epochs * min(rl.minibatches, max(1, round(traces)))

    pretrain_batches = rows[0].get("pretrain/batches", 0.0) if rows else 0.0
    return {
        "episodes": sum(r.get("train/episodes", 0.0) for r in iters),
        "critic_pretrain_episodes": pretrain_batches * rl.episodes_per_iter,
        "policy_steps": float(sum(steps(r) for r in iters if "policy/grad_norm" in r)),
        "critic_steps": float((rl.critic_pretrain_steps if pretrain_batches else 0)
                              + sum(steps(r) * rl.critic_updates for r in iters if "critic/grad_norm" in r)),
        "generated_tokens": sum(r.get("train/generated_tokens_per_episode", 0.0) * r.get("train/episodes", 0.0)
                                for r in iters),
    }


def progress(rows: list[dict]) -> list[list[float]]:
    """``[iteration, policy-training episodes, generated tokens]`` so far, after each iteration (cumulative)."""
    episodes = tokens = 0.0
    out = []
    for r in sorted((r for r in rows if r.get("iteration", 0) > 0), key=lambda r: r["iteration"]):
        episodes += r.get("train/episodes", 0.0)
        tokens += r.get("train/generated_tokens_per_episode", 0.0) * r.get("train/episodes", 0.0)
        out.append([r["iteration"], episodes, tokens])
    return out


def _critic_row(rows: list[dict], *, last: bool) -> dict[str, float]:
    """``critic/trace_start*`` figures of the last evaluated row (empty when none has them)."""
    evaluated = [r for r in rows if "eval/critic/trace_start_auc" in r]
    if not evaluated:
        return {}
    row = evaluated[-1] if last else evaluated[0]
    return {k[len("eval/"):]: v for k, v in row.items() if k.startswith("eval/critic/trace_start")}


MISMATCH_KEYS = ("policy/tis_clip_fraction", "policy/tis_weight_mean", "policy/mis_drop_fraction")
"""Beside every ``mismatch/*`` figure: what the importance corrections did."""
TIMING_KEYS = ("train/wait_s", "train/staleness_mean", "train/staleness_max", "train/stale_dropped",
               "train/episodes_in_flight")
"""Beside every ``time/*`` figure: asynchronous collection's waiting and staleness."""


def iteration_means(rows: list[dict], prefix: str, keys: tuple[str, ...] = ()) -> dict[str, float]:
    """The policy iterations' mean of every figure named ``prefix...`` or in ``keys`` (those present)."""
    iters = [r for r in rows if r.get("iteration", 0) > 0]
    names = sorted({k for r in iters for k in r if k.startswith(prefix) or k in keys})
    return {k: v for k in names if (v := _mean([r.get(k) for r in iters])) is not None}


def check_rows(rows: list[dict], run_dir: Path) -> None:
    """A finished run's metrics rows are its iterations 0, 1, ..., in order, once each; anything else means
    another process wrote into ``run_dir`` and the cell's figures would be wrong (:class:`ValueError`)."""
    iterations = [r.get("iteration") for r in rows]
    if iterations != list(range(len(rows))):
        raise ValueError(f"{run_dir}/metrics.jsonl: iterations {iterations}, expected 0, 1, ... once each "
                         "(rows from another process); delete the run directory and run the cell again")


def run_cell(spec: dict[str, Any]) -> dict[str, Any]:
    """Train one (regime, arm, seed), evaluate its final model, write ``cells/<name>.json``."""
    from compactrl.provenance import cpu_model
    from compactrl.training.config import TrainConfig
    from compactrl.training.run_dir import RunDir
    from compactrl.training.trainer import train

    t0, cpu0 = time.perf_counter(), time.process_time()
    cfg, run_dir = TrainConfig.from_dict(spec["config"]), Path(spec["run_dir"])
    if not (run_dir / "report.md").exists():
        if (run_dir / "config.json").exists() and not (run_dir / "checkpoint.pt").exists():
            shutil.rmtree(run_dir)  # stopped before its first checkpoint: nothing to resume, start over
        train(cfg, run_dir, resume=(run_dir / "checkpoint.pt").exists())
    rows = RunDir(run_dir).rows()
    check_rows(rows, run_dir)
    t_eval = time.perf_counter()
    record = {
        "regime": spec["regime"], "arm": spec["arm"], "seed": spec["seed"],
        "curve": [[r["iteration"], r["eval/success_rate"]] for r in rows
                  if "eval/success_rate" in r and r["iteration"] > 0],
        "episodes": final_evaluation(cfg, str(run_dir / "final_model"), spec["final_episodes"]),
        "final_eval_s": time.perf_counter() - t_eval,
        "counts": compute_counts(cfg, rows),
        "progress": progress(rows),
        # the critic's held-out diagnostics (trainer keys eval/critic/...): at its last evaluation, and
        # at iteration 0, right after critic pre-training
        "critic": _critic_row(rows, last=True),
        "critic_after_pretrain": _critic_row([r for r in rows if r["iteration"] == 0], last=True),
        # per-iteration means: the sampler-learner mismatch before each update and the corrections' shares;
        # where the iteration's time went, with asynchronous collection's waiting and staleness
        "mismatch": iteration_means(rows, "mismatch/", MISMATCH_KEYS),
        "timing": iteration_means(rows, "time/", TIMING_KEYS),
        "wall_clock_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - cpu0,  # what the cell costs whatever else runs on the machine
        "machine": f"{cpu_model()}, {os.cpu_count()} CPUs",  # cells of one experiment may come from several
        "load_average": os.getloadavg()[0],
    }
    write_json(Path(spec["cell_path"]), record)
    return record


def run_sft(spec: dict[str, Any]) -> dict[str, Any]:
    """The regime's SFT model (trained once) and its held-out episodes (iteration 0 of every curve)."""
    from compactrl.training.config import TrainConfig, override
    from compactrl.training.run_dir import RunDir
    from compactrl.training.trainer import train

    t0, cpu0 = time.perf_counter(), time.process_time()
    cfg, run_dir = TrainConfig.from_dict(spec["config"]), Path(spec["run_dir"])
    model = spec.get("model") or str(run_dir / "sft_model")  # given: another regime's SFT model
    if not spec.get("model") and not (run_dir / "report.md").exists():
        train(override(cfg, {"rl.iterations": 0, "rl.critic_pretrain_steps": 0, "eval.initial": False}), run_dir,
              resume=(run_dir / "checkpoint.pt").exists())
    record = {"regime": spec["regime"], "model": model,
              "episodes": final_evaluation(cfg, model, spec["final_episodes"]),
              "time_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0,
              "rows": RunDir(run_dir).rows()[:1]}
    write_json(Path(spec["cell_path"]), record)
    return record


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` to ``path`` atomically (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


# -- statistics ------------------------------------------------------------------------------------

_T80 = {1: 1.376, 2: 1.061, 3: 0.978, 4: 0.941, 5: 0.920, 6: 0.906, 7: 0.896, 8: 0.889, 9: 0.883,
        10: 0.879, 11: 0.876, 12: 0.873, 13: 0.870, 14: 0.868, 15: 0.866}
"""One-sided 80% quantiles of Student's t by degrees of freedom (0.842 beyond)."""


def paired(a: list[float], b: list[float]) -> dict[str, float]:
    """Paired difference ``a - b`` over seeds: mean, 95% t-interval, and the minimum detectable
    effect of a two-sided 5% paired t-test at 80% power, ``(t_0.975 + t_0.8) * sd / sqrt(n)``."""
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    mean, lo, hi = t_interval(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else float("nan")
    mde = (_T975.get(n - 1, 1.96) + _T80.get(n - 1, 0.842)) * sd / math.sqrt(n) if n > 1 else float("nan")
    return {"n": n, "mean_diff": mean, "ci95": [lo, hi], "sd_diff": sd, "mde80": mde}


def auc(curve: list[list[float]], sft_success: float) -> float:
    """Mean held-out success over iterations 0..N (trapezoids; iteration 0 is the SFT model)."""
    pts = sorted({0: sft_success, **{int(i): s for i, s in curve}}.items())
    if len(pts) < 2:
        return pts[0][1]
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(pts, pts[1:]))
    return area / (pts[-1][0] - pts[0][0])


def _mean(xs: list[float | None]) -> float | None:
    """Mean of the values that are there (None when none is)."""
    xs = [x for x in xs if x is not None and x == x]
    return sum(xs) / len(xs) if xs else None


def _with_final(curve: list[list[float]], final: float) -> list[list[float]]:
    """The trainer's curve with its last point replaced by the full final evaluation."""
    if not curve:
        return []
    last = max(int(i) for i, _ in curve)
    return [pt for pt in curve if int(pt[0]) != last] + [[last, final]]


def long_chain_tasks(sft_episodes: list[list]) -> tuple[set[int], int]:
    """Tasks whose SFT chain is in its top quarter: the smallest length ``L`` with at least a
    quarter of the tasks at ``>= L`` traces; fixed by the shared SFT model, so arms compare on the
    same tasks."""
    lengths = sorted((e[2] for e in sft_episodes), reverse=True)
    threshold = lengths[max(0, math.ceil(len(lengths) / 4) - 1)] if lengths else 1
    return {e[0] for e in sft_episodes if e[2] >= threshold}, threshold


THRESHOLD_GAIN = 0.10
"""Sample efficiency: the success threshold of a regime is its SFT model's held-out success + this."""


def to_threshold(curve: list[list[float]], prog: list[list[float]], threshold: float) -> tuple[float, float, bool]:
    """Policy-training episodes and generated tokens spent when the held-out curve (its last point the
    full final evaluation) first reaches ``threshold``, and whether it did; a run that never does is
    censored at its whole budget (its figures are then a lower bound)."""
    spent = {int(i): (e, t) for i, e, t in prog}
    for i, success in sorted(curve):
        if success >= threshold and int(i) in spent:
            return (*spent[int(i)], True)
    last = max(spent) if spent else 0
    return (*spent.get(last, (0.0, 0.0)), False)


def _efficiency(cells: list[dict], finals: list[float], threshold: float) -> dict[str, Any]:
    """Episodes and tokens to ``threshold`` per seed (censored at the budget), with t-intervals."""
    if not all("progress" in c for c in cells):
        return {}
    hits = [to_threshold(_with_final(c["curve"], f), c["progress"], threshold) for c, f in zip(cells, finals)]
    eps, toks = [h[0] for h in hits], [h[1] for h in hits]
    return {"threshold": threshold, "reached_threshold": sum(h[2] for h in hits),
            "episodes_to_threshold_per_seed": eps, "tokens_to_threshold_per_seed": toks,
            "episodes_to_threshold": dict(zip(("mean", "lo", "hi"), t_interval(eps))),
            "tokens_to_threshold": dict(zip(("mean", "lo", "hi"), t_interval(toks)))}


def success(cell: dict) -> float:
    """A cell's (or SFT record's) held-out success: the share of its final ``episodes`` solved."""
    return sum(e[1] for e in cell["episodes"]) / max(1, len(cell["episodes"]))


def arm_seeds(cells: list[dict], arm: str) -> list[dict]:
    """The cells of ``arm``, by seed."""
    return sorted((c for c in cells if c["arm"] == arm), key=lambda c: c["seed"])


def summarize_arm(cells: list[dict], sft_success: float, long_tasks: set[int]) -> dict[str, Any]:
    cells = sorted(cells, key=lambda c: c["seed"])
    final = [success(c) for c in cells]
    aucs = [auc(_with_final(c["curve"], f), sft_success) for c, f in zip(cells, final)]
    long = [[e[1] for e in c["episodes"] if e[0] in long_tasks] for c in cells]
    k, n = sum(sum(e[1] for e in c["episodes"]) for c in cells), sum(len(c["episodes"]) for c in cells)
    counts = {key: sum(c["counts"][key] for c in cells) / len(cells) for key in cells[0]["counts"]}
    return {
        "seeds": [c["seed"] for c in cells], "final_per_seed": final,
        "final": dict(zip(("mean", "lo", "hi"), t_interval(final))), "pooled_wilson": list(wilson(k, n)),
        "auc_per_seed": aucs, "auc": dict(zip(("mean", "lo", "hi"), t_interval(aucs))),
        "long_chain_per_seed": [sum(x) / len(x) if x else float("nan") for x in long],
        "long_chain_pooled_wilson": list(wilson(sum(map(sum, long)), sum(map(len, long)))),
        "traces_per_episode": sum(e[2] for c in cells for e in c["episodes"]) / max(1, n),
        "critic_trace_start_auc": _mean([c.get("critic", {}).get("critic/trace_start_auc") for c in cells]),
        "critic_trace_start_auc_after_pretrain": _mean(
            [c.get("critic_after_pretrain", {}).get("critic/trace_start_auc") for c in cells]),
        "counts_per_seed": counts, "cell_wall_clock_s": sum(c["wall_clock_s"] for c in cells) / len(cells),
        "cell_cpu_s": sum(c.get("cpu_s", float("nan")) for c in cells) / len(cells),
        **_efficiency(cells, final, sft_success + THRESHOLD_GAIN),
    }


def aggregate(cells: list[dict], sfts: dict[str, dict]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for regime, sft in sfts.items():
        sft_success = success(sft)
        long_tasks, threshold = long_chain_tasks(sft["episodes"])
        arms = {}
        for arm in ARMS:
            mine = [c for c in cells if c["regime"] == regime and c["arm"] == arm]
            if mine:
                arms[arm] = summarize_arm(mine, sft_success, long_tasks)
        out[regime] = {"sft_success": sft_success, "long_chain_min_traces": threshold,
                       "long_chain_tasks": len(long_tasks), "arms": arms, "paired": comparisons(arms)}
    return out


def comparisons(arms: dict[str, dict]) -> dict[str, dict]:
    """:func:`paired` differences of final success, AUC and longest-chain success for each of
    :data:`PAIRS` present, over the seeds both arms finished."""
    def per_seed(arm: str, key: str, seeds: set[int]) -> list[float]:
        return [v for s, v in zip(arms[arm]["seeds"], arms[arm][f"{key}_per_seed"]) if s in seeds]

    out = {}
    for a, b in PAIRS:
        if a in arms and b in arms:
            seeds = set(arms[a]["seeds"]) & set(arms[b]["seeds"])
            keys = ["final", "auc", "long_chain"]
            keys += ["episodes_to_threshold"] if all("threshold" in arms[x] for x in (a, b)) else []
            out[f"{a} - {b}"] = {key: paired(per_seed(a, key, seeds), per_seed(b, key, seeds)) for key in keys}
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _efficiency_lines(r: dict[str, Any]) -> list[str]:
    """The sample-efficiency table of a regime (arms whose cells record their progress)."""
    arms = {arm: a for arm, a in r["arms"].items() if "threshold" in a}
    if not arms:
        return []
    threshold = next(iter(arms.values()))["threshold"]
    lines = ["", f"Sample efficiency: threshold {threshold:.3f} held-out success (SFT + {THRESHOLD_GAIN}); a run that "
                 "never reaches it is counted at its whole budget (a lower bound).", "",
             "| arm | seeds reaching it | policy-training episodes to it (95% CI) | generated tokens to it (95% CI) |",
             "|---|---|---|---|"]
    for arm, a in arms.items():
        e, t = a["episodes_to_threshold"], a["tokens_to_threshold"]
        lines.append(f"| {arm} | {a['reached_threshold']}/{len(a['seeds'])} | {e['mean']:.1f} [{e['lo']:.1f}, "
                     f"{e['hi']:.1f}] | {t['mean']:.0f} [{t['lo']:.0f}, {t['hi']:.0f}] |")
    paired_rows = [(name, p["episodes_to_threshold"]) for name, p in r["paired"].items() if "episodes_to_threshold" in p]
    if paired_rows:
        lines += ["", "| paired over seeds (a - b) | episodes to threshold: diff [95% CI], MDE80 |", "|---|---|"]
        lines += [f"| {name} (n={q['n']}) | {q['mean_diff']:+.1f} [{q['ci95'][0]:+.1f}, {q['ci95'][1]:+.1f}], "
                  f"{q['mde80']:.1f} |" for name, q in paired_rows]
    return lines


def markdown(results: dict[str, Any]) -> str:
    lines = [f"Boundary experiment ({results['budget']} budget): {results['config_summary']}", ""]
    for regime, r in results["regimes"].items():
        lines += [f"## Regime `{regime}`", "",
                  f"SFT model: held-out success {r['sft_success']:.3f}; longest-chain tasks: "
                  f"{r['long_chain_tasks']} with >= {r['long_chain_min_traces']} traces under the SFT model.", "",
                  "| arm | seeds | final success (95% CI, seeds) | pooled Wilson | AUC (95% CI) | longest-chain success "
                  "(pooled Wilson) | traces/ep | episodes | critic pre-train episodes | policy steps | critic steps "
                  "| generated tokens | min/cell (wall, CPU) | critic trace-start AUC (after pre-training, at the end) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for arm, a in r["arms"].items():
            f, u, c = a["final"], a["auc"], a["counts_per_seed"]
            lc = [x for x in a["long_chain_per_seed"] if x == x]
            lines.append(
                f"| {arm} | {len(a['seeds'])} | {f['mean']:.3f} [{f['lo']:.3f}, {f['hi']:.3f}] | "
                f"[{a['pooled_wilson'][0]:.3f}, {a['pooled_wilson'][1]:.3f}] | {u['mean']:.3f} [{u['lo']:.3f}, {u['hi']:.3f}] | "
                f"{(sum(lc) / len(lc) if lc else float('nan')):.3f} [{a['long_chain_pooled_wilson'][0]:.3f}, "
                f"{a['long_chain_pooled_wilson'][1]:.3f}] | {a['traces_per_episode']:.2f} | {c['episodes']:.0f} | "
                f"{c['critic_pretrain_episodes']:.0f} | {c['policy_steps']:.0f} | {c['critic_steps']:.0f} | "
                f"{c['generated_tokens']:.0f} | {a['cell_wall_clock_s'] / 60:.1f}, {a['cell_cpu_s'] / 60:.1f} | "
                f"{_fmt(a['critic_trace_start_auc_after_pretrain'])}, {_fmt(a['critic_trace_start_auc'])} |")
        lines += ["", "| paired over seeds (a - b) | final: diff [95% CI], MDE80 | AUC: diff [95% CI], MDE80 | "
                      "longest chain: diff [95% CI], MDE80 |", "|---|---|---|---|"]
        for name, p in r["paired"].items():
            lines.append(f"| {name} (n={p['final']['n']}) | " + " | ".join(
                f"{p[k]['mean_diff']:+.3f} [{p[k]['ci95'][0]:+.3f}, {p[k]['ci95'][1]:+.3f}], {p[k]['mde80']:.3f}"
                for k in ("final", "auc", "long_chain")) + " |")
        lines += _efficiency_lines(r)
        lines.append("")
    lines.append(f"Command: `{results['command']}`; {results['cells']} cells, {results['wall_clock_s'] / 60:.1f} min "
                 f"in this invocation ({results['machine']}).")
    return "\n".join(lines) + "\n"


# -- the regimes, measured with the scripted oracle ---------------------------------------------------


def oracle_table(regimes: list[str], episodes: int, qualities=(1.0, 0.5)) -> str:
    """Chain lengths and success of :class:`~compactrl.policies.scripted.code.OraclePolicy` on each
    regime's held-out tasks (the experiment's env, budget and limits), per summary quality."""
    from collections import Counter

    from compactrl.eval.episodes import evaluate_policy
    from compactrl.policies.scripted.code import OraclePolicy
    from compactrl.training.rollouts import make_env_fns

    lines = ["| regime | summary quality | success | traces/ep | episodes by traces (success) |", "|---|---|---|---|---|"]
    for regime in regimes:
        cfg = regime_config("full", regime, threads=1)
        for q in qualities:
            fns = make_env_fns(cfg.env, split=cfg.eval.split, count=8)
            agg, stats = evaluate_policy(fns, OraclePolicy(summary_quality=q), episodes=episodes, seed=cfg.eval.seed,
                                         give_task_to_policy=True)
            by = Counter(s.num_traces for s in stats)
            strata = ", ".join(f"{k}: {n} ({sum(s.success for s in stats if s.num_traces == k) / n:.2f})"
                               for k, n in sorted(by.items()))
            lines.append(f"| {regime} | {q} | {agg['success_rate']:.3f} | {agg['traces_per_episode']:.2f} | {strata} |")
    return "\n".join(lines) + "\n\n" + demonstrator_table(regimes, episodes, qualities)


def demonstrator_table(regimes: list[str], episodes: int, qualities=(1.0, 0.5), seeds: int = 4) -> str:
    """The SFT demonstrator (``ReadingOrderOracle(reproduce_first=True)``) on each regime's held-out tasks,
    ``seeds`` demonstrator seeds per task: how much one task's chain length varies between its episodes."""
    import statistics

    from compactrl.eval.episodes import evaluate_policy
    from compactrl.policies.scripted.demonstrators import ReadingOrderOracle
    from compactrl.training.rollouts import make_env_fns

    lines = [f"| regime | summary quality | success | traces/ep | mean within-task sd ({seeds} seeds) | tasks with "
             "unequal counts |", "|---|---|---|---|---|---|"]
    for regime in regimes:
        cfg = regime_config("full", regime, threads=1)
        for q in qualities:
            per_task: dict[int, list] = {}
            for seed in range(seeds):
                fns = make_env_fns(cfg.env, split=cfg.eval.split, count=8)
                _, stats = evaluate_policy(fns, ReadingOrderOracle(summary_quality=q, seed=seed, reproduce_first=True),
                                           episodes=episodes, seed=cfg.eval.seed, give_task_to_policy=True)
                for st in stats:
                    per_task.setdefault(st.task_seed, []).append(st)
            runs = [st for v in per_task.values() for st in v]
            counts = [[st.num_traces for st in v] for v in per_task.values()]
            lines.append(f"| {regime} | {q} | {sum(st.success for st in runs) / len(runs):.3f} | "
                         f"{statistics.mean(st.num_traces for st in runs):.2f} | "
                         f"{statistics.mean(statistics.pstdev(c) for c in counts):.2f} | "
                         f"{sum(len(set(c)) > 1 for c in counts) / len(counts):.2f} |")
    return "\n".join(lines) + "\n"


# -- the regimes' within-group trace-count spread, measured with their SFT models ----------------------


def trace_spread(cfg, model_dir: str, groups: int, group_size: int = 4) -> dict[str, Any]:
    """Trace counts of ``groups`` held-out tasks x ``group_size`` rollouts each, sampled as training samples
    (temperature ``model.temperature``, GRPO's groups: every rollout of a group on the same task)."""
    import statistics

    import torch

    from compactrl.collectors.trace_collector import TraceCollector
    from compactrl.tokenizer import load_tokenizer
    from compactrl.training.config import override
    from compactrl.training.rollouts import build_policy, make_env_fns

    torch.set_num_threads(cfg.threads)
    tokenizer = load_tokenizer()
    policy, _ = build_policy(override(cfg, {"model.pretrained": model_dir}), tokenizer)
    collector = TraceCollector(make_env_fns(cfg.env, split=cfg.eval.split, count=cfg.env.num_envs), policy,
                               episodes_per_batch=groups * group_size, group_size=group_size, seed=cfg.eval.seed,
                               pad_id=tokenizer.pad_token_id or 0)
    try:
        collector.next()
        stats = collector.last_episode_stats
    finally:
        collector.shutdown()
    by_group: dict[int, list] = {}
    for st in stats:
        by_group.setdefault(st.group_id, []).append(st)
    counts = [[st.num_traces for st in g] for g in by_group.values()]
    return {
        "model": model_dir, "groups": len(counts), "group_size": group_size,
        "traces": counts,
        "traces_per_episode": statistics.mean(k for c in counts for k in c),
        "mean_within_group_sd": statistics.mean(statistics.pstdev(c) for c in counts),
        "mean_within_group_range": statistics.mean(max(c) - min(c) for c in counts),
        "unequal_groups": sum(len(set(c)) > 1 for c in counts) / len(counts),
        "mixed_success_groups": sum(0 < sum(int(st.success) for st in g) < len(g)
                                    for g in by_group.values()) / len(counts),
        "success": sum(st.success for st in stats) / len(stats),
        "histogram": {str(k): sum(x == k for c in counts for x in c) for k in sorted({x for c in counts for x in c})},
    }


def sft_model_of(regime: str, out: Path) -> str:
    """The SFT model of ``regime``: from ``out``'s cells, else from the committed boundary experiment's."""
    root = Path(__file__).resolve().parent.parent
    for cells in (out / "cells", root / "benchmarks" / "results" / "boundary_experiment" / "cells"):
        path = cells / f"{regime}__sft.json"
        if path.exists():
            model = Path(json.loads(path.read_text())["model"])
            return str(model if model.is_absolute() else root / model)
    raise SystemExit(f"no SFT model of {regime!r} under {out / 'cells'}: run --sft-only first")


def spread_report(spreads: dict[str, dict], png: Path) -> str:
    """The spread table (markdown) and a histogram per regime at ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    lo = min(int(k) for s in spreads.values() for k in s["histogram"])
    hi = max(int(k) for s in spreads.values() for k in s["histogram"])
    width = 0.8 / len(spreads)
    for i, (regime, s) in enumerate(spreads.items()):
        n = sum(s["histogram"].values())
        xs = list(range(lo, hi + 1))
        axes[0].bar([x + i * width for x in xs], [s["histogram"].get(str(x), 0) / n for x in xs], width, label=regime)
        ranges = [max(c) - min(c) for c in s["traces"]]
        axes[1].bar([x + i * width for x in range(hi - lo + 1)],
                    [sum(r == x for r in ranges) / len(ranges) for x in range(hi - lo + 1)], width, label=regime)
    centre = (len(spreads) - 1) * width / 2
    axes[0].set_xticks([x + centre for x in range(lo, hi + 1)], [str(x) for x in range(lo, hi + 1)])
    axes[1].set_xticks([x + centre for x in range(hi - lo + 1)], [str(x) for x in range(hi - lo + 1)])
    axes[0].set(xlabel="traces per episode", ylabel="share of episodes", title="Trace counts (SFT model, sampled)")
    axes[1].set(xlabel="max - min traces within a group of 4 rollouts of one task", ylabel="share of groups",
                title="Within-group spread")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    lines = ["| regime | groups x rollouts | success | traces/ep | episodes by traces | mean within-group sd | "
             "mean within-group range | groups with unequal counts | groups with mixed success |",
             "|---|---|---|---|---|---|---|---|---|"]
    for regime, s in spreads.items():
        hist = ", ".join(f"{k}: {v}" for k, v in s["histogram"].items())
        lines.append(f"| {regime} | {s['groups']} x {s['group_size']} | {s['success']:.3f} | {s['traces_per_episode']:.2f} | "
                     f"{hist} | {s['mean_within_group_sd']:.2f} | {s['mean_within_group_range']:.2f} | "
                     f"{s['unequal_groups']:.2f} | {s['mixed_success_groups']:.2f} |")
    return "\n".join(lines) + "\n"


# -- the command -----------------------------------------------------------------------------------


def _exit_with_parent(parent: int) -> None:
    """Pool initializer: end this worker as soon as the process that started it is gone. A killed run
    (a stop, ``kill``) then leaves no worker training on into a run directory that the restarted run
    makes again, where its rows would mix with the new run's."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _run_all(fn, specs: list[dict], jobs: int, ray_address: str | None = None, threads: int = 1) -> None:
    """``fn(spec)`` for every spec: in this process, in ``jobs`` processes, or (``ray_address`` not None;
    "" = a local Ray) as Ray tasks of ``threads`` CPUs, never starting one whose cell file exists."""
    if ray_address is not None and specs:
        import ray.cloudpickle

        from compactrl.distributed import ray_for_run, run_on_ray

        if __name__ != "__main__":  # imported (tests): the workers cannot import this script by name
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        with ray_for_run(ray_address):
            run_on_ray(fn, specs, max_concurrency=jobs, done=lambda s: Path(s["cell_path"]).exists(), num_cpus=threads)
        return
    if jobs <= 1 or len(specs) <= 1:
        for spec in specs:
            fn(spec)
        return
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=_exit_with_parent,
                             initargs=(os.getpid(),)) as pool:
        for spec, future in [(s, pool.submit(fn, s)) for s in specs]:
            future.result()
            log.info("finished %s", spec["cell_path"])


def arm_cells(out: Path, regime: str, base, arms: dict[str, dict[str, Any]], seeds: int, sft_model: str, *,
              final_episodes: int, jobs: int, threads: int) -> list[dict]:
    """The cells of an arms experiment outside :data:`ARMS` (``benchmarks/mismatch_experiment.py``,
    ``benchmarks/async_rollouts_bench.py``): every (arm, seed) starts from ``sft_model`` with ``base``
    and the arm's changes; missing cells run (:func:`run_cell`), seed by seed, then all are read back."""
    from compactrl.training.config import override

    specs = [{"regime": regime, "arm": a, "seed": s, "final_episodes": final_episodes,
              "config": override(base, {**changes, "seed": s, "model.pretrained": sft_model,
                                        "sft.enabled": False}).to_dict(),
              "run_dir": str(out / a / f"seed{s}"), "cell_path": str(out / "cells" / f"{a}__seed{s}.json")}
             for s in range(seeds) for a, changes in arms.items()]
    todo = [s for s in specs if not Path(s["cell_path"]).exists()]
    log.info("%d cells, %d to run (%d finished)", len(specs), len(todo), len(specs) - len(todo))
    _run_all(run_cell, todo, jobs, None, threads)
    return [json.loads(Path(s["cell_path"]).read_text()) for s in specs]


def interval(xs: list[float]) -> dict[str, float]:
    """Mean and 95% t-interval of ``xs`` as ``{"mean", "lo", "hi"}``."""
    return dict(zip(("mean", "lo", "hi"), t_interval(xs)))


def paired_by_seed(a: dict[int, float], b: dict[int, float]) -> dict[str, float] | None:
    """:func:`paired` ``a - b`` over the seeds both have (None when they share none)."""
    common = sorted(set(a) & set(b))
    return paired([a[s] for s in common], [b[s] for s in common]) if common else None


def paired_success(arms: dict[str, dict], pairs: list[tuple[str, str]]) -> dict[str, dict]:
    """``a - b`` final success for each pair of arms both summarised (``seeds``, ``final_per_seed``), paired
    over the seeds both finished (:func:`paired_by_seed`); pairs without a common seed are left out."""
    per_seed = {arm: dict(zip(r["seeds"], r["final_per_seed"])) for arm, r in arms.items()}
    out = {f"{a} - {b}": paired_by_seed(per_seed[a], per_seed[b]) for a, b in pairs if a in arms and b in arms}
    return {k: v for k, v in out.items() if v is not None}


def paired_lines(pairs: dict[str, dict], what: str) -> list[str]:
    """The markdown table of :func:`paired` differences of ``what``, one row per pair."""
    lines = ["| paired over seeds (a - b) | " + what + ": diff [95% CI], MDE80 |", "|---|---|"]
    return lines + [f"| {name} (n={d['n']}) | {d['mean_diff']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}], "
                    f"{d['mde80']:.3f} |" for name, d in pairs.items()]


def cell_machines(cells: list[dict]) -> dict[str, list[str]]:
    """Which machine ran which cells (``arm seedN``), as the cells recorded it ("unrecorded" for cells
    written before cells recorded it)."""
    out: dict[str, list[str]] = {}
    for c in sorted(cells, key=lambda c: (c["seed"], c["arm"])):
        out.setdefault(c.get("machine", "unrecorded"), []).append(f"{c['arm']} seed{c['seed']}")
    return out


def provenance_line(results: dict[str, Any]) -> str:
    """Where a table comes from: its command, the machine and the load when it was written, and the
    machines its cells ran on when more than one did."""
    line = f"Command: `{results['command']}`; {results['machine']}; load average at the end {results['load_average']}."
    if len(machines := results.get("cell_machines", {})) > 1:
        line += " Cells ran on: " + "; ".join(f"{m} ({', '.join(cs)})" for m, cs in machines.items()) + "."
    return line


def arms_parser(description: str, out: str) -> argparse.ArgumentParser:
    """The options every arms experiment takes (:func:`arm_cells`): ``--out``, ``--seeds``, ``--resume``,
    ``--final-episodes`` and ``--set``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", default=out, help="output directory (cells/, runs, results.json/md)")
    p.add_argument("--seeds", type=int, default=4, help="seeds per arm")
    p.add_argument("--resume", action="store_true", help="keep finished cells (and the SFT model); run the rest")
    p.add_argument("--final-episodes", type=int, default=64, help="held-out episodes per final evaluation")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field of every run (dotted name, JSON value)")
    return p


def start_arms(args: argparse.Namespace) -> tuple[Path, float]:
    """Logging on, the output directory checked (``--resume`` to add to one that holds cells), the start time."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = Path(args.out)
    if (out / "cells").exists() and not args.resume:
        raise SystemExit(f"{out} already holds cells: pass --resume to keep them, or choose another --out")
    return out, time.perf_counter()


def write_results(out: Path, results: dict[str, Any], markdown_fn) -> int:
    """``results.json`` and ``results.md`` (``markdown_fn(results)``) in ``out``, the table printed."""
    write_json(out / "results.json", results)
    text = markdown_fn(results)
    (out / "results.md").write_text(text)
    print(text)  # noqa: T201 - benchmark output
    return 0


def fmt_interval(d: dict[str, float] | None, fmt: str = "{:.3f}") -> str:
    """``mean [lo, hi]`` of an :func:`interval` ('-' for none)."""
    if not d:
        return "-"
    return f"{fmt.format(d['mean'])} [{fmt.format(d['lo'])}, {fmt.format(d['hi'])}]"


def _spread(regimes: list[str], out: Path, groups: int, extra: dict[str, Any]) -> int:
    """``--spread``: each regime's trace-count spread under its SFT model, written to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    old = json.loads((out / "spread.json").read_text()) if (out / "spread.json").exists() else {}
    spreads = {**old, **{r: trace_spread(regime_config("full", r, 1, extra), sft_model_of(r, out), groups)
                         for r in regimes}}  # measured regimes replace their earlier figures, the others stay
    write_json(out / "spread.json", spreads)
    table = spread_report(spreads, out / "trace_counts.png")
    (out / "spread.md").write_text(table)
    print(table)  # noqa: T201 - benchmark output
    return 0


def _source_model(src: str, source_spec) -> str:
    """The model ``SFT_FROM`` names: a regime's SFT model (``source_spec()``, trained here if its cell is
    missing) or, for a path, that saved model (relative to the repository root)."""
    if src not in REGIMES:
        return str(Path(__file__).resolve().parent.parent / src)
    source = source_spec()
    if not Path(source["cell_path"]).exists():
        run_sft(source)
    return json.loads(Path(source["cell_path"]).read_text())["model"]


def main(argv: list[str] | None = None) -> int:
    import platform

    from compactrl.training.config import override

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/boundary", help="output directory (cells/, runs, results.json/md)")
    p.add_argument("--smoke", action="store_true", help="the CI budget: the smoke preset, 2 seeds, seconds")
    p.add_argument("--resume", action="store_true", help="keep finished cells and SFT models; run the rest")
    p.add_argument("--seeds", type=int, default=None, help="seeds per arm (default: 8, --thesis 16; smoke 2)")
    p.add_argument("--arms", default=None, help=f"comma-separated arms of {sorted(ARMS)} "
                   f"(default: {','.join(BOUNDARY_ARMS)}; --thesis {THESIS['arms']})")
    p.add_argument("--regimes", default=None, help=f"comma-separated regimes of {sorted(REGIMES)} "
                   f"(default: {','.join(BOUNDARY_REGIMES)}; --thesis {THESIS['regimes']})")
    p.add_argument("--spread", type=int, default=0, metavar="GROUPS",
                   help="only measure each regime's within-group trace-count spread with its SFT model on GROUPS "
                        "held-out tasks x 4 sampled rollouts (spread.{json,md}, trace_counts.png in --out)")
    p.add_argument("--sft-only", action="store_true", help="train and evaluate the regimes' SFT models, then stop")
    p.add_argument("--thesis", action="store_true",
                   help="PPO vs the GRPO variants on variable_chain (its regime, arms and 16 seeds as defaults)")
    p.add_argument("--jobs", type=int, default=2, help="cells run in parallel, one torch thread each")
    p.add_argument("--ray", action="store_true", help="run the cells as tasks on a local Ray")
    p.add_argument("--ray-address", default=None, help="run the cells on this Ray cluster (host:port or auto)")
    p.add_argument("--final-episodes", type=int, default=None, help="held-out episodes per final evaluation")
    p.add_argument("--oracle", type=int, default=0, metavar="EPISODES",
                   help="only measure the regimes with the scripted oracle on EPISODES held-out tasks")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field of every run (dotted name, JSON value), e.g. --set rl.lr=3e-4")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    budget = "smoke" if args.smoke else "full"
    arms = (args.arms or (THESIS["arms"] if args.thesis else ",".join(BOUNDARY_ARMS))).split(",")
    regimes = (args.regimes or (THESIS["regimes"] if args.thesis else ",".join(BOUNDARY_REGIMES))).split(",")
    bad = [a for a in arms if a not in ARMS] + [r for r in regimes if r not in REGIMES]
    if bad:
        raise SystemExit(f"unknown arms/regimes {bad}; arms: {sorted(ARMS)}, regimes: {sorted(REGIMES)}")
    if args.oracle:
        print(oracle_table(regimes, args.oracle))  # noqa: T201 - benchmark output
        return 0
    if args.spread:
        return _spread(regimes, Path(args.out), args.spread, parse_sets(args.set))
    ray_address = args.ray_address if args.ray_address is not None else ("" if args.ray else None)
    out, t0 = Path(args.out), time.perf_counter()
    if ray_address is not None:
        out = out.resolve()  # Ray tasks may run on another node or in another directory
    if (out / "cells").exists() and not args.resume:
        raise SystemExit(f"{out} already holds cells: pass --resume to keep them, or choose another --out")
    seeds = args.seeds or (THESIS["seeds"] if args.thesis and not args.smoke else BUDGETS[budget]["seeds"])
    final_episodes = args.final_episodes or BUDGETS[budget]["final_episodes"]
    threads = 1 if args.jobs > 1 else 2
    bases = {r: regime_config(budget, r, threads, parse_sets(args.set)) for r in regimes}

    def spec(regime, name, config, run_dir, **extra):
        return {"regime": regime, "config": config.to_dict(), "run_dir": str(run_dir),
                "cell_path": str(out / "cells" / f"{name}.json"), "final_episodes": final_episodes, **extra}

    sft_specs = [spec(r, f"{r}__sft", bases[r], out / r / "sft") for r in regimes]
    for s in sft_specs:  # SFT_FROM: the other regime's SFT model (trained first if it has not been), or a saved one
        if s["regime"] in SFT_FROM:
            src, changes = SFT_FROM[s["regime"]]
            source_model = _source_model(src, lambda src=src: spec(
                src, f"{src}__sft", regime_config(budget, src, threads, parse_sets(args.set)), out / src / "sft"))
            if changes:  # continue the source's model on this regime's env
                s["config"] = override(bases[s["regime"]], {"model.pretrained": source_model, **changes}).to_dict()
            else:
                s["model"] = source_model
    _run_all(run_sft, [s for s in sft_specs if not Path(s["cell_path"]).exists()], args.jobs, ray_address, threads)
    sfts = {s["regime"]: json.loads(Path(s["cell_path"]).read_text()) for s in sft_specs}
    if args.sft_only:
        return 0
    cell_specs = [spec(r, f"{r}__{a}__seed{s}", arm_config(bases[r], a, s, sfts[r]["model"]), out / r / a / f"seed{s}",
                       arm=a, seed=s) for r in regimes for s in range(seeds) for a in arms]
    todo = [s for s in cell_specs if not Path(s["cell_path"]).exists()]
    log.info("%d cells, %d to run (%d finished)", len(cell_specs), len(todo), len(cell_specs) - len(todo))
    _run_all(run_cell, todo, args.jobs, ray_address, threads)
    cells = [json.loads(Path(s["cell_path"]).read_text()) for s in cell_specs]
    base = next(iter(bases.values()))
    results = {
        "command": " ".join(["python benchmarks/boundary_experiment.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {args.jobs} jobs",
        "budget": budget, "cells": len(cells), "cells_run_now": len(todo),
        "config_summary": (f"{base.rl.iterations} policy iterations x {base.rl.episodes_per_iter} episodes, "
                           f"{base.rl.critic_pretrain_steps} critic pre-training steps (PPO), curve every "
                           f"{base.eval.every} iterations on {base.eval.episodes} tasks, {final_episodes} held-out "
                           f"tasks at the end, {seeds} seeds"),
        "base_config": {r: dataclasses.asdict(b) for r, b in bases.items()},
        "regimes": aggregate(cells, sfts), "wall_clock_s": time.perf_counter() - t0,
    }
    write_json(out / "results.json", results)
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))  # noqa: T201 - benchmark output
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
