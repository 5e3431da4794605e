"""Train-inference mismatch experiment: the main job's RL recipe sampled by a bf16 engine with an FP8 KV
cache, in five arms (no correction, the learner's log-probs as PPO's anchor, TIS, routing replay, replay +
TIS), resumable cells.

    python benchmarks/mismatch_experiment.py --out benchmarks/results/mismatch_experiment --seeds 4 --resume

Every cell starts from one SFT model (the main job's SFT phase at seed 0, trained once into
``<out>/sft``) and runs the main job's RL phase unchanged (critic pre-training, 4 critic-PPO
iterations x 32 episodes, held-out evaluation every 2) with ``rollout.*`` set by ``--sampler``:

- ``vllm`` (the default): the vLLM engine in bfloat16 with vLLM's own ``kv_cache_dtype="fp8"``; on a
  CPU where vLLM refuses an fp8 cache (no AVX-512 or AMX) the engine's cache stays ``auto`` and the
  results say so;
- ``transformers``: the in-process sampler with compactrl's fp8 cache (fp32 weights).

A cell records its held-out success (64 tasks, greedy), its learning curve and the per-iteration means
of every ``mismatch/*`` figure (k3 KL, max and mean |delta log p| of the sampler against the learner
before each update, and the share of tokens routed to other experts), with the corrections' shares
(``policy/tis_clip_fraction``, ``policy/mis_drop_fraction``). Cells are the boundary experiment's
(``benchmarks/boundary_experiment.py``: same cell record, same resume, same statistics).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import boundary_experiment as be  # noqa: E402  (one cell runner, one set of statistics)

TIS_CAP = 2.0
"""TIS's cap on the learner/sampler ratio (the value docs/mismatch.md uses)."""

DROP_NOTHING = 1e30
"""An MIS bound no ratio reaches: the ``anchor`` arm's learner log-probs without dropping or weighting."""

ARMS: dict[str, dict[str, Any]] = {
    "none": {},
    # a correction makes the learner's own log-probs the PPO ratio's anchor (decoupled PPO) as well as
    # weighting tokens; this arm has the anchor alone, to tell the two apart
    "anchor": {"rl.ppo.mis_high": DROP_NOTHING},
    "tis": {"rl.ppo.tis_cap": TIS_CAP},
    "replay": {"rl.routing_replay": True},
    "replay_tis": {"rl.routing_replay": True, "rl.ppo.tis_cap": TIS_CAP},
}
PAIRS = [("tis", "none"), ("anchor", "none"), ("tis", "anchor"), ("replay", "none"), ("replay_tis", "none"),
         ("replay_tis", "tis")]

SAMPLERS: dict[str, dict[str, Any]] = {
    "vllm": {"rollout.engine": "vllm", "rollout.engine_dtype": "bfloat16", "rollout.kv_cache_dtype": "fp8"},
    "transformers": {"rollout.engine": "transformers", "rollout.kv_cache_dtype": "fp8"},
}
REPORTED = ("mismatch/k3", "mismatch/max_abs_dlogp", "mismatch/mean_abs_dlogp", "mismatch/route_disagree_all",
            "mismatch/route_disagree_task", "mismatch/route_disagree_summary", "policy/tis_clip_fraction")


def sampler_changes(sampler: str) -> tuple[dict[str, Any], str]:
    """The ``rollout.*`` settings of ``sampler`` on this machine and a line saying what runs: vLLM's fp8
    cache where vLLM accepts it here, else the engine's own dtype (the refusal is quoted)."""
    changes = dict(SAMPLERS[sampler])
    if sampler == "vllm":
        from compactrl.serving.vllm.client import VLLMEngineConfig, fp8_kv_refusal

        refusal = fp8_kv_refusal(VLLMEngineConfig(model=".", kv_cache_dtype="fp8"))
        if refusal:
            changes["rollout.kv_cache_dtype"] = "auto"
            return changes, f"vLLM engine, bfloat16, KV cache auto (bfloat16): vLLM refuses fp8 here ({refusal})"
        return changes, "vLLM engine, bfloat16 weights and activations, vLLM's own fp8 (e4m3) KV cache"
    return changes, "in-process transformers sampler, fp32 weights, compactrl's fp8 (e4m3) KV cache"


def base_config(sampler: str, threads: int, extra: dict[str, Any]):
    """The main job's config (the ``main`` preset) with the sampler's settings and ``--set`` overrides."""
    from compactrl.training.config import override, preset

    return override(preset("main"), {**sampler_changes(sampler)[0], "threads": threads, **extra})


def summarize(cells: list[dict]) -> dict[str, Any]:
    """Per arm: held-out success and each :data:`REPORTED` figure with 95% t-intervals over seeds."""
    out: dict[str, Any] = {}
    for arm in ARMS:
        mine = be.arm_seeds(cells, arm)
        if not mine:
            continue
        final = [be.success(c) for c in mine]
        k, n = sum(sum(e[1] for e in c["episodes"]) for c in mine), sum(len(c["episodes"]) for c in mine)
        figures = {key: be.interval([c["mismatch"][key] for c in mine])
                   for key in REPORTED if all(key in c.get("mismatch", {}) for c in mine)}
        out[arm] = {"seeds": [c["seed"] for c in mine], "final_per_seed": final, "final": be.interval(final),
                    "pooled_wilson": list(be.wilson(k, n)), "mismatch": figures,
                    "cell_wall_clock_s": sum(c["wall_clock_s"] for c in mine) / len(mine),
                    "cell_cpu_s": sum(c.get("cpu_s", float("nan")) for c in mine) / len(mine)}
    return out


def paired(arms: dict[str, dict]) -> dict[str, dict]:
    """Paired differences of final success over the seeds both arms finished (:func:`be.paired`)."""
    return be.paired_success(arms, PAIRS)


def markdown(results: dict[str, Any]) -> str:
    lines = [f"Mismatch experiment: {results['sampler_line']}.", "",
             f"SFT model held-out success {results['sft_success']:.3f}; {results['config_summary']}.", "",
             "| arm | seeds | held-out success (95% CI) | pooled Wilson | k3 KL | max abs dlogp | mean abs dlogp "
             "| routed apart (all) | task | summary | TIS clipped | min/cell (wall, CPU) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm, r in results["arms"].items():
        m = r["mismatch"]
        lines.append(
            f"| {arm} | {len(r['seeds'])} | {be.fmt_interval(r['final'])} | [{r['pooled_wilson'][0]:.3f}, "
            f"{r['pooled_wilson'][1]:.3f}] | {be.fmt_interval(m.get('mismatch/k3'), '{:.2e}')} | "
            f"{be.fmt_interval(m.get('mismatch/max_abs_dlogp'))} | {be.fmt_interval(m.get('mismatch/mean_abs_dlogp'), '{:.4f}')} | "
            f"{be.fmt_interval(m.get('mismatch/route_disagree_all'))} | {be.fmt_interval(m.get('mismatch/route_disagree_task'))} | "
            f"{be.fmt_interval(m.get('mismatch/route_disagree_summary'))} | {be.fmt_interval(m.get('policy/tis_clip_fraction'), '{:.4f}')} | "
            f"{r['cell_wall_clock_s'] / 60:.1f}, {r['cell_cpu_s'] / 60:.1f} |")
    lines += ["", *be.paired_lines(results["paired"], "held-out success"), "", be.provenance_line(results)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from compactrl.provenance import cpu_model, has_avx512_or_amx
    from compactrl.training.config import override

    p = be.arms_parser(__doc__.splitlines()[0], "runs/mismatch")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms of {list(ARMS)}")
    p.add_argument("--sampler", default="vllm", choices=sorted(SAMPLERS))
    p.add_argument("--jobs", type=int, default=1, help="cells run in parallel, one torch thread each")
    args = p.parse_args(argv)
    arms = args.arms.split(",")
    if bad := [a for a in arms if a not in ARMS]:
        raise SystemExit(f"unknown arms {bad}; arms: {list(ARMS)}")
    out, t0 = be.start_arms(args)
    threads = 1 if args.jobs > 1 else 2
    base = base_config(args.sampler, threads, be.parse_sets(args.set))
    sft_spec = {"regime": "main", "config": override(base, {"rollout.engine": "transformers",
                                                           "rollout.kv_cache_dtype": "auto"}).to_dict(),
                "run_dir": str(out / "sft"), "cell_path": str(out / "cells" / "sft.json"),
                "final_episodes": args.final_episodes}
    if not Path(sft_spec["cell_path"]).exists():
        be.run_sft(sft_spec)
    sft = json.loads(Path(sft_spec["cell_path"]).read_text())
    cells = be.arm_cells(out, "main", base, {a: ARMS[a] for a in arms}, args.seeds, sft["model"],
                         final_episodes=args.final_episodes, jobs=args.jobs, threads=threads)
    arm_results = summarize(cells)
    results = {
        "command": " ".join(["python benchmarks/mismatch_experiment.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": f"{cpu_model()} ({'AVX-512 or AMX' if has_avx512_or_amx() else 'no AVX-512'}), "
                   f"{os.cpu_count()} CPUs, {args.jobs} jobs, {platform.machine()}",
        "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "sampler": args.sampler, "sampler_line": sampler_changes(args.sampler)[1],
        "sft_success": be.success(sft),
        "config_summary": (f"{base.rl.iterations} policy iterations x {base.rl.episodes_per_iter} episodes, "
                           f"{args.final_episodes} held-out tasks at the end, {args.seeds} seeds, TIS cap {TIS_CAP}"),
        "cell_machines": be.cell_machines(cells),
        "cells": len(cells), "arms": arm_results, "paired": paired(arm_results),
        "wall_clock_s": time.perf_counter() - t0,
    }
    return be.write_results(out, results, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
