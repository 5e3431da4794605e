"""Policies: scripted (oracle, random), Hugging Face models, OpenAI-compatible clients. The vLLM engine's
policy is served from its own process: :class:`compactrl.serving.vllm.policy.VLLMPolicy`.

Names are resolved lazily so that ``import compactrl.policies`` stays cheap and optional
dependencies (vllm) are imported only when used.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "OraclePolicy": "compactrl.policies.scripted.code",
    "RandomPolicy": "compactrl.policies.scripted.code",
    "TransformersPolicy": "compactrl.policies.transformers_policy",
    "ValueModel": "compactrl.policies.critic",
    "OpenAICompletionsPolicy": "compactrl.policies.openai_client",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'compactrl.policies' has no attribute {name!r}")
