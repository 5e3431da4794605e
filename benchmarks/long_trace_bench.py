"""Peak memory and step time of one long trace's forward + backward through the training policy, with and
without chunked log-probs (``learner.logprob_chunk_tokens``) and activation checkpointing
(``learner.activation_checkpointing``).

Each configuration runs in a fresh subprocess, so its peak resident memory (``ru_maxrss``, the high-water
mark of the whole process: Python, torch, the model and the step) is its own. The model is the main
preset's tiny glm4_moe (hidden 128, 2 layers, 4 experts, top-2) with the project tokenizer's vocabulary
(4,096), and optionally wider vocabularies (``--vocabs 4096 32768``) where the O(T x vocab) term of
unchunked log-probs is larger. The step is the learner's: ``policy.log_prob`` over every position of the
trace (the worst case; the learner selects the policy tokens only), a scalar loss of log-probs and
entropies, ``backward``. A short warm-up step runs first; the time is that of the one long step.

    python benchmarks/long_trace_bench.py [--tokens 32768] [--chunk 1024] [--vocabs 4096 32768]

Writes ``benchmarks/results/long_trace_bench{--tag}.{json,md}`` with the machine (CPU model, AVX-512),
the load before and after, and the command. ``--env MALLOC_MMAP_THRESHOLD_=131072`` runs the measured
processes with glibc's mmap threshold fixed: by default glibc raises it after large frees, and the heap
then keeps freed long-trace buffers resident (at 16k tokens the step's RSS was 0.96 GiB against 0.24 GiB
with the fixed threshold, at the same speed; docs/training.md#long-traces).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30


def rss_peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def child(tokens: int, chunk: int, checkpointing: bool, vocab: int, threads: int) -> dict:
    """One configuration, in this (fresh) process: build, warm up, one long forward + backward."""
    import torch

    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.policies.transformers_policy import TransformersPolicy
    from compactrl.tokenizer import VOCAB_SIZE, load_tokenizer

    torch.set_num_threads(threads)
    model = tiny_moe("glm4_moe", vocab_size=None if vocab == VOCAB_SIZE else vocab,
                     max_position_embeddings=max(tokens, 8192), seed=0)
    policy = TransformersPolicy(model, load_tokenizer(), logprob_chunk_tokens=chunk,
                                activation_checkpointing=checkpointing)

    def step(length: int) -> float:
        ids = torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(length))
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        lp, ent = policy.log_prob(ids, torch.ones_like(ids))
        loss = -lp.sum() / length - 0.01 * ent.sum() / length
        loss.backward()
        return time.perf_counter() - t0

    step(256)
    before = rss_peak_bytes()
    seconds = step(tokens)
    peak = rss_peak_bytes()
    params = sum(p.numel() for p in model.parameters())
    return {"tokens": tokens, "vocab": vocab, "chunk": chunk, "activation_checkpointing": checkpointing,
            "step_s": round(seconds, 2), "rss_peak_gib": round(peak / GIB, 3),
            "rss_before_step_gib": round(before / GIB, 3), "step_rss_gib": round((peak - before) / GIB, 3),
            "params": params, "threads": threads}


def machine() -> dict:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "")
    return {"cpu": model, "avx512f": " avx512f" in Path("/proc/cpuinfo").read_text(),
            "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
            "memory_gib": round(int(Path("/proc/meminfo").read_text().split()[1]) / (1 << 20), 1)}


def run_one(args, chunk: int, checkpointing: bool, vocab: int) -> dict:
    cmd = [sys.executable, __file__, "--child", "--tokens", str(args.tokens), "--chunk", str(chunk),
           "--vocabs", str(vocab), "--threads", str(args.threads)] + (["--checkpointing"] if checkpointing else [])
    env = {**os.environ, **dict(kv.split("=", 1) for kv in args.env)}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if out.returncode != 0:
        return {"tokens": args.tokens, "vocab": vocab, "chunk": chunk, "activation_checkpointing": checkpointing,
                "error": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(args, rows: list[dict], before: dict, after: str) -> list[str]:
    command = "python benchmarks/long_trace_bench.py " + " ".join(sys.argv[1:])
    lines = [f"# One {args.tokens:,}-token trace, forward + backward, tiny glm4_moe", "",
             f"`{command}`; {before['cpu']}, avx512f {'yes' if before['avx512f'] else 'no'}, "
             f"{before['memory_gib']} GiB RAM, torch threads {args.threads}, child environment "
             f"{' '.join(args.env) or '(inherited)'}; load before: `{before['uptime']}`, after: `{after}`.", "",
             "Peak RSS: the fresh process's high-water mark (interpreter, torch, model and the step); step RSS: "
             "what the long step added on top of the warmed-up process.", "",
             "| vocab | log-prob chunk | activation checkpointing | peak RSS GiB | step RSS GiB | step s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['vocab']:,} | {r['chunk'] or 'off'} | {'on' if r['activation_checkpointing'] else 'off'} "
                         f"| failed: {r['error']} | | |")
            continue
        lines.append(f"| {r['vocab']:,} | {r['chunk'] or 'off'} | {'on' if r['activation_checkpointing'] else 'off'} "
                     f"| {r['rss_peak_gib']:.2f} | {r['step_rss_gib']:.2f} | {r['step_s']:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32_768, help="length of the one trace")
    parser.add_argument("--chunk", type=int, default=1024, help="logprob_chunk_tokens of the chunked runs")
    parser.add_argument("--vocabs", type=int, nargs="+", default=[4096], help="vocabulary sizes (4096: the project's)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="", help="suffix of the result files' names")
    parser.add_argument("--env", nargs="*", default=[], metavar="KEY=VALUE",
                        help="environment of the measured processes, e.g. MALLOC_MMAP_THRESHOLD_=131072")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.tokens, args.chunk, args.checkpointing, args.vocabs[0], args.threads)))
        return 0
    before = machine()
    rows = []
    for vocab in args.vocabs:
        for chunk, checkpointing in ((0, False), (args.chunk, False), (0, True), (args.chunk, True)):
            rows.append(run_one(args, chunk, checkpointing, vocab))
            print(json.dumps(rows[-1]), flush=True)
    after = machine()["uptime"]
    lines = report(args, rows, before, after)
    out = ROOT / "benchmarks" / "results"
    name = f"long_trace_bench{args.tag}"
    (out / f"{name}.json").write_text(json.dumps({"command": "python benchmarks/long_trace_bench.py "
                                                  + " ".join(sys.argv[1:]), "machine": before, "env": args.env,
                                                  "uptime_after": after, "results": rows}, indent=2) + "\n")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
