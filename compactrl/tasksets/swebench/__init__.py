"""SWE-bench: rows -> tasks (:mod:`.rows`), the harness's grading (:mod:`.grading`, :mod:`.parity`), which
tests need the network (:mod:`.network`), and environments prepared for the local sandbox
(:mod:`.prepare`, :mod:`.submodules`)."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "SWEBenchConfig": "compactrl.tasksets.swebench.rows",
    "SWEBenchError": "compactrl.tasksets.swebench.rows",
    "load_swebench": "compactrl.tasksets.swebench.rows",
    "PrepareConfig": "compactrl.tasksets.swebench.prepare",
    "PrepareError": "compactrl.tasksets.swebench.prepare",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'compactrl.tasksets.swebench' has no attribute {name!r}")
