"""Serving: ``compactrl serve``, the OpenAI-compatible completions server, in four modules by concern (the
``/v1/completions`` formats :mod:`.completions`, the batching engines :mod:`.batching`, the HTTP server
:mod:`.server`, the command line :mod:`.cli`), and the vLLM engine in a process of its own
(:mod:`.vllm`). Policies sample; this package serves them and talks to engines.

Names resolve lazily, so that ``import compactrl.serving`` imports neither FastAPI nor torch.
"""

from __future__ import annotations

from compactrl.lazy import lazy_exports

_EXPORTS = {
    "ServeConfig": "compactrl.serving.server",
    "make_server": "compactrl.serving.server",
    "VLLMEngineConfig": "compactrl.serving.vllm.client",
    "VLLMEngine": "compactrl.serving.vllm.client",
    "VLLMPolicy": "compactrl.serving.vllm.policy",
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
