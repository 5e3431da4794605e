"""ContextBudget's cost per step as the context grows, next to re-tokenising the whole context.

The wrapper tokenises each turn once, when it is appended; the reference a naive wrapper would do
re-renders and re-tokenises the whole chat (``apply_chat_template(..., tokenize=True)``) every step.
An inner env with fixed-size tool outputs and a huge budget lets one episode grow from ~1k to
~32k tokens; the inner env's own time is subtracted.

``--long`` measures instead the cost of one ordinary step (a 12-line tool output) at 2k, 32k, 256k
and 1M tokens of trajectory: one episode grows fast with large tool outputs (not timed) and at each
mark times ``--steps`` ordinary steps; the machine, its load and the command go into
``benchmarks/results/wrapper_overhead_long.{json,md}`` (``--tag`` adds a suffix to the names).

    python benchmarks/wrapper_overhead.py [--budget 34000] [--tool-lines 12] [--repeats 3]
    python benchmarks/wrapper_overhead.py --long [--marks 2000 32000 256000 1000000] [--steps 30]
    compactrl bench wrapper_overhead
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym

from compactrl.envs.spaces import UnicodeText
from compactrl.tokenizer import load_tokenizer
from compactrl.types import TokenResponse
from compactrl.wrappers import ContextBudget, ContextBudgetConfig

CODE = [
    "def compute_total(prices, discount_rate):",
    '    """Sum the prices and apply the discount."""',
    "    total = sum(p for p in prices if p > 0)",
    "    return round(total * (1 - discount_rate), 2)",
    "PAGE_SIZE = 50  # items per page, see docs/api.md",
    "class Ledger:",
    "    def __init__(self, currency='EUR'):",
    "        self.entries = []",
]


class FixedOutputEnv(gym.Env):
    """Answers every action with ``tool_lines`` numbered lines of code; records its own step time."""

    metadata = {"render_modes": []}

    def __init__(self, tool_lines: int) -> None:
        self.tool_lines = tool_lines
        self.observation_space = UnicodeText(1 << 20)
        self.action_space = UnicodeText(1 << 20)
        self.system_prompt = "You fix bugs in a Python repository. Act only through tools."
        self.inner_ns = 0
        self._n = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._n = 0
        return "Tests fail in app/core.py: fix PAGE_SIZE.", {"task_id": "bench"}

    def step(self, action):
        t0 = time.perf_counter_ns()
        self._n += 1
        start = self._n * self.tool_lines
        lines = [f"{i:>4}\t{CODE[i % len(CODE)]}" for i in range(start, start + self.tool_lines)]
        out = f"app/core.py (lines {start}-{start + self.tool_lines - 1} of 9999)\n" + "\n".join(lines)
        self.inner_ns += time.perf_counter_ns() - t0
        return out, 0.0, False, False, {}


def run_episode(budget: int, tool_lines: int, action) -> list[tuple[int, float, float]]:
    """One growing episode: (context tokens before the step, wrapper µs, naive re-tokenise µs) per step."""
    inner = FixedOutputEnv(tool_lines)
    cfg = ContextBudgetConfig(budget=budget, reserve=256, tool_output_cap=1024, max_compactions=0)
    env = ContextBudget(inner, cfg)
    tok = env.tokenizer
    obs, info = env.reset(seed=0)
    rows = []
    while True:
        before, inner_before = time.perf_counter_ns(), inner.inner_ns
        obs, _, term, trunc, new_info = env.step(action)
        wrapper_us = (time.perf_counter_ns() - before - (inner.inner_ns - inner_before)) / 1e3
        if term or trunc:
            return rows
        t0 = time.perf_counter_ns()
        naive = tok.apply_chat_template(list(obs), tokenize=True, add_generation_prompt=True)["input_ids"]
        naive_us = (time.perf_counter_ns() - t0) / 1e3
        assert abs(len(naive) - new_info["context_tokens"]) <= 0.02 * len(naive) + 8  # same context
        rows.append((info["context_tokens"], wrapper_us, naive_us))
        info = new_info


def growth(marks: list[int], steps: int, action, big_lines: int = 150) -> list[dict]:
    """Per-step wrapper µs (inner env excluded) of ``steps`` ordinary steps at each context mark; the
    context grows between marks with ``big_lines``-line tool outputs (fewer, larger messages)."""
    inner = FixedOutputEnv(big_lines)
    cfg = ContextBudgetConfig(budget=max(marks) + 64 * steps * 300 + 20_000, reserve=256, tool_output_cap=8192,
                              max_compactions=0)
    env = ContextBudget(inner, cfg)
    obs, info = env.reset(seed=0)
    out = []
    for mark in sorted(marks):
        inner.tool_lines = big_lines  # grow fast, untimed, to just below the mark
        while info["context_tokens"] + 2_500 < mark:
            obs, _, _, _, info = env.step(action)
        inner.tool_lines = 12
        while info["context_tokens"] < mark:
            obs, _, _, _, info = env.step(action)
        start, messages, times = info["context_tokens"], len(obs), []
        for _ in range(steps):
            before, inner_before = time.perf_counter_ns(), inner.inner_ns
            _, _, term, trunc, info = env.step(action)
            times.append((time.perf_counter_ns() - before - (inner.inner_ns - inner_before)) / 1e3)
            assert not (term or trunc)
        out.append({"mark": mark, "context_start": start, "context_end": info["context_tokens"], "steps": steps,
                    "messages": messages,
                    "median_us": statistics.median(times), "p90_us": sorted(times)[int(0.9 * (steps - 1))]})
    return out


def machine() -> dict:
    """The CPU model, whether it has AVX-512, and the load average (the figures depend on all three)."""
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return {"cpu": model or platform.processor(), "avx512f": " avx512f" in flags,
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}


def long_main(args, actions) -> int:
    before = machine()
    results = {kind: growth(args.marks, args.steps, action, args.grow_lines) for kind, action in actions.items()}
    after = machine()["uptime"]
    command = "python benchmarks/wrapper_overhead.py " + " ".join(sys.argv[1:])
    lines = [f"# ContextBudget cost per step up to {max(args.marks):,} tokens", "",
             f"`{command}`; {before['cpu']}, avx512f {'yes' if before['avx512f'] else 'no'}; "
             f"load before: `{before['uptime']}`, after: `{after}`.", "",
             f"One ordinary step (12-line tool output, ~250 tokens with the response) at each context size, "
             f"the context grown between marks with {args.grow_lines}-line tool outputs; the inner env's time excluded. Medians (p90) over the "
             "steps; messages: the observation's length there.", "",
             "| action | context tokens | messages | steps | wrapper µs/step (median) | p90 |",
             "|---|---|---|---|---|---|"]
    for kind, rows in results.items():
        lines += [f"| {kind} | {r['context_start']:,} | {r['messages']:,} | {r['steps']} | {r['median_us']:,.0f} | "
                  f"{r['p90_us']:,.0f} |" for r in rows]
    out = Path(__file__).resolve().parent / "results"
    name = f"wrapper_overhead_long{args.tag}"
    (out / f"{name}.json").write_text(json.dumps({"command": command, "machine": before, "uptime_after": after,
                                                   "results": results}, indent=2) + "\n")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def table(rows, buckets) -> list[tuple[str, int, float, float]]:
    out = []
    for lo, hi in buckets:
        sel = [r for r in rows if lo <= r[0] < hi]
        if sel:
            out.append((f"{lo // 1000}k-{hi // 1000}k", len(sel), statistics.median(r[1] for r in sel),
                        statistics.median(r[2] for r in sel)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=34_000, help="token budget (the longest context)")
    parser.add_argument("--tool-lines", type=int, default=12, help="lines per tool output")
    parser.add_argument("--repeats", type=int, default=3, help="episodes per action kind (medians over all)")
    parser.add_argument("--long", action="store_true", help="per-step cost at --marks tokens of trajectory")
    parser.add_argument("--marks", type=int, nargs="+", default=[2_000, 32_000, 256_000, 1_000_000])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per mark (--long)")
    parser.add_argument("--tag", default="", help="suffix of the result files' names (--long)")
    parser.add_argument("--grow-lines", type=int, default=150, help="tool-output lines while growing (--long)")
    args = parser.parse_args(argv)
    tok = load_tokenizer()
    text = "Next: view app/core.py lines 40-64.\n<tool>view app/core.py 40 64</tool>"
    ids = tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    actions = {"str": text, "TokenResponse": TokenResponse(text, ids, [-0.1] * len(ids))}
    if args.long:
        return long_main(args, actions)
    buckets = [(0, 2_000), (2_000, 4_000), (8_000, 12_000), (16_000, 20_000), (28_000, 32_000)]
    print(f"ContextBudget per-step overhead (median µs; inner env time excluded), budget {args.budget}, "
          f"{args.tool_lines}-line tool outputs")
    print(f"{'action':<14} {'context':>9} {'steps':>6} {'wrapper µs':>11} {'re-tokenise all µs':>19} {'ratio':>6}")
    for kind, action in actions.items():
        rows = [r for _ in range(args.repeats) for r in run_episode(args.budget, args.tool_lines, action)]
        for label, n, ours, naive in table(rows, buckets):
            print(f"{kind:<14} {label:>9} {n:>6} {ours:>11.0f} {naive:>19.0f} {naive / ours:>6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
