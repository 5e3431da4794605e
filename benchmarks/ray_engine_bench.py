"""Generation in the rollout workers vs on a shared engine actor, and the engine's weight path, on CPU.

    python benchmarks/ray_engine_bench.py                     # 8 episodes per arm, 4 envs in all
    python benchmarks/ray_engine_bench.py --episodes 16 --envs 8

The smoke preset's tiny MoE model (greedy, so every arm plays the same episodes; one torch thread
per actor) plays the smoke code tasks on the ``sim`` backend (``env.max_turns`` 12, budget 860: episodes
compact), where generation is nearly all the cost. Arms, side by side, each on the same task seeds
and the same ``--envs`` envs in all: one process; 2 Ray workers generating in-process (a model copy
each); 2, then 4, Ray workers sending their rounds to 1 shared engine actor (one model copy; with 4,
calls that wait during a generation are gathered into the next). Each Ray arm runs one untimed
batch first (start-up).

The weight path: one ``ray.put`` of the state dict per update, then the engine's fetch from the
object store + ``load_state_dict`` at its first request of the new version (timed inside the
engine), and a 1-token request at a version it already holds. The load average is printed with the results: on a shared
machine it matters.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from compactrl.collectors import TraceCollector
from compactrl.distributed import InferenceEngine, RayCollector, local_ray
from compactrl.policies.sampling import SamplingConfig
from compactrl.training import rollouts as T
from compactrl.training.config import override, preset

OUT = Path(__file__).parent / "results" / "ray_engine_bench.json"
ENV = {"env.backend": "sim", "env.max_turns": 12, "env.context_budget.budget": 860,
       "env.context_budget.reserve": 64, "env.context_budget.tool_output_cap": 192}


def _cfg():
    return override(preset("smoke"), ENV)


def _greedy(cfg_json: str, index: int):
    """The run's policy, greedy: every arm then plays the same episodes, so only the time differs."""
    policy = T.worker_policy(cfg_json, index)
    policy.sampling = SamplingConfig(temperature=0.0)
    return policy


def _timed(collector, seed: int) -> dict[str, float]:
    collector.load_state_dict({**collector.state_dict(), "seed": seed, "rng": np.random.default_rng(seed).bit_generator.state})
    t0 = time.perf_counter()
    collector.next()
    wall = time.perf_counter() - t0
    stats = collector.last_episode_stats
    steps = sum(s.steps for s in stats)
    return {"episodes": len(stats), "wall_s": wall, "episodes_per_s": len(stats) / wall, "steps": steps,
            "generated_tokens": sum(s.generated_tokens for s in stats),
            "policy_ms_per_step": 1e3 * sum(s.summary_gen_time_s + s.other_gen_time_s for s in stats) / max(steps, 1)}


def bench_arms(episodes: int, envs: int, seed: int) -> dict[str, dict]:
    cfg = _cfg()
    policy = _greedy(cfg.to_json(), 0)
    single = TraceCollector(T.make_env_fns(cfg.env, split="train", count=envs), policy, episodes_per_batch=episodes,
                            seed=seed, give_task_to_policy=False)
    _timed(single, seed + 1)
    rows = {"1 process": _timed(single, seed)}
    single.shutdown()
    # the Ray arms start from these weights (published), as a training run's workers do
    fn = functools.partial(_greedy, cfg.to_json())
    arms = {"2 Ray workers, generating in-process": (2, {"worker_num_cpus": 1.0}),
            "2 Ray workers + 1 shared engine": (2, {"num_engines": 1, "worker_num_cpus": 0.5, "engine_num_cpus": 1.0}),
            "4 Ray workers + 1 shared engine": (4, {"num_engines": 1, "worker_num_cpus": 0.25, "engine_num_cpus": 1.0})}
    for name, (workers, kw) in arms.items():
        rc = RayCollector(T.make_env_fns(cfg.env, split="train", count=envs // workers), fn, num_workers=workers,
                          episodes_per_batch=episodes, seed=seed, give_task_to_policy=False, weights=policy, **kw)
        t0 = time.perf_counter()
        _timed(rc, seed + 1)
        first = time.perf_counter() - t0
        rows[name] = {**_timed(rc, seed), "first_batch_s": first}
        if rc.num_engines:  # over both batches: how many workers' calls each generation served
            rows[name]["engine"] = rc.engine_stats()[0]
        rc.shutdown()
    return rows


def weight_path_ms(repeats: int = 3) -> dict[str, float]:
    """Per update: ray.put of the state dict, the engine's fetch + load (timed inside it), and a request after it."""
    import ray

    from compactrl.types import PolicyRequest

    cfg = _cfg()
    fn = functools.partial(_greedy, cfg.to_json())
    policy = fn(0)
    state = {k: v.detach().cpu() for k, v in policy.state_dict().items()}
    engine = ray.remote(num_cpus=1)(InferenceEngine).remote(fn, 0, threads=1)
    ray.get(engine.ready.remote())
    request = [PolicyRequest(messages=[{"role": "user", "content": "hi"}], max_new_tokens=1)]
    puts, loads, held = [], [], []
    for version in range(repeats):
        t0 = time.perf_counter()
        ref = ray.put(state)
        puts.append(time.perf_counter() - t0)
        before = ray.get(engine.stats.remote())["load_s"]
        ray.get(engine.act.remote(request, [ref], version))  # a new version: fetched and loaded first
        loads.append(ray.get(engine.stats.remote())["load_s"] - before)
        t0 = time.perf_counter()
        ray.get(engine.act.remote(request, [ref], version))
        held.append(time.perf_counter() - t0)
    ray.kill(engine)
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    return {"bytes": float(nbytes), "put_ms": [1e3 * x for x in puts],
            "engine_fetch_and_load_ms": [1e3 * x for x in loads],
            "request_at_held_version_ms": [1e3 * x for x in held]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--envs", type=int, default=4, help="envs in all (split between the Ray workers)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    results: dict = {"args": vars(args), "cpus": os.cpu_count(), "load_before": load_before}
    with local_ray(num_cpus=os.cpu_count()):
        results["weights"] = weight_path_ms()
        results["arms"] = bench_arms(args.episodes, args.envs, args.seed)
    results["load_after"] = os.getloadavg()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1))
    print(f"load average before {load_before[0]:.1f}, after {results['load_after'][0]:.1f} on {os.cpu_count()} CPUs")
    print("| arm | episodes/s | wall s | policy ms/step | generated tokens | first batch s |")
    print("|---|---|---|---|---|---|")
    for arm, r in results["arms"].items():
        print(f"| {arm} | {r['episodes_per_s']:.2f} | {r['wall_s']:.1f} | {r['policy_ms_per_step']:.1f} | "
              f"{r['generated_tokens']} | {r.get('first_batch_s', float('nan')):.1f} |")
    for arm, r in results["arms"].items():
        if "engine" in r:
            print(f"{arm}: {r['engine']['calls']:.0f} calls served by {r['engine']['generations']:.0f} generations")
    w = results["weights"]
    print(f"weights: {w['bytes'] / 1e6:.2f} MB; ray.put ms {[round(x, 1) for x in w['put_ms']]}; engine fetch + load ms "
          f"{[round(x, 1) for x in w['engine_fetch_and_load_ms']]}; a 1-token request at a held version ms "
          f"{[round(x, 1) for x in w['request_at_held_version_ms']]}")


if __name__ == "__main__":
    main()
