"""The learner side of the vLLM engine without an engine: wire format, configuration, sampling
arguments, the probe check's arithmetic, and the clear errors. The engine itself is tested for real
in tests/vllm (it needs the engine environment, ``bash scripts/setup.sh --vllm``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest
import torch
from policy_helpers import cached_tiny

from compactrl.policies.sampling import SamplingConfig
from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.serving.vllm import wire
from compactrl.serving.vllm.client import ENGINE_SCRIPT, VLLMEngineConfig
from compactrl.serving.vllm.policy import learner_log_probs, max_abs_diff, probe_sequences, sampling_kwargs


def test_the_engine_script_runs_by_path_outside_the_package(tmp_path):
    """As the engine process starts it (``python -P`` on the file, no compactrl on the path), the script
    finds its protocol module beside itself and answers a ``start`` that fails (no vllm here, or no
    model in the folder) with an error answer over the socket, the traceback included."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-P", str(ENGINE_SCRIPT), "--fd", str(theirs.fileno())],
                            pass_fds=[theirs.fileno()], cwd=tmp_path, env=env, stderr=subprocess.PIPE)
    theirs.close()
    try:
        ours.settimeout(60)
        wire.send_msg(ours, {"op": "start", "llm_kwargs": {"model": str(tmp_path)}})
        answer = wire.recv_msg(ours)
    finally:
        ours.close()
        proc.wait(timeout=60)
    assert answer["ok"] is False and answer["error"]  # no vllm in this environment, or no model in tmp_path
    assert "Traceback" in answer["traceback"] and proc.returncode == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_tensors_cross_the_wire_bit_exact(dtype):
    t = (torch.randn(3, 5) * 100).to(dtype)
    back = wire.decode_tensor(wire.encode_tensor(t[:, 1:4]))  # a non-contiguous view is sent as its values
    assert back.dtype == dtype and back.shape == (3, 3)
    assert torch.equal(back.view(torch.uint8) if dtype != torch.bool else back,
                       t[:, 1:4].contiguous().view(torch.uint8) if dtype != torch.bool else t[:, 1:4])
    assert wire.decode_tensor(wire.encode_tensor(torch.tensor(2.5))).item() == 2.5  # 0-d
    assert wire.decode_tensor(wire.encode_tensor(torch.empty(0, 4))).shape == (0, 4)


def test_messages_round_trip_over_a_socket_pair():
    a, b = socket.socketpair()
    big = {"op": "stage", "tensors": [("w", wire.encode_tensor(torch.randn(512, 512)))]}  # 1 MiB: many recv calls
    got = []
    t = threading.Thread(target=lambda: got.append(wire.recv_msg(b)))
    t.start()
    wire.send_msg(a, big)
    t.join(10)
    assert torch.equal(wire.decode_tensor(got[0]["tensors"][0][1]), wire.decode_tensor(big["tensors"][0][1]))
    a.close()
    with pytest.raises(EOFError):
        wire.recv_msg(b)
    b.close()


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="dtype"):
        wire.decode_tensor({"dtype": "nonsense", "shape": [1], "data": b"\0"})


def test_engine_kwargs_and_process_env():
    cfg = VLLMEngineConfig(model="/m", dtype="bfloat16", kv_cache_dtype="fp8", enable_return_routed_experts=True,
                           threads=2, kv_cache_gib=3, extra={"enforce_eager": True})
    kw = cfg.llm_kwargs()
    assert kw["model"] == "/m" and kw["skip_tokenizer_init"] is True and kw["dtype"] == "bfloat16"
    assert kw["kv_cache_dtype"] == "fp8" and kw["enable_return_routed_experts"] is True
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["enforce_eager"] is True
    assert "enable_return_routed_experts" not in VLLMEngineConfig(model="/m").llm_kwargs()
    env = cfg.process_env()
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["OMP_NUM_THREADS"] == "2"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_route_capture_runs_the_engine_eagerly():
    """In-engine route capture (tests/vllm/test_engine_routes.py) needs the routers' Python callbacks, so
    an eager model; it and vLLM's own routed-experts return are one or the other."""
    assert VLLMEngineConfig(model="/m", capture_routes=True).llm_kwargs()["enforce_eager"] is True
    assert "enforce_eager" not in VLLMEngineConfig(model="/m").llm_kwargs()
    with pytest.raises(ValueError, match="capture_routes and enable_return_routed_experts"):
        VLLMEngineConfig(model="/m", capture_routes=True, enable_return_routed_experts=True)


@pytest.mark.parametrize("kw,field", [
    ({"model": ""}, "model"), ({"dtype": "int8"}, "dtype"), ({"kv_cache_dtype": ""}, "kv_cache_dtype"),
    ({"logprobs_mode": "x"}, "logprobs_mode"), ({"max_model_len": 0}, "max_model_len"), ({"threads": 0}, "threads"),
    ({"start_timeout_s": 0}, "start_timeout_s"), ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"extra": {"dtype": "float16"}}, "extra"),
])
def test_bad_engine_config_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        VLLMEngineConfig(**{"model": "/m", **kw})


def test_sampling_kwargs():
    kw = sampling_kwargs(SamplingConfig(temperature=0.7, top_p=0.9, top_k=5), 12, [2, 0], seed=3)
    assert kw == dict(n=1, temperature=0.7, top_p=0.9, top_k=5, max_tokens=12, logprobs=0, stop_token_ids=[2, 0],
                      detokenize=False, skip_special_tokens=False, seed=3)
    assert "seed" not in sampling_kwargs(SamplingConfig(), 1, [])
    assert sampling_kwargs(SamplingConfig(), 1, [])["top_k"] == 0  # vLLM's "off"


def test_probe_is_fixed_and_learner_log_probs_match_log_prob(tokenizer):
    assert probe_sequences(4096) == probe_sequences(4096)
    assert probe_sequences(4096, seed=1) != probe_sequences(4096)
    with pytest.raises(ValueError, match="probe"):
        probe_sequences(4096, length=1)
    model = cached_tiny("qwen3_moe")
    seqs = probe_sequences(4096, count=2, length=9)
    got = learner_log_probs(model, seqs)
    tokens = torch.tensor(seqs)
    with torch.no_grad():
        ref, _ = TransformersPolicy(model, tokenizer).log_prob(tokens, torch.ones_like(tokens))
    assert max_abs_diff(got, ref[:, 1:].tolist())[0] < 1e-5
    assert max_abs_diff([[1.0, 2.0]], [[1.5, 2.0]]) == (0.5, 0.25)


def test_missing_engine_environment_says_how_to_build_it(tmp_path, tokenizer):
    from compactrl.distributed.engines import vllm_engine
    from compactrl.serving.vllm.policy import VLLMPolicy

    missing = str(tmp_path / "no-venv" / "bin" / "python")
    with pytest.raises(FileNotFoundError, match=r"scripts/setup.sh --vllm"):
        VLLMPolicy(VLLMEngineConfig(model=str(tmp_path), python=missing), tokenizer)
    with pytest.raises(FileNotFoundError, match=r"scripts/setup.sh --vllm"):
        vllm_engine(str(tmp_path), 0, engine_kwargs={"python": missing})


def test_the_train_config_reaches_the_engine(tokenizer):
    """``rollout.engine_dtype`` and ``rollout.engine_sync_tolerance`` reach the run's engine; the engine
    samples like the trained policy (the smoke run on a real engine: tests/vllm/test_train.py)."""
    from compactrl.training import rollouts as T
    from compactrl.training.config import override, preset

    cfg = override(preset("smoke"), {"rollout.engine": "vllm", "rollout.engine_dtype": "bfloat16",
                                     "rollout.engine_sync_tolerance": 0.05, "model.temperature": 0.7, "seed": 4})
    policy, _ = T.build_policy(cfg, tokenizer)
    engine, kwargs = T.engine_settings(cfg, policy)
    assert engine["dtype"] == "bfloat16" and engine["seed"] == 4 and engine["threads"] == cfg.threads
    assert kwargs["sync_tolerance"] == 0.05 and kwargs["temperature"] == 0.7
    assert kwargs["max_new_tokens"] == cfg.env.context_budget.reserve
    assert kwargs["stop_token_ids"] == policy.stop_token_ids
    from compactrl.policies.routing import moe_routers

    assert engine["capture_routes"] is bool(moe_routers(policy.model))  # an MoE policy's engine records routes
    default, _ = T.engine_settings(preset("smoke"), policy)
    assert default["dtype"] == "float32" and T.engine_settings(preset("smoke"), policy)[1]["sync_tolerance"] is None


class _ProbeOnly:
    """The part of a VLLMEngine that ``check_sync`` talks to: scores the probe as the learner does, plus
    ``shift`` on one token (a single large deviation) and ``noise`` on every token."""

    def __init__(self, model, shift: float, noise: float):
        self.model, self.shift, self.noise = model, shift, noise

    def call(self, op, sequences, params):
        lps = [[x + self.noise for x in row] for row in learner_log_probs(self.model, sequences)]
        lps[0][0] += self.shift
        return {"log_probs": lps}


@pytest.mark.parametrize(("statistic", "tol", "shift", "noise", "passes"), [
    ("mean", 0.35, 3.6, 0.15, True),   # a correct fp8 sync of a trained model: one token off by 3.6, mean 0.15
    ("mean", 0.35, 0.0, 0.6, False),   # a corrupted one: every token off by 0.6
    ("max", 3.0, 3.6, 0.15, False),    # the max bound stops the correct fp8 sync
    ("max", 1e-3, 0.0, 0.0, True),
])
def test_the_probe_check_bounds_its_statistic(statistic, tol, shift, noise, passes):
    from compactrl.serving.vllm.policy import SyncCheckError, VLLMPolicy

    model = cached_tiny("glm4_moe")
    pol = object.__new__(VLLMPolicy)  # the check alone, without an engine process
    pol.engine, pol.probe, pol.version = _ProbeOnly(model, shift, noise), probe_sequences(64), 3  # the default 4 x 48
    pol.sync_statistic, pol.sync_tolerance = statistic, tol
    if passes:
        row = pol.check_sync(model)
        assert row["engine/probe_max_abs_dlogp"] == pytest.approx(shift + noise, abs=1e-5)
    else:
        with pytest.raises(SyncCheckError, match=rf"version 3\b.*the {statistic} beyond sync_tolerance={tol:g}"):
            pol.check_sync(model)
