"""The protocol between the learner and the vLLM engine process: message framing and tensor encoding.

Both ways a message is an 8-byte big-endian length, then a pickle of plain Python values (str, int,
float, bool, bytes, lists, dicts). Tensors travel as ``{"dtype", "shape", "data"}`` (raw bytes,
:func:`encode_tensor`), so the two sides' torch versions never meet in a pickle. Every request is a
dict with an ``op``; every answer is ``{"ok": True, ...}`` or ``{"ok": False, "error": "<type>:
<message>", "traceback"}`` (:func:`error_answer`).

Ops (the engine's side: :mod:`compactrl.serving.vllm.engine`; the learner's:
:class:`compactrl.serving.vllm.client.VLLMEngine`):

* ``start`` (first, once): ``llm_kwargs`` of ``vllm.LLM`` and the initial weight ``version``; answers
  the engine's info;
* ``generate``: token-id prompts (``TokensPrompt``) and one ``SamplingParams`` dict each; answers the
  sampled ids, the log-probs of the sampled tokens, and the weight version that sampled them;
* ``score``: token sequences; answers ``log p(seq[t] | seq[:t])`` for ``t >= 1`` from vLLM's prompt
  log-probs (``SamplingParams(prompt_logprobs=0, max_tokens=1)``);
* ``stage``: one bucket of ``(checkpoint name, tensor)`` pairs of the next weight version;
* ``commit``: load the staged weights, take ``version``, reset the prefix cache (no KV computed with
  old weights is reused);
* ``info``, ``shutdown``; ``perturb`` (tests only: corrupt one weight in place, to show that the
  post-sync check catches a bad engine).

This module imports the standard library and torch only: the engine process, which runs in its own
environment without the compactrl package, loads it from beside its script.
"""

from __future__ import annotations

import pickle
import socket
import struct
import traceback
from collections.abc import Iterable, Iterator
from typing import Any

import torch

HEADER = struct.Struct("!Q")
MAX_MESSAGE = 1 << 34
"""Largest message accepted (16 GiB): a length beyond it means a corrupt stream."""


def send_msg(sock: socket.socket, obj: Any) -> None:
    """Send one message: its length, then its pickle."""
    data = pickle.dumps(obj, protocol=5)
    sock.sendall(HEADER.pack(len(data)))
    sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def recv_msg(sock: socket.socket) -> Any:
    """Receive one message; ``EOFError`` when the other side closed, ``ValueError`` on a corrupt length."""
    (n,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if n > MAX_MESSAGE:
        raise ValueError(f"message of {n} bytes announced: the stream is corrupt")
    return pickle.loads(_recv_exact(sock, n))


def encode_tensor(t: torch.Tensor) -> dict[str, Any]:
    """A tensor as plain values (any dtype, bf16 included: its bytes are sent as they are)."""
    t = t.detach().to("cpu").contiguous()
    raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": raw.numpy().tobytes()}


def decode_tensor(d: dict[str, Any]) -> torch.Tensor:
    """The tensor :func:`encode_tensor` encoded, bit for bit."""
    dtype = getattr(torch, d["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {d['dtype']!r}")
    if not d["data"]:
        return torch.empty(d["shape"], dtype=dtype)
    return torch.frombuffer(bytearray(d["data"]), dtype=torch.uint8).view(dtype).reshape(d["shape"])


def named_tensors(items: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, tensor)`` pairs as a ``stage`` request carries them."""
    for name, t in items:
        yield name, encode_tensor(t)


def error_answer(exc: BaseException) -> dict[str, Any]:
    """The answer to a request that failed with ``exc`` (call it in the ``except`` block: it quotes the
    traceback being handled)."""
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
