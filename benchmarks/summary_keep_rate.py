"""What do a model's summaries keep? The fact in the first summary, and success with and without it.

In the main preset (``compactrl train``: `tiny` CompactCode-v0 tasks at budget 860) the first
summary usually falls after the agent has read the fact and seen the stale constant, and before it
writes the fix: the next trace starts from the summary, so the fix is only as good as what the
summary kept. This script plays held-out episodes (``split="test"``, the trainer's evaluation task
seeds) with each saved model and reports, per model: held-out success, the share of episodes whose
first summary keeps a ``KEY = VALUE`` line for the fact, the share whose kept value is the right one,
and success among episodes whose first summary kept / dropped the fact.

    python benchmarks/summary_keep_rate.py runs/main/sft_model runs/main/final_model
    python benchmarks/summary_keep_rate.py runs/main/final_model --temperature 1.0 --episodes 128
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict


def first_summary_facts(summary: str) -> dict[str, str]:
    """``KEY -> VALUE`` lines under ``facts:`` in a summary's text (up to the next section)."""
    block = re.search(r"facts:\n((?:[A-Z][A-Z0-9_]* = [^\n]*\n?)*)", summary)
    if not block:
        return {}
    return dict(re.findall(r"^([A-Z][A-Z0-9_]*) = ([^\n]*)$", block.group(1), flags=re.M))


def probe(model_dir: str, *, temperature: float, episodes: int, seed: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from compactrl.eval import evaluate_policy
    from compactrl.policies.transformers_policy import TransformersPolicy
    from compactrl.tokenizer import load_tokenizer
    from compactrl.training.config import preset
    from compactrl.training.rollouts import make_env_fns

    cfg = preset("main")
    tok = load_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    policy = TransformersPolicy(model, tok, temperature=temperature, seed=cfg.eval.seed,
                                max_new_tokens=cfg.env.context_budget.reserve, max_batch_size=cfg.env.num_envs * 4)
    first: dict[str, str] = {}
    facts: dict[str, dict] = {}

    class Recording:
        def act(self, requests):
            out = policy.act(requests)
            for req, resp in zip(requests, out):
                if req.compaction_required and req.task.id not in first:
                    first[req.task.id] = tok.decode(resp.token_ids)
                    facts[req.task.id] = req.task.metadata["facts"][0]
            return out

    torch.set_num_threads(cfg.threads)
    agg, stats = evaluate_policy(make_env_fns(cfg.env, split="test", count=cfg.env.num_envs), Recording(),
                                 episodes=episodes, seed=seed, give_task_to_policy=True)
    outcome = defaultdict(list)
    right = 0
    for s in stats:
        if s.task_id not in first:
            outcome["no summary"].append(s.success)
            continue
        fact = facts[s.task_id]
        kept = first_summary_facts(first[s.task_id])
        outcome["kept" if fact["key"] in kept else "dropped"].append(s.success)
        right += kept.get(fact["key"]) == repr(fact["value"])
    n = len(stats)
    rate = {k: (sum(v) / len(v) if v else float("nan")) for k, v in outcome.items()}
    return {
        "success_rate": agg["success_rate"],
        "first_summary_keeps_fact": len(outcome["kept"]) / n,
        "first_summary_value_right": right / n,
        "success_if_kept": rate.get("kept", float("nan")),
        "success_if_dropped": rate.get("dropped", float("nan")),
        "no_summary": len(outcome["no summary"]) / n,
        "episodes": n,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="saved model directories (e.g. RUN/sft_model RUN/final_model)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy, as the trainer's eval)")
    p.add_argument("--episodes", type=int, default=64, help="held-out episodes per model")
    p.add_argument("--seed", type=int, default=None, help="task-seed stream (default: the trainer's eval.seed)")
    args = p.parse_args(argv)
    from compactrl.training.config import preset

    seed = preset("main").eval.seed if args.seed is None else args.seed
    for model_dir in args.models:
        row = probe(model_dir, temperature=args.temperature, episodes=args.episodes, seed=seed)
        print(json.dumps({"model": model_dir, "temperature": args.temperature,
                          **{k: round(v, 3) for k, v in row.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
