"""Steps/s of the sim terminal env with the current shell emulator and with a baseline one, side by side.

    python benchmarks/shell_sim_speed.py                       # baseline = the emulator before the shell language
    python benchmarks/shell_sim_speed.py --episodes 100 --repeats 5 --base <rev>

The baseline's ``compactrl/shell_sim`` package is taken from git (``git archive <rev>``, into a
temp dir) and loaded in place of the current one; everything else (the env, the tasks, the
terminal oracle policy) is the current tree, so only the emulator differs. Each repeat runs the
same seeded episodes once per side, in alternating worker processes, so both sides see the same
machine load. Env time is the time inside ``env.step`` (wall and this process's CPU time); the
table shows the median over repeats. Target: current >= 0.8 x baseline steps/s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASELINE = "af94b9d"
"""The last commit whose emulator had no compound commands, substitutions or added utilities."""
TARGET = 0.8
ROOT = Path(__file__).resolve().parents[1]


def load_shell_from(directory: str) -> None:
    """Import ``compactrl.shell_sim`` from ``directory`` before anything else imports it."""
    spec = importlib.util.spec_from_file_location("compactrl.shell_sim", Path(directory) / "__init__.py",
                                                  submodule_search_locations=[directory])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compactrl.shell_sim"] = module
    spec.loader.exec_module(module)


def worker(episodes: int, seed: int) -> dict:
    from compactrl.envs.terminal_env import TerminalEnv
    from compactrl.policies.scripted.terminal import TerminalOraclePolicy
    from compactrl.types import PolicyRequest

    env = TerminalEnv(split="test")
    policy = TerminalOraclePolicy(summary_quality=1.0, seed=seed)
    steps = shell_steps = successes = 0
    env_s = env_cpu_s = 0.0
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        messages = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": obs}]
        while True:
            action = policy.act([PolicyRequest(messages=messages, task=env.task)])[0]
            t0, c0 = time.perf_counter(), time.process_time()
            obs, _, terminated, truncated, info = env.step(action)
            env_s += time.perf_counter() - t0
            env_cpu_s += time.process_time() - c0
            steps += 1
            shell_steps += "<tool>shell" in action
            messages += [{"role": "assistant", "content": action}, {"role": "tool", "content": obs}]
            if terminated or truncated:
                successes += int(info.get("success", False))
                break
    return {"steps": steps, "shell_steps": shell_steps, "env_s": env_s, "env_cpu_s": env_cpu_s,
            "success": successes / episodes}


def run_side(shell_dir: str | None, episodes: int, seed: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--episodes", str(episodes), "--seed", str(seed)]
    if shell_dir:
        cmd += ["--shell-dir", shell_dir]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def export_baseline(rev: str, dest: str) -> str:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "compactrl/shell_sim"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return str(Path(dest) / "compactrl" / "envs" / "shell_sim")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base", default=BASELINE, help="git revision of the baseline emulator")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shell-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        if args.shell_dir:
            load_shell_from(args.shell_dir)
        print(json.dumps(worker(args.episodes, args.seed)))
        return
    with tempfile.TemporaryDirectory(prefix="shellspeed-") as tmp:
        base_dir = export_baseline(args.base, tmp)
        results: dict[str, list[dict]] = {"baseline": [], "current": []}
        for _ in range(args.repeats):
            results["baseline"].append(run_side(base_dir, args.episodes, args.seed))
            results["current"].append(run_side(None, args.episodes, args.seed))
    report(results, args)


def report(results: dict[str, list[dict]], args) -> None:
    print(f"{args.episodes} terminal-oracle episodes (split test, seed {args.seed}), {args.repeats} repeats; "
          f"baseline emulator from {args.base}")
    print(f"{'emulator':10s} {'steps':>6s} {'shell steps':>11s} {'success':>7s} {'env steps/s':>12s} "
          f"{'(cpu) steps/s':>14s}")
    rates = {}
    for side, runs in results.items():
        wall = statistics.median(r["steps"] / r["env_s"] for r in runs)
        cpu = statistics.median(r["steps"] / max(r["env_cpu_s"], 1e-9) for r in runs)
        rates[side] = (wall, cpu)
        r = runs[0]
        print(f"{side:10s} {r['steps']:6d} {r['shell_steps']:11d} {r['success']:7.3f} {wall:12,.0f} {cpu:14,.0f}")
    wall_ratio = rates["current"][0] / rates["baseline"][0]
    cpu_ratio = rates["current"][1] / rates["baseline"][1]
    verdict = "OK" if cpu_ratio >= TARGET else "BELOW TARGET"
    print(f"current / baseline: {wall_ratio:.3f} (wall), {cpu_ratio:.3f} (cpu)   target >= {TARGET}  {verdict}")


if __name__ == "__main__":
    main()
