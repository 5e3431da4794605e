"""Episodes/s of trace collection: one process vs Ray rollout workers, side by side in one run.

    python benchmarks/ray_collect_bench.py                   # 16 local / 128 sim episodes per arm, 4 envs
    python benchmarks/ray_collect_bench.py --episodes 8 --backends sim

The oracle policy (scripted, no model) plays the smoke preset's code tasks (``env.max_turns`` 12,
budget 860, so episodes compact) with ``--envs`` envs in all: one process stepping them, 1 Ray
worker holding them all (Ray's overhead, same work), and 2 Ray workers with half each. ``local``
is the real sandbox (bubblewrap, a bash per episode), where sandbox time dominates; ``sim`` is
in-process, where Ray's overhead is most visible. Each Ray arm runs one untimed batch first (actor
start-up and imports), then the timed batch with the same task seeds as the single process. The
per-step costs (env step, policy) feed the scaling estimate in docs/distributed.md. Load matters
on a shared machine: the load average is printed with the results.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from compactrl.collectors import TraceCollector
from compactrl.distributed import RayCollector, local_ray
from compactrl.policies.scripted.code import OraclePolicy
from compactrl.training import rollouts as T
from compactrl.training.config import override, preset

OUT = Path(__file__).parent / "results" / "ray_collect_bench.json"


def _oracle(index: int) -> OraclePolicy:
    return OraclePolicy(summary_quality=1.0)


def _env_fns(backend: str, count: int):
    cfg = override(preset("smoke"), {"env.backend": backend, "env.max_turns": 12, "env.context_budget.budget": 860,
                                     "env.context_budget.reserve": 64, "env.context_budget.tool_output_cap": 192})
    return T.make_env_fns(cfg.env, split="train", count=count)


def _timed(collector, seed: int) -> dict[str, float]:
    collector.load_state_dict({**collector.state_dict(), "seed": seed, "rng": _rng_state(seed)})
    t0 = time.perf_counter()
    batch = collector.next()
    wall = time.perf_counter() - t0
    stats = collector.last_episode_stats
    steps = sum(s.steps for s in stats)
    return {"episodes": len(stats), "wall_s": wall, "episodes_per_s": len(stats) / wall, "steps": steps,
            "env_ms_per_step": 1e3 * sum(s.env_time_s for s in stats) / max(steps, 1),
            "policy_ms_per_step": 1e3 * sum(s.summary_gen_time_s + s.other_gen_time_s for s in stats) / max(steps, 1),
            "trace_rows": int(batch.batch_size[0]), "tokens": int(batch["tokens"].numel())}


def _rng_state(seed: int):
    import numpy as np

    return np.random.default_rng(seed).bit_generator.state


def bench_backend(backend: str, episodes: int, envs: int, seed: int) -> dict[str, dict]:
    single = TraceCollector(_env_fns(backend, envs), _oracle(0), episodes_per_batch=episodes, seed=seed)
    _timed(single, seed + 1)  # warm-up: imports, first sandbox
    rows = {"1 process": _timed(single, seed)}
    single.shutdown()
    for workers in (1, 2):
        rc = RayCollector(_env_fns(backend, envs // workers), _oracle, num_workers=workers,
                          episodes_per_batch=episodes, seed=seed, worker_num_cpus=1.0 / workers)
        t0 = time.perf_counter()
        _timed(rc, seed + 1)
        start = time.perf_counter() - t0
        rows[f"{workers} Ray worker{'s' if workers > 1 else ''}"] = {**_timed(rc, seed), "first_batch_s": start}
        rc.shutdown()
    return rows


class _Reader:
    def size(self, state: dict) -> int:
        return len(state)


def weight_publish_ms() -> dict[str, float]:
    """ray.put of the smoke model's state dict and one worker-side get, the per-update cost per object."""
    import ray

    from compactrl.tokenizer import shared_tokenizer

    policy, _ = T.build_policy(preset("smoke"), shared_tokenizer())
    state = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    t0 = time.perf_counter()
    ref = ray.put(state)
    put = time.perf_counter() - t0
    reader = ray.remote(num_cpus=0)(_Reader).remote()
    ray.get(reader.size.remote({"x": torch.zeros(1)}))  # actor up, torch imported: what follows is the transfer
    t0 = time.perf_counter()
    ray.get(reader.size.remote(ref))
    return {"bytes": float(nbytes), "put_ms": 1e3 * put, "remote_get_ms": 1e3 * (time.perf_counter() - t0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--envs", type=int, default=4, help="envs in all (split between the Ray workers)")
    ap.add_argument("--backends", default="local,sim")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    backends = [b for b in args.backends.split(",") if b]  # "" measures the weight transfer alone
    load_before = os.getloadavg()
    results: dict = {"args": vars(args), "cpus": os.cpu_count(), "load_before": load_before}
    with local_ray(num_cpus=os.cpu_count()):
        for backend in backends:
            episodes = args.episodes * (8 if backend == "sim" else 1)  # sim episodes take ~ms: more of them
            results[backend] = bench_backend(backend, episodes, args.envs, args.seed)
        results["weights"] = weight_publish_ms()
    results["load_after"] = os.getloadavg()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1))
    print(f"load average before {load_before[0]:.1f}, after {results['load_after'][0]:.1f} on {os.cpu_count()} CPUs")
    print("| backend | arm | episodes/s | wall s | env ms/step | policy ms/step | first batch s |")
    print("|---|---|---|---|---|---|---|")
    for backend in backends:
        for arm, r in results[backend].items():
            print(f"| {backend} | {arm} | {r['episodes_per_s']:.2f} | {r['wall_s']:.1f} | {r['env_ms_per_step']:.2f} | "
                  f"{r['policy_ms_per_step']:.2f} | {r.get('first_batch_s', float('nan')):.1f} |")
    w = results["weights"]
    print(f"weights: {w['bytes'] / 1e6:.1f} MB, ray.put {w['put_ms']:.1f} ms, a worker's get {w['remote_get_ms']:.1f} ms")


if __name__ == "__main__":
    main()
