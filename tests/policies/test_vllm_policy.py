"""vLLM cannot run here (no GPU, not installed): these tests cover the pure parts and the weight-sync
path up to vLLM's own ``load_weights``. The output objects below mirror vLLM's real dataclasses
(``vllm.outputs.CompletionOutput``, ``vllm.logprobs.Logprob``) field for field."""

import copy
import importlib.util
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from policy_helpers import cached_tiny

from compactrl.policies.moe_weights import fuse_experts
from compactrl.policies.transformers_policy import SamplingConfig, TransformersPolicy
from compactrl.policies.vllm_policy import (
    WORKER_EXTENSION,
    VLLMEngineConfig,
    VLLMPolicy,
    WeightSyncWorkerExtension,
    parse_completion,
    sampling_kwargs,
    tokens_prompt,
)

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:  # vllm.outputs.CompletionOutput
    index: int
    text: str
    token_ids: list
    cumulative_logprob: float | None
    logprobs: list | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


def test_engine_kwargs_pass_options_through():
    cfg = VLLMEngineConfig(model="/m", tensor_parallel_size=2, kv_cache_dtype="fp8", gpu_memory_utilization=0.5,
                           max_model_len=8192, extra={"max_num_seqs": 64, "quantization": "fp8"})
    kw = cfg.llm_kwargs()
    assert kw["tensor_parallel_size"] == 2 and kw["kv_cache_dtype"] == "fp8"
    assert kw["gpu_memory_utilization"] == 0.5 and kw["max_model_len"] == 8192
    assert kw["max_num_seqs"] == 64 and kw["quantization"] == "fp8"
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["worker_extension_cls"] == WORKER_EXTENSION
    assert kw["tokenizer"] == "/m"
    module, cls = WORKER_EXTENSION.rsplit(".", 1)
    assert getattr(importlib.import_module(module), cls) is WeightSyncWorkerExtension


@pytest.mark.parametrize("kw,field", [
    ({"model": ""}, "model"), ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"), ({"kv_cache_dtype": ""}, "kv_cache_dtype"),
    ({"logprobs_mode": "nope"}, "logprobs_mode"), ({"extra": {"seed": 3}}, "extra"),
])
def test_bad_engine_config_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        VLLMEngineConfig(**{"model": "/m", **kw})


def test_sampling_kwargs_and_prompt():
    kw = sampling_kwargs(SamplingConfig(temperature=0.7, top_p=0.9, top_k=0), 33, [2, 0], seed=5)
    assert kw == dict(n=1, temperature=0.7, top_p=0.9, top_k=-1, max_tokens=33, logprobs=0,
                      stop_token_ids=[2, 0], detokenize=False, skip_special_tokens=False, seed=5)
    assert sampling_kwargs(SamplingConfig(top_k=20), 1, [2])["top_k"] == 20
    assert tokens_prompt([1, 2, 3]) == {"prompt_token_ids": [1, 2, 3]}


def test_parse_completion_output():
    out = CompletionOutput(0, "", [17, 9, 2], -3.0,
                           [{17: Logprob(-1.0, 3)}, {9: Logprob(-1.5, 1), 4: Logprob(-0.5, 1)}, {2: Logprob(-0.5)}],
                           finish_reason="stop", stop_reason=2)
    g = parse_completion(out, stop_ids=[2, 0])
    assert g.token_ids == [17, 9, 2] and g.log_probs == [-1.0, -1.5, -0.5] and g.finished
    cut = parse_completion(CompletionOutput(0, "", [5], -1.0, [{5: Logprob(-1.0)}], "length"), [2, 0])
    assert not cut.finished
    with pytest.raises(ValueError, match="logprobs=0"):
        parse_completion(CompletionOutput(0, "", [5], None, None), [2])
    with pytest.raises(ValueError, match="lack the sampled token"):
        parse_completion(CompletionOutput(0, "", [5], None, [{6: Logprob(-1.0)}]), [2])


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed")
def test_missing_vllm_is_a_clear_import_error(tokenizer):
    with pytest.raises(ImportError, match=r"compactrl\[vllm\]"):
        VLLMPolicy("/nonexistent", tokenizer)
    with pytest.raises(ImportError, match=r"compactrl\[vllm\]"):
        VLLMPolicy("/nonexistent")  # before any attempt to read the model directory


class _CheckpointLoader:
    """Stands where vLLM's model sits in a worker: takes checkpoint names, as vLLM's load_weights does."""

    def __init__(self, hf_model):
        self.hf_model = hf_model
        self.received: list[tuple[str, torch.Tensor]] = []
        self._p = torch.nn.Parameter(torch.zeros(1))

    def parameters(self):
        return iter([self._p])

    def load_weights(self, weights):
        self.received += list(weights)


class _RecordingLLM:
    """Routes ``collective_rpc`` to the worker extension like vLLM does (one worker, TP=1)."""

    def __init__(self, worker):
        self.worker, self.calls, self.resets = worker, [], 0

    def collective_rpc(self, method, args=()):
        self.calls.append(len(args[0]))
        return [getattr(self.worker, method)(*args)]

    def reset_prefix_cache(self):
        self.resets += 1


@pytest.mark.timeout(60)
def test_weight_sync_stream_rebuilds_the_trainer_model(arch, tokenizer):
    trainer = copy.deepcopy(cached_tiny(arch))
    with torch.no_grad():  # an "update": the engine must end up with these exact weights
        for p in trainer.parameters():
            p.add_(0.01 * torch.randn_like(p))
    loader = _CheckpointLoader(trainer)
    worker = type("Worker", (WeightSyncWorkerExtension,), {})()
    worker.model_runner = SimpleNamespace(model=loader)
    llm = _RecordingLLM(worker)
    policy = VLLMPolicy("/unused", tokenizer, llm=llm, sync_bucket_bytes=1 << 20)
    sent = policy.sync_weights(TransformersPolicy(trainer, tokenizer).model)
    assert sent == len(loader.received) and len(llm.calls) > 1 and llm.resets == 1
    names = [n for n, _ in loader.received]
    assert len(names) == len(set(names)) and not any(n.endswith("gate_up_proj") for n in names)
    for _, t in loader.received:  # owned copies: a pickled view would carry the whole fused tensor
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
    rebuilt = fuse_experts(loader.received, trainer.config.model_type)
    state = trainer.state_dict()
    assert rebuilt.keys() == state.keys()
    assert all(torch.equal(rebuilt[k], state[k]) for k in state)
