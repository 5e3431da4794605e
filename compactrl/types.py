"""Types shared by every layer (the bottom of the import graph).

* :class:`TokenResponse` — a model response that also carries the token ids it was sampled as and
  their log-probabilities, so the context-budget wrapper can append them verbatim (token-in/token-out).
* :class:`PolicyRequest` — what a policy sees for one environment waiting for an action.
* :class:`Trace` — one finished trace (sub-trajectory between compactions) with exact token ids.
* :class:`Policy` — the protocol every policy implements (scripted, Hugging Face, vLLM, HTTP client).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]
"""A chat message: ``{"role": "system"|"user"|"assistant"|"tool", "content": str}``."""


class TokenResponse(str):
    """A response string that also carries the sampled token ids and their log-probabilities.

    It *is* a ``str`` (any code that expects text works unchanged); the extra fields let the
    context-budget wrapper keep the exact ids the policy produced instead of re-tokenising.
    ``token_ids`` excludes the end-of-turn token unless the model sampled it, in which case
    ``finished`` is True and the id is the last element.
    """

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...] | None
    finished: bool
    routed_experts: Any
    """MoE routes of the prompt and the sampled tokens, ``[len(prompt) + len(token_ids), moe_layers, k]``
    small ints (``compactrl.policies.routing``), or None when the policy records none."""

    def __new__(
        cls,
        text: str,
        token_ids: Sequence[int],
        log_probs: Sequence[float] | None = None,
        finished: bool = True,
        routed_experts: Any = None,
    ) -> TokenResponse:
        obj = super().__new__(cls, text)
        obj.token_ids = tuple(int(t) for t in token_ids)
        obj.log_probs = None if log_probs is None else tuple(float(x) for x in log_probs)
        if obj.log_probs is not None and len(obj.log_probs) != len(obj.token_ids):
            raise ValueError(
                f"log_probs has {len(obj.log_probs)} entries but token_ids has {len(obj.token_ids)}"
            )
        obj.finished = bool(finished)
        obj.routed_experts = routed_experts
        return obj

    def __reduce__(self):  # keep the token fields through pickling (multiprocessing, checkpoints)
        return (TokenResponse, (str(self), self.token_ids, self.log_probs, self.finished, self.routed_experts))


@dataclass(frozen=True)
class PolicyRequest:
    """One environment waiting for an action.

    ``messages`` is the current trace's context (the wrapped env's observation);
    ``prompt_token_ids`` the exact ids of that context including the assistant header (None for
    an unwrapped env); ``max_new_tokens`` how many tokens the response may have;
    ``compaction_required`` whether the next action must be a summary; ``task`` the task being
    solved, for scripted policies only (learned policies must not read it).
    """

    messages: Sequence[Message]
    prompt_token_ids: Sequence[int] | None = None
    max_new_tokens: int | None = None
    compaction_required: bool = False
    task: Any = None


@runtime_checkable
class Policy(Protocol):
    """Maps a batch of requests to one response each (``str`` or :class:`TokenResponse`)."""

    def act(self, requests: Sequence[PolicyRequest]) -> list[str]: ...


@dataclass
class Trace:
    """A finished trace with exact token ids.

    All per-token lists have the same length. ``policy_mask[i]`` marks ids the policy sampled
    (including summary tokens and a sampled end-of-turn token); ``summary_mask[i]`` the subset that
    belongs to a summary; ``log_probs[i]`` is the sampling log-prob of a policy token (``nan`` where
    unknown or not a policy token); ``rewards`` maps a token position (the last token of the
    response that earned it) to the reward of that env step.
    """

    token_ids: list[int]
    policy_mask: list[bool]
    summary_mask: list[bool]
    log_probs: list[float]
    rewards: dict[int, float] = field(default_factory=dict)
    trace_index: int = 0
    episode_id: int = 0
    ends_with_summary: bool = False
    task_id: str = ""
    routed_experts: Any = field(default=None, compare=False)
    """MoE routes per token, ``[len(token_ids), moe_layers, k]`` small ints as the sampler chose them (the
    sentinel where a token has none; ``compactrl.policies.routing``), or None."""

    def __len__(self) -> int:
        return len(self.token_ids)

    def validate(self) -> None:
        n = len(self.token_ids)
        for name in ("policy_mask", "summary_mask", "log_probs"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Trace.{name} has {len(getattr(self, name))} entries, expected {n}")
        for pos in self.rewards:
            if not 0 <= pos < n or not self.policy_mask[pos]:
                raise ValueError(f"reward at position {pos} is not on a policy token")
        if self.routed_experts is not None and len(self.routed_experts) != n:
            raise ValueError(f"Trace.routed_experts has {len(self.routed_experts)} entries, expected {n}")
        for i, (p, s) in enumerate(zip(self.policy_mask, self.summary_mask)):
            if s and not p:
                raise ValueError(f"summary token at {i} is not a policy token")

__all__ = ["Message", "Policy", "PolicyRequest", "TokenResponse", "Trace"]
