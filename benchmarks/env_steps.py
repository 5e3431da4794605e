"""Raw CodeRepoEnv steps per second on the sim backend, and what the oracle reads per task.

    python benchmarks/env_steps.py                       # all difficulties, 200 episodes each
    python benchmarks/env_steps.py --episodes 50 --difficulty hard

Single process. Env time is the time spent inside ``env.step`` only (policy time and resets are
reported separately), as wall time and as this process's CPU time (the latter is what to compare
on a shared, busy machine). Target: >= 20,000 raw env steps/s. The second table is what the oracle
reads on the bare env (no compaction): context tokens with the project tokenizer (system prompt,
task, every response and tool output), turns, and success; the third runs the oracle through the
context-budget wrapper (budget 2048) with lossless and fully lossy summaries.
"""

from __future__ import annotations

import argparse
import statistics
import time

from compactrl.envs.code_env import CodeRepoEnv
from compactrl.policies.scripted.code import OraclePolicy, RandomPolicy
from compactrl.types import PolicyRequest

TARGET = 20_000


def run_episodes(difficulty: str, policy, episodes: int, seed: int = 0):
    env = CodeRepoEnv(difficulty=difficulty)
    env_s = env_cpu_s = policy_s = reset_s = 0.0
    steps = successes = 0
    transcripts = []
    for ep in range(episodes):
        t0 = time.perf_counter()
        obs, _ = env.reset(seed=seed + ep)
        reset_s += time.perf_counter() - t0
        messages = [{"role": "system", "content": env.system_prompt}, {"role": "user", "content": obs}]
        while True:
            t0 = time.perf_counter()
            action = policy.act([PolicyRequest(messages=messages, task=env.task)])[0]
            t1, c1 = time.perf_counter(), time.process_time()
            obs, reward, terminated, truncated, info = env.step(action)
            env_s += time.perf_counter() - t1
            env_cpu_s += time.process_time() - c1
            policy_s += t1 - t0
            steps += 1
            messages = messages + [{"role": "assistant", "content": action}, {"role": "tool", "content": obs}]
            if terminated or truncated:
                successes += int(info["success"])
                transcripts.append(messages)
                break
    return {"steps": steps, "env_s": env_s, "env_cpu_s": env_cpu_s, "policy_s": policy_s, "reset_s": reset_s,
            "success": successes / episodes, "transcripts": transcripts}


def context_tokens(transcripts, tokenizer) -> list[int]:
    if tokenizer is None:
        return [sum(len(m["content"]) for m in t) // 3 for t in transcripts]
    return [sum(len(tokenizer.encode(m["content"])) for m in t) for t in transcripts]


def wrapped(difficulty: str, quality: float, episodes: int) -> dict:
    from compactrl.eval import evaluate
    from compactrl.wrappers.context_budget import ContextBudget

    def make(**kwargs):
        return ContextBudget(CodeRepoEnv(**kwargs), budget=2048, max_compactions=64)

    return evaluate(make, OraclePolicy(summary_quality=quality), episodes=episodes, env_kwargs={"difficulty": difficulty})[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--difficulty", default=None, help="easy, default or hard (default: all)")
    parser.add_argument("--no-wrapper", action="store_true", help="skip the context-budget table")
    args = parser.parse_args()
    difficulties = [args.difficulty] if args.difficulty else ["easy", "default", "hard"]
    try:
        from compactrl.tokenizer import load_tokenizer

        tokenizer = load_tokenizer()
    except (ImportError, OSError):
        tokenizer = None

    print(f"raw env steps/s (sim, single process; target >= {TARGET:,})")
    print("(env steps/s: wall time inside env.step; per CPU-s: the process's CPU time, robust to a busy machine)")
    print(f"{'difficulty':<10} {'policy':<7} {'steps':>7} {'env steps/s':>12} {'per CPU-s':>10} {'policy steps/s':>15} "
          f"{'resets/s':>9} {'success':>8}")
    oracle_runs = {}
    for difficulty in difficulties:
        for name, policy in (("random", RandomPolicy(seed=0)), ("oracle", OraclePolicy())):
            r = run_episodes(difficulty, policy, args.episodes)
            if name == "oracle":
                oracle_runs[difficulty] = r
            print(f"{difficulty:<10} {name:<7} {r['steps']:>7} {r['steps'] / r['env_s']:>12,.0f} "
                  f"{r['steps'] / max(r['env_cpu_s'], 1e-9):>10,.0f} "
                  f"{r['steps'] / r['policy_s']:>15,.0f} {args.episodes / r['reset_s']:>9,.0f} {r['success']:>8.2f}")

    unit = "tokens (project BPE)" if tokenizer is not None else "tokens (chars/3 estimate)"
    print(f"\noracle context per task on the bare env, {unit}")
    print(f"{'difficulty':<10} {'mean':>8} {'median':>8} {'min':>8} {'max':>8} {'turns':>6}")
    for difficulty, r in oracle_runs.items():
        toks = context_tokens(r["transcripts"], tokenizer)
        turns = statistics.mean((len(t) - 2) // 2 for t in r["transcripts"])
        print(f"{difficulty:<10} {statistics.mean(toks):>8,.0f} {statistics.median(toks):>8,.0f} "
              f"{min(toks):>8,} {max(toks):>8,} {turns:>6.1f}")

    if args.no_wrapper:
        return
    n = max(1, min(args.episodes, 40))
    print(f"\noracle through ContextBudget(budget=2048), {n} episodes")
    print(f"{'difficulty':<10} {'quality':>7} {'success':>8} {'compactions':>12} {'turns':>6}")
    for difficulty in difficulties:
        for quality in (1.0, 0.0):
            r = wrapped(difficulty, quality, n)
            print(f"{difficulty:<10} {quality:>7.1f} {r['success_rate']:>8.2f} {r['compactions_per_episode']:>12.1f} {r['turn_per_episode']:>6.1f}")


if __name__ == "__main__":
    main()
