"""Does an SFT model copy the fact? Teacher-forced accuracy at the value tokens of held-out demonstrations.

A `tiny` CompactCode-v0 task is solved by copying one value: the demonstrator writes
``Next: fix KEY = V in FILE.``, then ``<old>\\nKEY = STALE`` and ``<new>\\nKEY = V``. This script
replays held-out (``split="test"``) demonstrations through the training wrapper and reports, for a
saved model, the share of those three value tokens it predicts (argmax) given the demonstration's
prefix, next to the accuracy over every policy token. The first (``next``) is the retrieval from
the config line; ``old`` copies the stale value from the viewed bug file; ``new`` copies the value
written a few lines earlier.

    python benchmarks/sft_value_accuracy.py runs/main/sft_model [more model dirs...]
"""

from __future__ import annotations

import argparse
import json
import re

import torch

PATTERNS = {
    "next": r"Next: fix [A-Z_]+ =\s*$",
    "old": r"<old>\n[A-Z_]+ =\s*$",
    "new": r"<new>\n[A-Z_]+ =\s*$",
}


def held_out_demos(episodes: int, seed: int):
    """Reading-order demonstrations on test-split tasks, through the main preset's wrapper (all kept)."""
    from compactrl.training.config import override, preset
    from compactrl.training.trainer import collect_demonstrations

    cfg = override(preset("main"), {"seed": seed, "sft.demo_episodes": episodes, "sft.keep_truncated": True})
    return collect_demonstrations(cfg, pad_id=0, split="test")[0]


def value_positions(batch, tokenizer) -> dict[str, torch.Tensor]:
    """[N, L-1] masks of the target positions (shifted: position t predicts token t+1)."""
    out = {k: torch.zeros(batch["tokens"].shape, dtype=torch.bool) for k in PATTERNS}
    for i in range(batch.batch_size[0]):
        text = ""
        for j, (t, pm) in enumerate(zip(batch["tokens"][i].tolist(), batch["policy_mask"][i].tolist())):
            piece = tokenizer.decode([t])
            if pm and piece.strip()[:1].isdigit():
                for k, pat in PATTERNS.items():
                    if re.search(pat, text):
                        out[k][i, j] = True
            text += piece
    return {k: v[:, 1:] for k, v in out.items()}


@torch.no_grad()
def accuracy(model_dir: str, batch, positions) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from compactrl.policies.transformers_policy import positions_from_mask

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    mask = batch["attention_mask"].long()
    logits = model(input_ids=batch["tokens"], attention_mask=mask, position_ids=positions_from_mask(mask)).logits
    pred, target = logits[:, :-1].argmax(-1), batch["tokens"][:, 1:]
    every = (batch["policy_mask"] & batch["attention_mask"].bool())[:, 1:]
    res = {"all_policy_tokens": float((pred[every] == target[every]).float().mean())}
    for k, sel in positions.items():
        res[k] = float((pred[sel] == target[sel]).float().mean())
        res[f"{k}_count"] = int(sel.sum())
    return res


def main(argv: list[str] | None = None) -> int:
    from compactrl.tokenizer import load_tokenizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="saved model directories (save_pretrained)")
    p.add_argument("--episodes", type=int, default=64, help="held-out demonstrations")
    p.add_argument("--seed", type=int, default=999)
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    batch = held_out_demos(args.episodes, args.seed)
    positions = value_positions(batch, load_tokenizer())
    for model_dir in args.models:
        print(json.dumps({"model": model_dir, **accuracy(model_dir, batch, positions)}))  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
