"""SWE-bench: rows -> tasks (:mod:`.rows`), the harness's grading (:mod:`.grading`, :mod:`.parity`), which
tests need the network (:mod:`.network`), and environments prepared for the local sandbox
(:mod:`.prepare`, :mod:`.submodules`)."""

from __future__ import annotations

from compactrl.lazy import lazy_exports

_EXPORTS = {
    "SWEBenchConfig": "compactrl.tasksets.swebench.rows",
    "SWEBenchError": "compactrl.tasksets.swebench.rows",
    "load_swebench": "compactrl.tasksets.swebench.rows",
    "PrepareConfig": "compactrl.tasksets.swebench.prepare",
    "PrepareError": "compactrl.tasksets.swebench.prepare",
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
