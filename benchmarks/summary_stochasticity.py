"""How much do a model's summaries vary at one context, and how much does that move success?

From one model snapshot (a saved model dir, e.g. ``RUN/sft_model`` or ``RUN/final_model``), on the
held-out tasks the trainer evaluates on, this script plays each episode greedily up to its first
forced summary, samples ``--samples`` summaries at that same context at temperature 1, and then
replays the episode once per sampled summary: the same greedy prefix (checked token for token
against the recorded context), the sampled summary in place of the greedy one, greedy after it.
It reports, as one JSON object:

* length spread: mean summary length (tokens) and the mean within-context coefficient of variation;
* agreement on kept facts: mean pairwise Jaccard of the ``KEY = VALUE`` keys kept under ``facts:``
  (both empty counts as agreement), the share of samples keeping the task's needed fact and its
  right value, and Fleiss' kappa of keep/drop of that fact across contexts;
* spread of downstream success: mean success over all (context, sample) pairs, success with the
  greedy summary, the mean within-context SD, the share of contexts whose samples disagree on
  success, the within-context share of the success variance, and success when the sampled summary
  kept / dropped the fact.

The environment and task split come from the run's ``config.json`` next to the model dir when there
is one (so a run trained on another regime is measured on it), else from ``--preset``.

    python benchmarks/summary_stochasticity.py runs/main/sft_model --out sft.json
    python benchmarks/summary_stochasticity.py runs/main/final_model --contexts 32 --samples 8

Before and after RL, per arm: ``--experiment DIR`` measures every regime's SFT model and the final
models of each arm's first ``--seeds`` seeds in a boundary-experiment output folder
(``benchmarks/boundary_experiment.py --out DIR``), one JSON per model under ``DIR/stochasticity/``
(a finished one is never measured again), and writes ``DIR/stochasticity.md``: per regime, the SFT
model's figures and each arm's mean over its seeds::

    python benchmarks/summary_stochasticity.py --experiment benchmarks/results/boundary_experiment --seeds 4
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from summary_keep_rate import first_summary_facts  # noqa: E402  (one parser of summaries)


@dataclass
class Context:
    """One held-out episode's first forced summary: its context and what was sampled there."""

    task_id: str
    prompt: tuple[int, ...]
    """Token ids of the context the summary is written at."""
    fact: dict | None
    """The task's needed fact (``task.metadata["facts"][0]``), when the task has one."""
    greedy_success: bool = False
    samples: list = field(default_factory=list)
    """The sampled summaries (``TokenResponse``)."""
    success: list = field(default_factory=list)
    """Downstream success per sample (None where the replayed prefix diverged)."""


class _Recorder:
    """Greedy policy that, at each episode's first summary request, samples ``n`` summaries there."""

    def __init__(self, greedy, sampler, n: int) -> None:
        self.greedy, self.sampler, self.n = greedy, sampler, n
        self.contexts: dict[str, Context] = {}

    def act(self, requests):
        out = self.greedy.act(requests)
        for req in requests:
            if req.compaction_required and req.task.id not in self.contexts:
                facts = (req.task.metadata or {}).get("facts") or [None]
                ctx = Context(req.task.id, tuple(req.prompt_token_ids), facts[0])
                ctx.samples = self.sampler.act([req] * self.n)
                self.contexts[req.task.id] = ctx
        return out


class _Replay:
    """Greedy policy that writes sample ``i`` as each episode's first summary, where the context
    is the recorded one (otherwise the prefix diverged: greedy, and the episode is not counted)."""

    def __init__(self, greedy, contexts: dict[str, Context], i: int) -> None:
        self.greedy, self.contexts, self.i = greedy, contexts, i
        self.forced: set[str] = set()
        self.diverged: set[str] = set()

    def act(self, requests):
        out: list[Any] = [None] * len(requests)
        rest = []
        for j, req in enumerate(requests):
            ctx = self.contexts.get(req.task.id)
            first = req.compaction_required and ctx is not None and req.task.id not in self.forced | self.diverged
            if first and tuple(req.prompt_token_ids) == ctx.prompt:
                self.forced.add(req.task.id)
                out[j] = ctx.samples[self.i]
            else:
                if first:
                    self.diverged.add(req.task.id)
                rest.append(j)
        for j, resp in zip(rest, self.greedy.act([requests[j] for j in rest]) if rest else []):
            out[j] = resp
        return out


def _play(cfg, policy, episodes: int, seed: int) -> dict[str, bool]:
    """Held-out episodes (the task-seed stream of ``seed``); task id -> success."""
    from compactrl.collectors.trace_collector import TraceCollector
    from compactrl.training.rollouts import make_env_fns

    fns = make_env_fns(cfg.env, split=cfg.eval.split, count=min(cfg.env.num_envs, episodes),
                       budget=cfg.eval.context_budget or None)
    collector = TraceCollector(fns, policy, episodes_per_batch=episodes, seed=seed, give_task_to_policy=True)
    try:
        collector.next()
    finally:
        collector.shutdown()
    return {s.task_id: s.success for s in collector.last_episode_stats}


def sample_and_replay(cfg, model_dir: str, *, contexts: int, samples: int, seed: int) -> list[Context]:
    """Record the first summary context of ``contexts`` held-out episodes, sample there, replay."""
    import torch

    from compactrl.policies.transformers_policy import TransformersPolicy
    from compactrl.tokenizer import load_tokenizer
    from compactrl.training.config import override
    from compactrl.training.rollouts import build_policy

    torch.set_num_threads(cfg.threads)
    cfg = override(cfg, {"model.pretrained": str(model_dir), "eval.temperature": 0.0})
    _, greedy = build_policy(cfg, load_tokenizer())  # the trainer's evaluation policy: greedy
    greedy.model.eval()
    sampler = TransformersPolicy(greedy.model, greedy.tokenizer, temperature=1.0, seed=seed,
                                 max_new_tokens=greedy.max_new_tokens, max_batch_size=greedy.max_batch_size)
    recorder = _Recorder(greedy, sampler, samples)
    greedy_success = _play(cfg, recorder, contexts, cfg.eval.seed)
    for ctx in recorder.contexts.values():
        ctx.greedy_success = greedy_success.get(ctx.task_id, False)
    for i in range(samples):
        replay = _Replay(greedy, recorder.contexts, i)
        success = _play(cfg, replay, contexts, cfg.eval.seed)
        for tid, ctx in recorder.contexts.items():
            ctx.success.append(success.get(tid) if tid in replay.forced else None)
    return list(recorder.contexts.values())


# -- the figures (pure) ---------------------------------------------------------------------------


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b|, 1 when both are empty (they agree on keeping nothing)."""
    return len(a & b) / len(a | b) if a | b else 1.0


def fleiss_kappa(counts: np.ndarray) -> float:
    """Fleiss' kappa of ``counts[subject, category]`` (the same number of raters per subject).

    NaN when every rating falls in one category (no chance-corrected agreement is defined).
    """
    counts = np.asarray(counts, dtype=np.float64)
    raters = counts.sum(1)
    if counts.shape[0] == 0 or raters.min() < 2 or raters.min() != raters.max():
        return math.nan
    n = raters[0]
    p_subject = ((counts**2).sum(1) - n) / (n * (n - 1))
    p_cat = counts.sum(0) / counts.sum()
    p_e = float((p_cat**2).sum())
    return math.nan if p_e >= 1.0 - 1e-12 else float((p_subject.mean() - p_e) / (1.0 - p_e))


def _mean(xs) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(xs)) if xs else math.nan


def context_figures(ctx: Context, tokenizer) -> dict[str, Any]:
    """Per context: summary lengths, kept keys, whether each keeps the needed fact, and outcomes."""
    texts = [tokenizer.decode(s.token_ids) for s in ctx.samples]
    kept = [first_summary_facts(t) for t in texts]
    lengths = [len(s.token_ids) for s in ctx.samples]
    key = ctx.fact["key"] if ctx.fact else None
    return {
        "task_id": ctx.task_id,
        "lengths": lengths,
        "kept_keys": [sorted(k) for k in kept],
        "keeps_fact": [key in k for k in kept] if key else None,
        "value_right": [k.get(key) == repr(ctx.fact["value"]) for k in kept] if key else None,
        "success": ctx.success,
        "greedy_success": ctx.greedy_success,
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The report's figures from :func:`context_figures` rows (NaN where nothing supports one)."""
    cv = [np.std(r["lengths"]) / np.mean(r["lengths"]) for r in rows if np.mean(r["lengths"]) > 0]
    jac = [np.mean([jaccard(set(a), set(b)) for a, b in itertools.combinations(r["kept_keys"], 2)])
           for r in rows if len(r["kept_keys"]) >= 2]
    with_fact = [r for r in rows if r["keeps_fact"] is not None]
    keep = np.array([[sum(r["keeps_fact"]), len(r["keeps_fact"]) - sum(r["keeps_fact"])] for r in with_fact])
    outcomes = [[float(s) for s in r["success"] if s is not None] for r in rows]
    scored = [o for o in outcomes if o]
    pooled = [s for o in scored for s in o]
    total_var = float(np.var(pooled)) if pooled else math.nan
    within_var = _mean([np.var(o) for o in scored])
    by_keep = {True: [], False: []}
    for r in with_fact:
        for k, s in zip(r["keeps_fact"], r["success"]):
            if s is not None:
                by_keep[k].append(float(s))
    return {
        "contexts": float(len(rows)),
        "summary_tokens_mean": _mean([np.mean(r["lengths"]) for r in rows]),
        "summary_tokens_cv": _mean(cv),
        "kept_keys_jaccard": _mean(jac),
        "keeps_fact_rate": _mean([np.mean(r["keeps_fact"]) for r in with_fact]),
        "value_right_rate": _mean([np.mean(r["value_right"]) for r in with_fact]),
        "keeps_fact_kappa": fleiss_kappa(keep) if len(keep) else math.nan,
        "success_mean": _mean(pooled),
        "success_greedy_summary": _mean([float(r["greedy_success"]) for r in rows]),
        "success_within_sd": _mean([np.std(o) for o in scored]),
        "contexts_mixed_outcome": _mean([float(0 < sum(o) < len(o)) for o in scored]),
        "success_within_share": within_var / total_var if total_var > 0 else math.nan,
        "success_if_kept": _mean(by_keep[True]),
        "success_if_dropped": _mean(by_keep[False]),
        "replays_diverged": float(sum(s is None for r in rows for s in r["success"])),
    }


# -- command line ---------------------------------------------------------------------------------


def load_config(model_dir: str, preset_name: str | None, overrides: list[str]):
    """The run's config next to ``model_dir`` (unless ``preset_name``), then ``KEY=VALUE`` overrides."""
    from compactrl.training.config import TrainConfig, override, preset

    run_config = Path(model_dir).resolve().parent / "config.json"
    if preset_name is None and run_config.is_file():
        cfg = TrainConfig.from_dict(json.loads(run_config.read_text()))
    else:
        cfg = preset(preset_name or "main")
    changes = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set: expected KEY=VALUE, got {item!r}")
        try:
            changes[key] = json.loads(value)
        except json.JSONDecodeError:
            changes[key] = value
    return override(cfg, changes) if changes else cfg


def measure(model_dir: str, cfg, *, contexts: int = 16, samples: int = 8, seed: int = 0) -> dict[str, Any]:
    """The report for one snapshot (see the module docstring); ``per_context`` holds the raw rows."""
    if contexts < 1 or samples < 2:
        raise ValueError(f"contexts >= 1 and samples >= 2 expected, got contexts={contexts}, samples={samples}")
    from compactrl.tokenizer import load_tokenizer

    found = sample_and_replay(cfg, model_dir, contexts=contexts, samples=samples, seed=seed)
    tok = load_tokenizer()
    rows = [context_figures(ctx, tok) for ctx in found]
    return {"model": str(model_dir), "episodes": contexts, "samples": samples, "temperature": 1.0, "seed": seed,
            **summarize(rows), "per_context": rows}


def _finite(x):
    """NaN -> null, so that the output is strict JSON."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


# -- before and after RL, over a boundary experiment's models --------------------------------------

TABLE = [("summary tokens", "summary_tokens_mean", "{:.1f}"), ("length CV", "summary_tokens_cv", "{:.3f}"),
         ("kept-keys Jaccard", "kept_keys_jaccard", "{:.2f}"), ("keeps the fact", "keeps_fact_rate", "{:.2f}"),
         ("right value", "value_right_rate", "{:.2f}"), ("keep/drop kappa", "keeps_fact_kappa", "{:.2f}"),
         ("success (sampled)", "success_mean", "{:.2f}"), ("success (greedy summary)", "success_greedy_summary", "{:.2f}"),
         ("within-context SD", "success_within_sd", "{:.2f}"), ("mixed-outcome contexts", "contexts_mixed_outcome", "{:.2f}"),
         ("success if kept / dropped", ("success_if_kept", "success_if_dropped"), "{:.2f}")]
"""The rows of ``stochasticity.md``: label, report key(s), format."""


def experiment_models(root: Path, seeds: int) -> list[tuple[str, str, int | None, Path]]:
    """(regime, arm, seed, model dir) of the SFT models (arm ``sft``, seed None) and the arms' final
    models of seeds ``0..seeds-1`` found under a boundary-experiment folder, in a stable order.

    A regime's SFT model is the one its arms started from: ``cells/<regime>__sft.json``'s ``model``
    (another regime's, under the experiment's ``SFT_FROM``), else ``<regime>/sft/sft_model``."""
    found = []
    for regime_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "cells"):
        regime = regime_dir.name
        sft = _sft_model(root, regime)
        if sft is None:
            continue
        found.append((regime, "sft", None, sft))
        for arm_dir in sorted(p for p in regime_dir.iterdir() if p.is_dir() and p.name != "sft"):
            for seed in range(seeds):
                model = arm_dir / f"seed{seed}" / "final_model"
                if model.is_dir():
                    found.append((regime, arm_dir.name, seed, model))
    return found


def _sft_model(root: Path, regime: str) -> Path | None:
    cell = root / "cells" / f"{regime}__sft.json"
    if cell.exists():
        given = Path(json.loads(cell.read_text())["model"])
        # the stored path may be relative to where the experiment ran: the same folder under root
        for path in (given, root / Path(*given.parts[-3:])):
            if path.is_dir():
                return path
    own = root / regime / "sft" / "sft_model"
    return own if own.is_dir() else None


def _cell(values: list[float], fmt: str) -> str:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(float(np.mean(values)))} ± {fmt.format(float(np.std(values, ddof=1)))}"


def experiment_table(reports: list[tuple[str, str, dict]]) -> str:
    """Markdown, one table per regime: a column per model group (the SFT model, then each arm with
    mean ± SD over its seeds' reports)."""
    out = []
    for regime in dict.fromkeys(r for r, _, _ in reports):
        groups: dict[str, list[dict]] = {}
        for r, arm, rep in reports:
            if r == regime:
                groups.setdefault(arm, []).append(rep)
        arms = ["sft", *sorted(a for a in groups if a != "sft")]
        head = [f"{a} ({len(groups[a])})" if a != "sft" else "SFT (before RL)" for a in arms]
        out += [f"### {regime}", "", "| figure | " + " | ".join(head) + " |", "|---" * (len(arms) + 1) + "|"]
        for label, key, fmt in TABLE:
            keys = key if isinstance(key, tuple) else (key,)
            cells = [" / ".join(_cell([rep.get(k) for rep in groups[a]], fmt) for k in keys) for a in arms]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def run_experiment(root: Path, *, seeds: int, contexts: int, samples: int, seed: int) -> str:
    """Measure every model :func:`experiment_models` finds (resumable), return the markdown tables."""
    reports = []
    for regime, arm, s, model in experiment_models(root, seeds):
        path = root / "stochasticity" / (f"{regime}__{arm}" + ("" if s is None else f"__seed{s}") + ".json")
        if not path.exists():
            report = measure(str(model), load_config(str(model), None, []), contexts=contexts, samples=samples,
                             seed=seed)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(_finite(report), indent=1) + "\n")
            tmp.replace(path)
        reports.append((regime, arm, json.loads(path.read_text())))
    text = (f"Summary stochasticity before (SFT) and after RL (final models, mean ± SD over seeds), {contexts} "
            f"held-out contexts x {samples} summaries at temperature 1 per model\n\n" + experiment_table(reports))
    (root / "stochasticity.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="saved model directory (e.g. RUN/sft_model or RUN/final_model)")
    p.add_argument("--experiment", default=None, metavar="DIR",
                   help="measure a boundary experiment's SFT and final models instead (see the module doc)")
    p.add_argument("--seeds", type=int, default=4, help="with --experiment: the first SEEDS seeds of each arm")
    p.add_argument("--contexts", type=int, default=16, help="held-out episodes to play (each gives one context)")
    p.add_argument("--samples", type=int, default=8, help="summaries sampled per context (>= 2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the summary sampler")
    p.add_argument("--preset", default=None, help="use this preset instead of the run's config.json")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. --set env.context_budget=900 (repeatable)")
    p.add_argument("--out", default=None, help="write the JSON here (default: stdout)")
    args = p.parse_args(argv)
    if args.experiment:
        print(run_experiment(Path(args.experiment), seeds=args.seeds, contexts=args.contexts,  # noqa: T201
                             samples=args.samples, seed=args.seed))
        return 0
    if not args.model:
        p.error("a model directory or --experiment DIR is required")
    cfg = load_config(args.model, args.preset, args.set)
    report = measure(args.model, cfg, contexts=args.contexts, samples=args.samples, seed=args.seed)
    text = json.dumps(_finite(report), indent=1)
    if args.out:
        out = Path(args.out)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(text + "\n")
        tmp.replace(out)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
