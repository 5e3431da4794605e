"""The policy ``compactrl eval --policy`` names: a scripted one, a saved model directory or a server URL."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

SCRIPTED = ("oracle", "random", "gold", "noop")
"""oracle: reads every file and writes perfect summaries (``summary_quality``); random: random
tool calls; gold: the task's reference solution; noop: submits at once."""


@dataclass(frozen=True)
class PolicySpec:
    """How to build the evaluated policy."""

    name: str
    """One of :data:`SCRIPTED`, a saved model directory (a run's ``final_model/`` or ``sft_model/``),
    or the ``http(s)://`` URL of an OpenAI-compatible completions server (``compactrl serve``, vLLM)."""
    seed: int = 0
    """Seed of the policy's own randomness (sampling, the oracle's dropped facts)."""
    temperature: float = 0.0
    """Sampling temperature of a model or server (0 = greedy, as the trainer's held-out evaluation)."""
    max_new_tokens: int = 512
    """Response cap of a model or server (the context budget's reserve caps it further)."""
    summary_quality: float = 1.0
    """oracle: probability that a fact survives a summary."""
    tokenizer: str | None = None
    """Tokenizer directory of a model or server (default: the model's own, else compactrl's)."""
    served_model: str | None = None
    """The ``model`` name sent to a server (default: the first that ``/v1/models`` lists)."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature: expected >= 0, got {self.temperature}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected >= 1, got {self.max_new_tokens}")
        if not 0.0 <= self.summary_quality <= 1.0:
            raise ValueError(f"summary_quality: expected a value in [0, 1], got {self.summary_quality}")
        if self.kind == "unknown":
            raise ValueError(f"policy: expected one of {', '.join(SCRIPTED)}, a model directory (with config.json) "
                             f"or an http(s):// URL, got {self.name!r}")

    @property
    def kind(self) -> str:
        """``scripted``, ``model``, ``url`` or ``unknown``."""
        if self.name in SCRIPTED:
            return "scripted"
        if self.name.startswith(("http://", "https://")):
            return "url"
        return "model" if (Path(self.name) / "config.json").is_file() else "unknown"


def make_policy(spec: PolicySpec):
    """Build the policy ``spec`` names."""
    if spec.kind == "scripted":
        return _scripted(spec)
    if spec.kind == "model":
        return _saved_model(spec)
    return _server(spec)


def _scripted(spec: PolicySpec):
    if spec.name in ("gold", "noop"):
        from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy

        return GoldPolicy() if spec.name == "gold" else NoopPolicy()
    from compactrl.policies.scripted.code import OraclePolicy, RandomPolicy

    if spec.name == "oracle":
        return OraclePolicy(summary_quality=spec.summary_quality, seed=spec.seed)
    return RandomPolicy(seed=spec.seed)


def _saved_model(spec: PolicySpec):
    """A model directory as ``compactrl serve --model`` loads it, sampling as ``spec`` says."""
    from compactrl.policies.transformers_policy import TransformersPolicy
    from compactrl.serving.cli import load_policy

    args = argparse.Namespace(model=spec.name, tiny=None, tokenizer=spec.tokenizer, dtype="float32", seed=spec.seed)
    loaded, _ = load_policy(args)
    return TransformersPolicy(loaded.model, loaded.tokenizer, temperature=spec.temperature, seed=spec.seed,
                              max_new_tokens=spec.max_new_tokens)


def _server(spec: PolicySpec):
    """An OpenAI-compatible server; its model name and context length come from ``/v1/models``."""
    import requests

    from compactrl.policies.openai_client import OpenAICompletionsPolicy

    base = spec.name.rstrip("/")
    base = base if base.endswith("/v1") else base + "/v1"
    try:
        listed = requests.get(f"{base}/models", timeout=10).json()["data"]
    except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"policy: {base}/models did not list a model ({type(exc).__name__}: {exc})") from None
    names = [m.get("id") for m in listed if isinstance(m, dict)]
    if not names:
        raise ValueError(f"policy: {base}/models lists no model")
    model = spec.served_model or names[0]
    if model not in names:
        raise ValueError(f"served_model: expected one of {names}, got {model!r}")
    window = next((m.get("max_model_len") for m in listed if m.get("id") == model), None)
    tokenizer = None
    if spec.tokenizer:
        from compactrl.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(spec.tokenizer)
    return OpenAICompletionsPolicy(base, model, tokenizer=tokenizer, temperature=spec.temperature, seed=spec.seed,
                                   max_new_tokens=spec.max_new_tokens, context_length=window)
