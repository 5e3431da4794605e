"""Helpers shared by the policy tests (imported by name: pytest puts this folder on sys.path)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from server_helpers import server_url  # noqa: F401 - the policy tests call it from here

from compactrl.policies.tiny_moe import tiny_moe

REPO = Path(__file__).resolve().parents[2]

_MODELS: dict = {}


def cached_tiny(arch: str, **kwargs):
    """One tiny model per (arch, kwargs) per session: building one takes ~0.3 s."""
    key = (arch, tuple(sorted(kwargs.items())))
    if key not in _MODELS:
        _MODELS[key] = tiny_moe(arch, **kwargs)
    return _MODELS[key]


def random_prompts(n: int, *, lo: int = 4, hi: int = 120, vocab: int = 4096, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(3, vocab, (k,), generator=g).tolist() for k in lengths]


def right_padded(seqs: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = True
    return tokens, mask


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout: float = 120.0) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if requests.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not healthy after {timeout} s")


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    """``compactrl serve`` in a real subprocess on a loopback port the kernel picks."""
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "compactrl.cli", "serve", "--port", "0", "--threads", "2", *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        url, _ = server_url(proc)
        wait_healthy(url, proc)
    except BaseException:
        proc.kill()
        proc.wait(timeout=10)
        raise
    return proc, url


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
