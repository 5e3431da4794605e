"""Seconds per SFT step: one padded batch vs length-packed micro-batches, side by side.

    python benchmarks/sft_step_bench.py                 # the main preset's model and phase-1 demonstrations
    python benchmarks/sft_step_bench.py --steps 10 --budgets 8192 4096

Every step draws ``sft.batch_traces`` demonstration traces (the main preset's: 16 traces of up to
~900 tokens) and runs the SFT loss forward and backward under each layout in turn, on the same
traces and the same weights (no optimiser step), so machine drift hits every layout alike:

* ``one batch``: the step's traces as one tensor trimmed to the longest trace (``sft_train``
  before ``sft.micro_batch_tokens``);
* ``packed B``: :func:`compactrl.algos.packing.micro_batches` under a budget of ``B`` positions,
  each micro-batch trimmed to its own longest trace (what ``sft_train`` does).

It also reports the largest difference between the layouts' losses (the same mean over the same
tokens, so only float rounding).
"""

from __future__ import annotations

import argparse
import time

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="timed steps per layout")
    p.add_argument("--budgets", type=int, nargs="+", default=[8192], help="micro-batch budgets to time")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from compactrl.algos.packing import micro_batches
    from compactrl.tokenizer import load_tokenizer
    from compactrl.training.config import preset
    from compactrl.training.rollouts import build_policy
    from compactrl.training.sft import model_log_probs, trim_padding
    from compactrl.training.trainer import collect_demonstrations

    cfg = preset("main")
    tokenizer = load_tokenizer()
    policy, _ = build_policy(cfg, tokenizer)
    demos, _ = collect_demonstrations(cfg, tokenizer.pad_token_id or 0)
    g = torch.Generator().manual_seed(0)
    layouts = {"one batch": None, **{f"packed {b}": b for b in args.budgets}}
    seconds = {name: 0.0 for name in layouts}
    losses = {name: [] for name in layouts}
    policy.train()
    for step in range(args.steps + 1):  # step 0 warms up and is not timed
        batch = demos[torch.randperm(demos.batch_size[0], generator=g)[: cfg.sft.batch_traces]]
        for name, budget in layouts.items():
            parts = [trim_padding(batch)] if budget is None else micro_batches(batch, budget)
            policy.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            log_probs = []
            for mb in parts:
                select = mb["policy_mask"] & mb["attention_mask"]
                log_probs.append(model_log_probs(policy, mb["tokens"], mb["attention_mask"], select))
            loss = -torch.cat(log_probs).mean()
            loss.backward()
            if step:
                seconds[name] += time.perf_counter() - t0
                losses[name].append(float(loss.detach()))
    base = seconds["one batch"] / args.steps
    print(f"SFT step (forward + backward), {cfg.sft.batch_traces} traces, {args.steps} steps, "
          f"{args.threads} threads")
    print("| layout | s/step | vs one batch | max loss difference |")
    print("|---|---:|---:|---:|")
    for name in layouts:
        per = seconds[name] / args.steps
        diff = max(abs(a - b) for a, b in zip(losses[name], losses["one batch"]))
        print(f"| {name} | {per:.3f} | {base / per:.2f}x | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
