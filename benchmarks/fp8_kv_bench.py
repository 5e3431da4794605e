"""FP8 KV cache: memory per token and log-prob deviation, for compactrl's transformers cache and for vLLM's.

    python benchmarks/fp8_kv_bench.py                       # both tiny models (~5-10 min on 2 busy cores)
    python benchmarks/fp8_kv_bench.py --archs glm4_moe --no-vllm

For the tiny glm4_moe and qwen3_moe (fp32 weights, as initialised, and with the LM head scaled by 8 so
that the next-token distribution is sharper, as a trained model's is), on the same prompts:

* (a) compactrl's :class:`~compactrl.policies.fp8_cache.Fp8KVCache` against the float32 cache: the
  fp8 sampler draws ``--new-tokens`` tokens per prompt (temperature 1); those sequences are then
  scored teacher-forced with either cache (one forward each, every token written into the cache
  first), so both sides score exactly the same tokens. Also with nearest-even rounding (vLLM's CUDA
  kernels) instead of truncation (its CPU kernel), and the sampler's own log-probs against the
  teacher-forced fp8 ones (how exactly a static-scale cache is reproduced by scoring).
* (b) vLLM ``kv_cache_dtype="fp8"`` against vLLM's default cache, the same way: the fp8 engine samples,
  both engines score the sequences (prompt log-probs). Needs the engine environment and a CPU with
  AVX-512 or AMX (vLLM refuses fp8 otherwise; the part is then reported as refused).
* (a) vs (b): the two fp8 caches' log-probs on the same sequences (all of (a)'s and (b)'s), beside the
  two float32 caches' (the floor: kernel summation order), and the correlation of their deviations.
* memory: bytes per cached token, measured on the transformers caches after a prefill, and for vLLM
  from the engine's own report of how many tokens its ``VLLM_CPU_KVCACHE_SPACE`` holds.
* the vLLM CPU kernel's fp8 quantiser (``cpu_attn_reshape_and_cache``) against
  :func:`~compactrl.policies.fp8_cache.quantize_fp8` on values from 1e-4 to 1e3, bit for bit.

Writes ``benchmarks/results/fp8_kv_bench.{json,md}`` with the command, the machine (CPU model, whether
it has avx512f) and the load (``uptime``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
ARCHS = {"glm4_moe": {}, "qwen3_moe": {"head_dim": 64}}  # the vLLM tests' qwen3_moe size
VARIANTS = {"init": 1.0, "head_x8": 8.0}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def machine() -> dict:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return {"cpu": model, "avx512f": " avx512f" in flags, "amx_tile": " amx_tile" in flags,
            "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}


def vllm_python() -> Path:
    return Path(os.environ.get("COMPACTRL_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))


# -- the quantiser, bit for bit -----------------------------------------------------------------------

_KERNEL = r"""
import sys, numpy as np, torch, vllm._custom_ops as ops
x = torch.from_numpy(np.fromfile(sys.argv[1], dtype=np.float32)).reshape(-1, 2, 32)
T = x.shape[0]
kc = torch.zeros(1, 2, T, 32, dtype=torch.uint8); vc = torch.zeros_like(kc)
ops.cpu_attn_reshape_and_cache(x, x, kc, vc, torch.arange(T), "vec", k_scale=1.0, v_scale=float(sys.argv[3]),
                               kv_cache_dtype="fp8")
vc.permute(0, 2, 1, 3).reshape(-1).numpy().tofile(sys.argv[2])
"""


def quantiser_check() -> dict:
    """vLLM's CPU fp8 quantiser (the value cache's row-major layout) against ``quantize_fp8``."""
    import numpy as np

    from compactrl.policies.fp8_cache import quantize_fp8

    g = torch.Generator().manual_seed(0)
    tokens = 256
    x = torch.randn(tokens, 2, 32, generator=g) * torch.logspace(-4, 3, tokens)[:, None, None]
    out = {}
    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "x.f32", Path(d) / "q.u8"
        x.numpy().tofile(src)
        for scale in (1.0, 0.37):
            proc = subprocess.run([str(vllm_python()), "-c", _KERNEL, str(src), str(dst), str(scale)],
                                  capture_output=True, text=True)
            if proc.returncode:
                return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
            got = torch.from_numpy(np.fromfile(dst, dtype=np.uint8)).reshape(x.shape)
            for rounding in ("truncate", "nearest"):
                mine = quantize_fp8(x, scale, rounding).view(torch.uint8)
                out[f"scale_{scale}_{rounding}_bit_equal_share"] = float((mine == got).float().mean())
    out["values"] = int(x.numel())
    return out


# -- scoring -------------------------------------------------------------------------------------------


def right_padded(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    return tokens, mask


def hf_scores(model, seqs: list[list[int]], make) -> list[list[float]]:
    """Teacher-forced ``log p(seq[t] | seq[:t])`` for t >= 1, through a fresh cache from ``make``."""
    from compactrl.policies.fp8_cache import cached_log_probs

    tokens, mask = right_padded(seqs)
    lp = cached_log_probs(model, tokens, mask, make(model.config))
    return [lp[i, 1:len(s)].tolist() for i, s in enumerate(seqs)]


def sampled(values: list[list[float]], seqs: list[list[int]], prompt_lens: list[int]) -> torch.Tensor:
    """The entries of the sampled tokens (``values[i][t - 1]`` is about ``seqs[i][t]``), flattened."""
    return torch.tensor([v for row, s, p in zip(values, seqs, prompt_lens) for v in row[p - 1:len(s) - 1]],
                        dtype=torch.float64)


def dev(a: torch.Tensor, b: torch.Tensor) -> dict:
    d = (a - b).abs()
    return {"max": float(d.max()), "mean": float(d.mean()), "tokens": int(d.numel())}


def corr(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / (x.norm() * y.norm()).clamp(min=1e-30))


# -- memory --------------------------------------------------------------------------------------------


def hf_bytes_per_token(model, make, length: int = 512) -> float:
    from compactrl.policies.fp8_cache import kv_cache_bytes

    cache = make(model.config)
    tokens = torch.arange(3, 3 + length)[None]
    with torch.no_grad():
        model(input_ids=tokens, attention_mask=torch.ones_like(tokens), cache=cache, use_cache=True, logits_to_keep=1)
    return kv_cache_bytes(cache) / length


def engine_bytes_per_token(pol) -> float | None:
    """``VLLM_CPU_KVCACHE_SPACE`` over the tokens the engine says its KV cache holds."""
    text = Path(pol.engine.log_path).read_text(errors="replace")
    found = re.findall(r"KV cache size: ([\d,]+) tokens", text)
    if not found:
        return None
    return pol.engine_config.kv_cache_gib * 2**30 / int(found[-1].replace(",", ""))


def analytic_bytes_per_token(config, element_bytes: int) -> int:
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * layers * kv_heads * head_dim * element_bytes


# -- one model -----------------------------------------------------------------------------------------


def prompts_of(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(16, 65, (n,), generator=g).tolist()
    return [torch.randint(3, 4000, (n_,), generator=g).tolist() for n_ in lengths]


def start_engines(model, tokenizer, root: Path, args) -> dict:
    from compactrl.serving.vllm.client import EngineError
    from compactrl.serving.vllm.policy import VLLMPolicy

    engines: dict = {}
    for kv in ("auto", "fp8"):
        t0 = time.perf_counter()
        try:
            engines[kv] = VLLMPolicy.from_model(model, tokenizer, root / kv, seed=0, engine={
                "kv_cache_dtype": kv, "threads": args.threads, "max_model_len": 1024})
        except (EngineError, ValueError) as exc:  # an AVX2-only CPU: the fp8 cache is refused at start
            engines[kv] = str(exc).splitlines()[0][:300]
        print(f"  engine {kv}: {'started' if not isinstance(engines[kv], str) else engines[kv]} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return engines


def bench_variant(model, tokenizer, engines: dict, args, seed: int) -> dict:
    from transformers import DynamicCache

    from compactrl.policies.fp8_cache import Fp8KVCache
    from compactrl.policies.transformers_policy import TransformersPolicy

    full = lambda c: DynamicCache(config=c)  # noqa: E731
    fp8 = lambda c: Fp8KVCache(c)  # noqa: E731
    nearest = lambda c: Fp8KVCache(c, rounding="nearest")  # noqa: E731
    never = [len(tokenizer) + 7]  # a stop id that cannot be sampled: every row runs its whole budget
    prompts = prompts_of(args.prompts, seed)
    plens = [len(p) for p in prompts]
    row: dict = {}
    timing = {}
    for kv in ("auto", "fp8"):
        pol = TransformersPolicy(model, tokenizer, seed=seed, stop_token_ids=never, kv_cache_dtype=kv)
        t0 = time.perf_counter()
        gens = pol.generate(prompts, args.new_tokens)
        timing[kv] = round(sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0), 1)
    row["transformers_gen_tok_s"] = timing
    seqs_a = [p + g.token_ids for p, g in zip(prompts, gens)]  # the fp8 sampler's (the loop ended on fp8)
    lp_a = torch.tensor([v for g in gens for v in g.log_probs], dtype=torch.float64)
    tf = {name: hf_scores(model, seqs_a, make) for name, make in (("full", full), ("fp8", fp8), ("nearest", nearest))}
    a_full, a_fp8, a_near = (sampled(tf[k], seqs_a, plens) for k in ("full", "fp8", "nearest"))
    row["a_fp8_vs_full"] = dev(a_fp8, a_full)
    row["a_nearest_vs_full"] = dev(a_near, a_full)
    row["a_sampler_vs_teacher_forced"] = dev(lp_a, a_fp8)
    if isinstance(engines.get("fp8"), str) or isinstance(engines.get("auto"), str) or not engines:
        row["b"] = engines.get("fp8") if isinstance(engines.get("fp8"), str) else "not run"
        return row
    e0, e8 = engines["auto"], engines["fp8"]
    gens_b = e8.generate(prompts, args.new_tokens, stop_token_ids=[])
    seqs_b = [p + g.token_ids for p, g in zip(prompts, gens_b)]
    lp_b = torch.tensor([v for g in gens_b for v in g.log_probs], dtype=torch.float64)
    v_auto, v_fp8 = (sampled(e.score(seqs_b), seqs_b, plens) for e in (e0, e8))
    row["b_fp8_vs_full"] = dev(v_fp8, v_auto)
    row["b_sampler_vs_teacher_forced"] = dev(lp_b, v_fp8)
    # (a) vs (b) on every sequence: both fp8 caches, both float32 caches, and their deviations
    seqs, lens = seqs_a + seqs_b, plens + plens
    hf_full, hf_fp8 = (sampled(hf_scores(model, seqs, make), seqs, lens) for make in (full, fp8))
    vl_auto, vl_fp8 = (sampled(e.score(seqs), seqs, lens) for e in (e0, e8))
    row["ab_fp8_transformers_vs_vllm"] = dev(hf_fp8, vl_fp8)
    row["ab_full_transformers_vs_vllm"] = dev(hf_full, vl_auto)
    row["ab_deviation_correlation"] = corr(hf_fp8 - hf_full, vl_fp8 - vl_auto)
    row["b_fp8_vs_fp32_learner"] = dev(vl_fp8, hf_full)
    return row


def bench_arch(arch: str, tokenizer, args) -> dict:
    from transformers import DynamicCache

    from compactrl.policies.fp8_cache import Fp8KVCache
    from compactrl.policies.tiny_moe import tiny_moe

    model = tiny_moe(arch, vocab_size=len(tokenizer), seed=0, **ARCHS[arch])
    out: dict = {"config": {k: getattr(model.config, k) for k in ("num_hidden_layers", "num_key_value_heads",
                                                                  "head_dim", "hidden_size")},
                 "bytes_per_token": {
                     "analytic_fp32": analytic_bytes_per_token(model.config, 4),
                     "analytic_fp8": analytic_bytes_per_token(model.config, 1),
                     "transformers_fp32": hf_bytes_per_token(model, lambda c: DynamicCache(config=c)),
                     "transformers_fp8": hf_bytes_per_token(model, lambda c: Fp8KVCache(c))},
                 "variants": {}, "load": [uptime()]}
    with tempfile.TemporaryDirectory() as d:
        engines = start_engines(model, tokenizer, Path(d), args) if args.vllm else {}
        try:
            for kv, pol in engines.items():
                if not isinstance(pol, str):
                    out["bytes_per_token"][f"vllm_{kv}"] = engine_bytes_per_token(pol)
            for name, scale in VARIANTS.items():
                if scale != 1.0:
                    with torch.no_grad():
                        model.lm_head.weight.mul_(scale)
                    for pol in engines.values():  # the same weights in every engine (no probe: fp8 is meant to differ)
                        if not isinstance(pol, str):
                            pol.sync_weights(model)
                out["variants"][name] = bench_variant(model, tokenizer, engines, args, seed=args.seed)
                out["load"].append(uptime())
                print(f"  {arch} {name}: {json.dumps(out['variants'][name])}", flush=True)
        finally:
            for pol in engines.values():
                if not isinstance(pol, str):
                    pol.close()
    return out


# -- report --------------------------------------------------------------------------------------------


def _md(d) -> str:
    return f"{d['max']:.3g} / {d['mean']:.3g}" if isinstance(d, dict) else "-"


def render(res: dict) -> str:
    m = res["machine"]
    lines = ["# FP8 KV cache: memory and log-prob deviation", "",
             f"Command: `{res['command']}`", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, avx512f {'present' if m['avx512f'] else 'absent'}, "
             f"AMX {'present' if m['amx_tile'] else 'absent'}; torch {m['torch']}, vllm-cpu {m.get('vllm', '?')}. "
             f"Load: `{res['load_start']}` at the start, `{res['load_end']}` at the end.", "",
             f"{res['prompts']} prompts of 16-64 random tokens, {res['new_tokens']} sampled tokens each "
             "(temperature 1), fp32 weights; |delta log p| over the sampled tokens, max / mean. "
             "(a) compactrl's Fp8KVCache vs the float32 cache, teacher-forced on the fp8 sampler's sequences; "
             "(b) vLLM kv_cache_dtype=fp8 vs vLLM's default cache, on the fp8 engine's sequences; "
             "a vs b: the two fp8 caches on all those sequences (the floor beside it: the two float32 caches).", "",
             "| model | head | (a) fp8 vs fp32 | (a) nearest-even | (a) sampler vs scored | (b) fp8 vs auto "
             "| (b) sampler vs scored | fp8: transformers vs vLLM | fp32: transformers vs vLLM "
             "| corr of deviations | vLLM fp8 vs fp32 learner |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for arch, a in res["archs"].items():
        for name, r in a["variants"].items():
            corr_ = r.get("ab_deviation_correlation")
            lines.append(
                f"| {arch} | {name} | {_md(r['a_fp8_vs_full'])} | {_md(r['a_nearest_vs_full'])} "
                f"| {_md(r['a_sampler_vs_teacher_forced'])} | {_md(r.get('b_fp8_vs_full', r.get('b')))} "
                f"| {_md(r.get('b_sampler_vs_teacher_forced'))} | {_md(r.get('ab_fp8_transformers_vs_vllm'))} "
                f"| {_md(r.get('ab_full_transformers_vs_vllm'))} "
                f"| {'-' if corr_ is None else f'{corr_:.4f}'} | {_md(r.get('b_fp8_vs_fp32_learner'))} |")
    lines += ["", "KV cache bytes per token (all layers, keys and values):", "",
              "| model | fp32 (analytic) | fp8 (analytic) | transformers fp32 | transformers fp8 | vLLM auto | vLLM fp8 |",
              "|---|---|---|---|---|---|---|"]
    for arch, a in res["archs"].items():
        b = a["bytes_per_token"]
        f = lambda k, b=b: "-" if b.get(k) is None else f"{b[k]:.1f}"  # noqa: E731
        lines.append(f"| {arch} | {b['analytic_fp32']} | {b['analytic_fp8']} | {f('transformers_fp32')} "
                     f"| {f('transformers_fp8')} | {f('vllm_auto')} | {f('vllm_fp8')} |")
    q = res.get("quantiser")
    if q:
        lines += ["", f"vLLM's CPU fp8 quantiser (`cpu_attn_reshape_and_cache`) vs `quantize_fp8` on {q.get('values')} "
                  f"values from 1e-4 to 1e3, share of identical bytes: " +
                  ", ".join(f"{k.removesuffix('_bit_equal_share')} {v:.4f}" for k, v in q.items()
                            if k.endswith("share")) + (f" ({q['error']})" if "error" in q else "")]
    lines += ["", "Transformers generation, new tokens/s (float32 cache, fp8 cache), 1 thread: " +
              "; ".join(f"{arch} {name} {r['transformers_gen_tok_s']['auto']} / {r['transformers_gen_tok_s']['fp8']}"
                        for arch, a in res["archs"].items() for name, r in a["variants"].items()), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-vllm", dest="vllm", action="store_false", help="only the transformers cache")
    p.add_argument("--out", default=str(RESULTS / "fp8_kv_bench"))
    args = p.parse_args(argv)
    from compactrl.serving.vllm.client import engine_env_missing
    from compactrl.tokenizer import load_tokenizer

    if args.vllm and engine_env_missing():
        print(engine_env_missing(), file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer()
    command = " ".join(["python benchmarks/fp8_kv_bench.py", *(argv if argv is not None else sys.argv[1:])])
    res: dict = {"command": command,
                 "machine": machine(), "load_start": uptime(), "prompts": args.prompts, "new_tokens": args.new_tokens}
    if args.vllm:
        ver = subprocess.run([str(vllm_python()), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                             capture_output=True, text=True)
        res["machine"]["vllm"] = ver.stdout.strip() or "?"
        res["quantiser"] = quantiser_check()
        print(f"quantiser: {json.dumps(res['quantiser'])}", flush=True)
    res["archs"] = {}
    for arch in [a.strip() for a in args.archs.split(",") if a.strip()]:
        if arch not in ARCHS:
            raise ValueError(f"--archs: expected some of {sorted(ARCHS)}, got {arch!r}")
        res["archs"][arch] = bench_arch(arch, tokenizer, args)
    res["load_end"] = uptime()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", json.dumps(res, indent=1) + "\n"), (".md", render(res))):
        tmp = out.with_suffix(suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(out.with_suffix(suffix))
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
