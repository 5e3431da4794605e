"""Test logs in records, whole: ``compactrl eval --out`` lines and ``tasks validate --json-out`` verdicts.

A record keeps the whole output of the graded test run (the log the verdict parsed, followed by the
grader's lines), so anyone can grade it again with the harness's own parser. Small logs stay readable;
large ones are compressed inside the record, which stays one self-contained JSON line:

* ``test_output``: the whole output as text, when its UTF-8 form is at most :data:`INLINE_BYTES`;
* ``test_output_gzip_base64``: otherwise, the base64 of the gzip of its UTF-8 form (``test_output``
  is then absent);
* ``test_output_bytes``: the size of its UTF-8 form, ``test_output_sha256``: its digest;
* ``test_output_complete``: False only when the run printed more than the sandbox's test capture limit
  (``test_output_limit_bytes``, 64 MiB): its head and tail are kept with a marker.

:func:`record_output` reads either form back (and checks the digest).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
from collections.abc import Mapping
from typing import Any

INLINE_BYTES = 64 << 10
"""Logs up to this size (UTF-8) stay plain text in a record; larger ones are gzip+base64."""
KEYS = ("test_output", "test_output_gzip_base64", "test_output_bytes", "test_output_sha256")


def encode_output(text: str, inline_bytes: int = INLINE_BYTES) -> dict[str, Any]:
    """The record fields of a whole test output (see the module docstring)."""
    raw = text.encode("utf-8", errors="surrogatepass")
    out: dict[str, Any] = {"test_output_bytes": len(raw), "test_output_sha256": hashlib.sha256(raw).hexdigest()}
    if len(raw) <= inline_bytes:
        out["test_output"] = text
    else:  # mtime 0: the same log gives the same record
        out["test_output_gzip_base64"] = base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")
    return out


def with_encoded_output(info: Mapping[str, Any], inline_bytes: int = INLINE_BYTES) -> dict[str, Any]:
    """``info`` with its ``test_output`` in record form (unchanged when it has none)."""
    out = dict(info)
    if isinstance(out.get("test_output"), str):
        out.update(encode_output(out.pop("test_output"), inline_bytes))
    return out


def record_output(info: Mapping[str, Any]) -> str | None:
    """The whole test output a record's ``info`` (or a validate verdict) holds, or None; a ValueError
    when the text does not match its recorded digest."""
    if "test_output_gzip_base64" in info:
        raw = gzip.decompress(base64.b64decode(info["test_output_gzip_base64"]))
    elif isinstance(info.get("test_output"), str):
        raw = info["test_output"].encode("utf-8", errors="surrogatepass")
    else:
        return None
    digest = info.get("test_output_sha256")
    if digest and hashlib.sha256(raw).hexdigest() != digest:
        raise ValueError(f"test output: sha256 {hashlib.sha256(raw).hexdigest()} is not the recorded {digest}")
    return raw.decode("utf-8", errors="surrogatepass")
