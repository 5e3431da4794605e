"""Steps per second of the same scripted episodes on sim, local and docker, and episode start-up.

Each backend plays the same episodes through ``CodeRepoEnv``: the oracle's episode of each task
(view, replace, test, submit; real pytest on local/docker) and a shell episode (``ls``, ``grep``,
``cat``, ``wc`` through the ``shell`` tool). Reported per backend: env.reset time (sandbox
creation plus start-up), close time, steps per second over the episodes, median step time per
tool, and bare shell round trips (``exec("true")``) per second.

    python benchmarks/sandbox_bench.py [--backends sim,local,docker] [--tasks 5] [--difficulty easy]
    compactrl bench sandbox_bench

``docker`` needs an engine (``DOCKER_HOST``; ``scripts/ci_docker.sh`` starts Podman's) holding
``compactrl-sandbox:latest``.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

from compactrl.envs.code_env import CodeRepoEnv
from compactrl.sandbox import make_sandbox
from compactrl.tasksets.generators.code import CodeTaskGenerator, task_seed_for
from compactrl.testing.sandbox_fidelity import oracle_actor, scripted_actor
from compactrl.tools import parse_action

SHELL_EPISODE = [
    "<tool>shell ls -R | head -40</tool>",
    "<tool>shell grep -rn def . | head -20</tool>",
    "<tool>shell cat README.md | head -20</tool>",
    "<tool>shell find . -name '*.py' | sort | head</tool>",
    "<tool>shell wc -l README.md</tool>",
    "<tool>submit</tool>",
]


def episode(backend: str, task, actor, stats: dict) -> None:
    env = CodeRepoEnv(task, backend=backend, max_turns=80, time_limit_s=3600.0)
    t0 = time.perf_counter()
    obs, _ = env.reset(options={"task": task})
    stats["reset"].append(time.perf_counter() - t0)
    messages = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": obs}]
    done = False
    while not done:
        action = actor(messages, task)
        t0 = time.perf_counter()
        obs, _, terminated, truncated, _ = env.step(action)
        dt = time.perf_counter() - t0
        call = parse_action(action)
        stats["step"].append(dt)
        stats[f"tool:{getattr(call, 'name', 'format-error')}"].append(dt)
        messages += [{"role": "assistant", "content": action}, {"role": "tool", "content": obs}]
        done = terminated or truncated
    t0 = time.perf_counter()
    env.close()
    stats["close"].append(time.perf_counter() - t0)


def shell_round_trips(backend: str, task, n: int) -> float:
    sb = make_sandbox(backend)
    sb.start(task)
    try:
        sb.exec("true")
        t0 = time.perf_counter()
        for _ in range(n):
            sb.exec("true")
        return n / (time.perf_counter() - t0)
    finally:
        sb.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="sim,local,docker")
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--difficulty", default="easy")
    parser.add_argument("--round-trips", type=int, default=50)
    args = parser.parse_args()
    backends = args.backends.split(",")
    gen = CodeTaskGenerator(args.difficulty)
    tasks = [gen.generate(task_seed_for("test", i)) for i in range(args.tasks)]
    results = {}
    for backend in backends:
        stats: dict[str, list[float]] = collections.defaultdict(list)
        for task in tasks:
            episode(backend, task, oracle_actor(), stats)
            episode(backend, task, scripted_actor(SHELL_EPISODE), stats)
        stats["round_trips"] = [shell_round_trips(backend, tasks[0], args.round_trips)]
        results[backend] = stats
        print(f"{backend}: {len(stats['step'])} steps in {sum(stats['step']):.1f} s", flush=True)

    def row(label: str, fn) -> None:
        print(f"{label:<28}" + "".join(f"{fn(results[b]):>14}" for b in backends))

    def ms(values: list[float]) -> str:
        return f"{1000 * statistics.median(values):.1f} ms" if values else "-"

    print(f"\n{args.tasks} {args.difficulty} tasks x (oracle episode + shell episode) per backend")
    print(f"{'':<28}" + "".join(f"{b:>14}" for b in backends))
    row("steps/s (all steps)", lambda s: f"{len(s['step']) / sum(s['step']):.1f}")
    row("episode start (reset) p50", lambda s: ms(s["reset"]))
    row("episode start (reset) max", lambda s: f"{1000 * max(s['reset']):.1f} ms")
    row("close p50", lambda s: ms(s["close"]))
    tools = sorted({k for s in results.values() for k in s if k.startswith("tool:")})
    for tool in tools:
        row(f"step p50: {tool[5:]}", lambda s, t=tool: ms(s.get(t, [])))
    row("bare shell round trips/s", lambda s: f"{s['round_trips'][0]:.1f}")


if __name__ == "__main__":
    main()
