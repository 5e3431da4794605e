"""Expert disagreement between a bf16 sampler and the fp32 learner on tiny MoE models, and what replay does.

The sampler is a bf16 copy of the fp32 model and samples continuations of random prompts with the in-process
KV-cached sampler (routes recorded); the learner is the fp32 model. Reported per model: the fraction of
tokens whose expert set differs in at least one MoE layer (sampler's recorded routes vs the learner's own
forward), over all tokens and over generated tokens, and the |delta log p| between the sampler's log-probs
and the learner's on the generated tokens, without and with routing replay.

    python benchmarks/routing_disagreement.py            # writes benchmarks/results/routing_disagreement.{json,md}
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch

from compactrl.policies.routing import forward_routes, moe_routers, replay_routes, route_disagreement
from compactrl.policies.sampling import SamplingConfig
from compactrl.policies.tiny_moe import tiny_moe
from compactrl.policies.transformers_policy import TransformersPolicy, generate_tokens
from compactrl.tokenizer import load_tokenizer

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {  # name -> tiny_moe keywords
    "glm4_moe (run default: 2 layers, 1 MoE, 4 experts, top-2)": dict(arch="glm4_moe"),
    "glm4_moe (4 layers, 3 MoE, 16 experts, top-4)": dict(arch="glm4_moe", num_layers=4, num_experts=16,
                                                           experts_per_token=4),
    "qwen3_moe (4 layers, 16 experts, top-4)": dict(arch="qwen3_moe", num_layers=4, num_experts=16,
                                                    experts_per_token=4),
}


def _padded(seqs, routes, layers, k):
    width = max(len(s) for s in seqs)
    tokens = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    batch_routes = torch.full((len(seqs), width, layers, k), 255, dtype=torch.uint8)
    for i, (s, r) in enumerate(zip(seqs, routes)):
        tokens[i, :len(s)], mask[i, :len(s)] = torch.tensor(s), True
        batch_routes[i, :len(s)] = torch.from_numpy(r)
    return tokens, mask, batch_routes


def measure(kw: dict, *, prompts: int, prompt_len: int, new_tokens: int, seed: int) -> dict:
    model = tiny_moe(seed=seed, **kw)
    sampler = copy.deepcopy(model).to(torch.bfloat16)
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompt_ids = [torch.randint(3, vocab, (prompt_len,), generator=g).tolist() for _ in range(prompts)]
    gens = generate_tokens(sampler, prompt_ids, [new_tokens] * prompts, sampling=SamplingConfig(), stop_ids=[-1],
                           generator=g)
    seqs = [p + x.token_ids for p, x in zip(prompt_ids, gens)]
    layers, k = len(moe_routers(model)), model.config.num_experts_per_tok
    tokens, mask, sampled = _padded(seqs, [x.routed_experts for x in gens], layers, k)
    generated = torch.zeros_like(mask)
    for i, p in enumerate(prompt_ids):
        generated[i, len(p):len(seqs[i])] = True
    learner_routes = forward_routes(model, tokens, mask)
    out = {"moe_layers": layers, "top_k": k, "tokens": int(mask.sum()), "generated_tokens": int(generated.sum())}
    for name, where in (("all", mask), ("generated", generated)):
        differ, count = route_disagreement(sampled, learner_routes, where)
        out[f"disagree_{name}"] = differ / count
    learner = TransformersPolicy(model, load_tokenizer())
    sample_lp = torch.zeros(tokens.shape)
    for i, (p, x) in enumerate(zip(prompt_ids, gens)):
        sample_lp[i, len(p):len(seqs[i])] = torch.tensor(x.log_probs)
    for name, routes in (("no_replay", None), ("replay", sampled)):
        with torch.no_grad(), replay_routes(model, routes):
            lp, _ = learner.log_prob(tokens, mask)
        d = (lp - sample_lp)[generated].abs()
        out[f"max_abs_dlogp_{name}"], out[f"mean_abs_dlogp_{name}"] = float(d.max()), float(d.mean())
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "routing_disagreement"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = {name: [measure(kw, prompts=args.prompts, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                           seed=s) for s in range(args.seeds)] for name, kw in MODELS.items()}
    Path(args.out + ".json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    lines = ["| model (random init, seed) | tokens | differ: all tokens | differ: generated | max / mean |dlogp| "
             "no replay | max / mean |dlogp| replay |", "|---|---|---|---|---|---|"]
    for name, runs in rows.items():
        for s, r in enumerate(runs):
            lines.append(f"| {name}, {s} | {r['tokens']} | {r['disagree_all']:.3f} | {r['disagree_generated']:.3f} | "
                         f"{r['max_abs_dlogp_no_replay']:.3g} / {r['mean_abs_dlogp_no_replay']:.3g} | "
                         f"{r['max_abs_dlogp_replay']:.3g} / {r['mean_abs_dlogp_replay']:.3g} |")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
