"""Policies: scripted (oracle, random), Hugging Face models, OpenAI-compatible clients. The vLLM engine's
policy is served from its own process: :class:`compactrl.serving.vllm.policy.VLLMPolicy`.

Names are resolved lazily so that ``import compactrl.policies`` stays cheap and optional
dependencies (vllm) are imported only when used.
"""

from __future__ import annotations

from compactrl.lazy import lazy_exports

_EXPORTS = {
    "OraclePolicy": "compactrl.policies.scripted.code",
    "RandomPolicy": "compactrl.policies.scripted.code",
    "TransformersPolicy": "compactrl.policies.transformers_policy",
    "ValueModel": "compactrl.policies.critic",
    "OpenAICompletionsPolicy": "compactrl.policies.openai_client",
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
