"""VLLMPolicy on a CUDA vLLM engine: token ids and log-probs out, agreement with
``TransformersPolicy.log_prob``, and a weight update through ``VLLMPolicy.update_weights``.

Runs where the engine environment ``.venv-vllm`` holds the CUDA build (``bash scripts/setup.sh
--vllm`` on a machine where ``nvidia-smi`` lists a GPU) and torch sees a GPU (``pytest -m gpu
tests/gpu``); skips elsewhere, saying which is missing. The engine is the project's tiny Qwen3-MoE
written to a temp dir (nothing downloaded), served by the same engine process as on CPU (its sync
is vLLM's ``reload_weights``; the CPU-only experts' repack is skipped on CUDA). vLLM computes in
float16 (bfloat16's 8-bit mantissa put single log-probs 0.3 off the float32 ones on CPU, float16
0.01); the reference is the same weights in float32 on the CPU, so every weight is first rounded to
a float16 value and both sides hold exactly the same numbers. Not yet run on a GPU.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from statistics import mean

import pytest
import torch


def _missing() -> str | None:
    from compactrl.serving.vllm.client import engine_env_missing

    if shutil.which("nvidia-smi") is None or subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode:
        return "no CUDA GPU (nvidia-smi lists none)"
    return engine_env_missing()


MISSING = _missing()
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900), pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]

TEMPERATURE = 0.8
"""Sampling temperature: vLLM's processed log-probs must be those of the tempered distribution."""
TOL = 0.05
"""Largest |engine - reference| log-prob (float16 activations; 0.010 max, 0.003 mean on CPU)."""
MAX_NEW = 24


def _fp16_exact(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.float16).float())
    return model


def _prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(k),), generator=g).tolist() for k in torch.randint(4, 60, (n,), generator=g)]


def _reference(model, tokenizer, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    """log p(response | prompt) per token under ``model`` (float32, CPU), at ``temperature``."""
    from compactrl.policies.transformers_policy import TransformersPolicy

    seq = torch.tensor([prompt + response])
    with torch.no_grad():
        lp, _ = TransformersPolicy(model, tokenizer, temperature=temperature).log_prob(seq, torch.ones_like(seq))
    return lp[0, len(prompt):].tolist()


def _errors(engine_out, prompts, model, tokenizer, temperature=TEMPERATURE) -> list[float]:
    return [abs(a - b) for p, g in zip(prompts, engine_out, strict=True)
            for a, b in zip(g.log_probs, _reference(model, tokenizer, p, list(g.token_ids), temperature), strict=True)]


@pytest.fixture(scope="module")
def tokenizer():
    from compactrl.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="module")
def trainer_model(tokenizer):
    from compactrl.policies.tiny_moe import tiny_moe

    # head_dim 64: a size every vLLM attention backend takes
    model = tiny_moe("qwen3_moe", vocab_size=len(tokenizer), hidden_size=256, head_dim=64, seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked next-token distributions: a wrong temperature shows
    return _fp16_exact(model.eval())


@pytest.fixture(scope="module")
def engine(trainer_model, tokenizer, tmp_path_factory):
    from compactrl.serving.vllm.policy import VLLMPolicy

    served = copy.deepcopy(trainer_model).to(torch.float16)
    policy = VLLMPolicy.from_model(
        served, tokenizer, tmp_path_factory.mktemp("tiny-qwen3-moe"),
        engine=dict(dtype="float16", max_model_len=1024, gpu_memory_utilization=0.3,
                    extra={"enforce_eager": True}, seed=0),
        temperature=TEMPERATURE, max_new_tokens=MAX_NEW, seed=0, sync_tolerance=TOL,
    )
    yield policy
    policy.close()


def test_act_returns_sampled_token_ids_with_their_log_probs(engine, tokenizer):
    from compactrl.types import PolicyRequest

    prompts = _prompts(8, len(tokenizer), seed=0)
    out = engine.act([PolicyRequest(messages=[], prompt_token_ids=p, max_new_tokens=16) for p in prompts])
    assert len(out) == len(prompts)
    for r in out:
        assert 1 <= len(r.token_ids) <= 16 and len(r.log_probs) == len(r.token_ids)
        assert all(0 <= t < len(tokenizer) for t in r.token_ids)
        assert all(lp <= 0.0 for lp in r.log_probs)
        assert r.finished == (r.token_ids[-1] in engine.stop_token_ids)
        body = list(r.token_ids)[: len(r.token_ids) - r.finished]  # the text leaves out the stop token
        assert str(r) == tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_engine_log_probs_agree_with_transformers_log_prob(engine, trainer_model, tokenizer):
    prompts = _prompts(6, len(tokenizer), seed=1)
    gens = engine.generate(prompts, MAX_NEW)
    errors = _errors(gens, prompts, trainer_model, tokenizer)
    assert len(errors) >= len(prompts) and max(errors) < TOL, max(errors)
    # the comparison can tell distributions apart: the untempered one is far off
    untempered = _errors(gens, prompts, trainer_model, tokenizer, temperature=1.0)
    assert mean(untempered) > 3 * mean(errors) + TOL / 10, (mean(untempered), mean(errors))


def test_weight_update_reaches_the_engine(engine, trainer_model, tokenizer):
    from compactrl.policies.moe_weights import checkpoint_weights

    updated = copy.deepcopy(trainer_model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # an "optimizer step" large enough to move every log-prob
        for p in updated.parameters():
            p.add_(0.2 * p.abs().mean() * torch.randn(p.shape, generator=g))
    _fp16_exact(updated)
    try:
        row = engine.update_weights(updated)  # sync + probe check (float16 engine vs float32 learner: TOL)
        assert row["engine/sync_tensors"] == len(list(checkpoint_weights(updated)))
        prompts = _prompts(6, len(tokenizer), seed=2)
        gens = engine.generate(prompts, MAX_NEW)
        new, old = _errors(gens, prompts, updated, tokenizer), _errors(gens, prompts, trainer_model, tokenizer)
        assert max(new) < TOL, max(new)
        assert mean(old) > 3 * mean(new) + TOL / 10, (mean(old), mean(new))  # nothing computed with old weights
    finally:
        engine.update_weights(trainer_model)  # the module's engine serves the original weights again
