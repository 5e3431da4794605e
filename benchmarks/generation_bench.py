"""Generation throughput of TransformersPolicy: one batch of N contexts vs one context at a time.

    python benchmarks/generation_bench.py                # all three tiny archs, 32 contexts
    python benchmarks/generation_bench.py --arch glm4_moe --contexts 64 --new-tokens 64

Prints new tokens/s for the batched loop, the one-at-a-time loop, and (reference) Hugging Face
``model.generate`` on the same left-padded batch, side by side, plus whether the batched greedy
tokens equal the one-at-a-time ones. Greedy decoding with stop tokens disabled, so every context
generates exactly ``--new-tokens``.
"""

from __future__ import annotations

import argparse
import time

import torch

from compactrl.policies.tiny_moe import ARCHS, tiny_moe
from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.tokenizer import load_tokenizer


def prompts_of(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(k),), generator=g).tolist() for k in torch.randint(lo, hi + 1, (n,), generator=g)]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def hf_generate(model, prompts, new_tokens: int, pad_id: int) -> None:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False, pad_token_id=pad_id)


def bench(arch: str, args, tok) -> None:
    # no stop token can end a row early: a vocabulary id outside the model's never appears
    policy = TransformersPolicy(tiny_moe(arch, vocab_size=len(tok)), tok, temperature=0.0,
                                stop_token_ids=[len(tok) + 1], max_batch_size=args.contexts)
    prompts = prompts_of(args.contexts, args.min_len, args.max_len, len(tok), args.seed)
    policy.generate(prompts[:2], 4)  # warm-up
    total = args.contexts * args.new_tokens
    batched, t_batch = timed(lambda: policy.generate(prompts, args.new_tokens))
    single, t_single = timed(lambda: [policy.generate([p], args.new_tokens)[0] for p in prompts])
    _, t_hf = timed(lambda: hf_generate(policy.model, prompts, args.new_tokens, policy.pad_token_id))
    same = sum(b.token_ids == s.token_ids for b, s in zip(batched, single))
    print(f"{arch:10s} {total / t_batch:10.0f} {total / t_single:12.0f} {total / t_hf:14.0f} "
          f"{t_single / t_batch:8.1f}x {same:>4d}/{args.contexts}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", choices=ARCHS, action="append", help="architecture (repeatable; default all)")
    parser.add_argument("--contexts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--min-len", type=int, default=16)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = load_tokenizer()
    print(f"{args.contexts} contexts of {args.min_len}-{args.max_len} tokens, {args.new_tokens} new tokens each, "
          f"{args.threads} threads; new tokens/s")
    print(f"{'arch':10s} {'batched':>10s} {'one-by-one':>12s} {'hf generate':>14s} {'speedup':>9s} {'same':>6s}")
    for arch in args.arch or ARCHS:
        bench(arch, args, tok)


if __name__ == "__main__":
    main()
