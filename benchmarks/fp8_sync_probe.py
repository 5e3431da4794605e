"""The post-sync probe check under an fp8 KV cache: max and mean |delta log p| on the probe batch after a
correct sync, after one MoE layer's expert weights are perturbed in the engine, and with a stale expert
layout, for each model given (a bf16 vLLM engine with vLLM's fp8 cache; needs .venv-vllm and a CPU with
AVX-512 or AMX). Sets ``FP8_KV_SYNC_MEAN_TOLERANCE`` (compactrl/serving/vllm/policy.py).

    python benchmarks/fp8_sync_probe.py [MODEL_DIR ...]   # default: the mismatch experiment's SFT model

The RL-trained models measured in docs/policies.md were the mismatch experiment's cells'
``<arm>/seed3/final_model`` run directories (not kept in git; ``benchmarks/mismatch_experiment.py`` makes them).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "benchmarks" / "results" / "mismatch_experiment" / "sft" / "sft_model"


def main(argv: list[str]) -> int:
    from transformers import AutoModelForCausalLM

    from compactrl.provenance import cpu_model
    from compactrl.serving.vllm.policy import VLLMPolicy, learner_log_probs, max_abs_diff
    from compactrl.tokenizer import shared_tokenizer

    models = argv or [str(DEFAULT)]
    load = lambda m: AutoModelForCausalLM.from_pretrained(m, dtype="float32")  # noqa: E731
    with tempfile.TemporaryDirectory() as d:
        pol = VLLMPolicy.from_model(load(models[0]), shared_tokenizer(), d,
                                    engine={"dtype": "bfloat16", "kv_cache_dtype": "fp8"}, sync_tolerance=1e9)
        try:
            for m in models:
                model = load(m)
                row = pol.update_weights(model)
                good = row["engine/probe_max_abs_dlogp"], row["engine/probe_mean_abs_dlogp"]
                pol.engine.call("perturb", name_part="w2_weight", scale=0.05)  # one MoE layer's experts, +-5%
                perturbed = max_abs_diff(pol.score(pol.probe), learner_log_probs(model, pol.probe))
                row = pol.update_weights(model, repack_experts=False)
                stale = row["engine/probe_max_abs_dlogp"], row["engine/probe_mean_abs_dlogp"]
                pol.update_weights(model)
                print(json.dumps({"model": m, "cpu": cpu_model(), "correct (max, mean)": good,  # noqa: T201
                                  "w2 perturbed 5%": perturbed, "stale expert layout": stale}), flush=True)
        finally:
            pol.engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
