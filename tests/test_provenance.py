"""What a run records about its machine, and how a CPU feature is read (tests must hold on any CPU)."""

from __future__ import annotations

import json

from compactrl.provenance import cpu_flags, cpu_model, has_avx512_or_amx, machine_stamp, stamp_markdown
from compactrl.serving.vllm.client import VLLMEngineConfig
from compactrl.serving.vllm.policy import (
    DEFAULT_SYNC_TOLERANCE,
    FP8_KV_SYNC_MEAN_TOLERANCE,
    default_sync_bound,
)

EPYC_AVX512 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni
"""
EPYC_AVX2 = EPYC_AVX512.replace("model name\t: AMD EPYC 9B14", "model name\t: AMD EPYC 7B12").split(" avx512f")[0] + "\n"
SAPPHIRE_AMX = EPYC_AVX512.replace("avx512vl", "amx_tile amx_bf16")


def test_cpu_flags_and_model_are_read_from_cpuinfo():
    assert "avx2" in cpu_flags(EPYC_AVX2) and "avx512f" not in cpu_flags(EPYC_AVX2)
    assert cpu_model(EPYC_AVX512) == "AMD EPYC 9B14"
    assert cpu_flags("") == frozenset()


def test_fp8_kv_cache_needs_avx512_or_amx_tiles():
    assert has_avx512_or_amx(cpu_flags(EPYC_AVX512))
    assert not has_avx512_or_amx(cpu_flags(EPYC_AVX2))
    assert has_avx512_or_amx(cpu_flags(SAPPHIRE_AMX))  # AMX without avx512vl: AMX alone suffices
    assert not has_avx512_or_amx(frozenset({"avx512f"}))  # torch wants F, BW, VL and DQ together


def test_machine_stamp_is_json_and_names_commit_libraries_cpu_and_threads():
    stamp = machine_stamp()
    assert json.loads(json.dumps(stamp)) == stamp
    assert {"commit", "libraries", "cpu", "threads", "python"} <= set(stamp)
    assert stamp["libraries"]["torch"] and stamp["threads"]["torch_intra_op"] >= 1
    assert set(stamp["cpu"]["isa_flags"]) <= cpu_flags()
    lines = "\n".join(stamp_markdown(stamp))
    assert stamp["cpu"]["model"] in lines and "torch kernels" in lines


def test_an_fp8_kv_cache_bounds_the_probes_mean_not_its_max():
    assert default_sync_bound(VLLMEngineConfig(model="m")) == ("max", DEFAULT_SYNC_TOLERANCE["float32"])
    assert default_sync_bound(VLLMEngineConfig(model="m", dtype="bfloat16")) == ("max", DEFAULT_SYNC_TOLERANCE["bfloat16"])
    for dtype in ("float32", "bfloat16"):
        for kv in ("fp8", "fp8_e5m2"):
            assert default_sync_bound(VLLMEngineConfig(model="m", dtype=dtype, kv_cache_dtype=kv)) == (
                "mean", FP8_KV_SYNC_MEAN_TOLERANCE)
