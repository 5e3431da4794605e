"""The ``/v1/completions`` formats of vLLM's OpenAI-compatible API, as ``compactrl serve`` speaks them
(pure functions: no HTTP, no model).

A request body becomes one :class:`Job` per prompt (:func:`parse_completion_request`): ``prompt`` as a
string, a list of token ids, or a list of either; ``max_tokens``, ``temperature``, ``top_p``,
``top_k``, ``seed``, ``logprobs`` (top-k count), and vLLM's extras ``stop_token_ids``, ``ignore_eos``,
``skip_special_tokens``, ``return_token_ids`` (``choices[i].token_ids``, ``prompt_token_ids``) and
``return_tokens_as_token_ids`` (logprob tokens spelled ``"token_id:123"``). Streaming, ``n > 1``,
``echo``, string ``stop`` and penalties are refused with a :class:`RequestError` naming the field.
An engine answers each job with a :class:`~compactrl.policies.sampling.Generated`, and
:func:`completion_response` builds the response body from the jobs and their continuations; errors
are OpenAI's ``{"error": {"message", "type", "param", "code"}}`` (:func:`error_body`).
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compactrl.policies.sampling import Generated, SamplingConfig

if TYPE_CHECKING:
    from compactrl.serving.server import ServeConfig

LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
MIN_LOGPROB = -9999.0  # vLLM clamps -inf to this in JSON
UNSUPPORTED = {  # field -> value that is accepted (anything else is a 400)
    "stream": False, "echo": False, "n": 1, "best_of": 1, "suffix": None, "logit_bias": None,
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_tokens": 0, "use_beam_search": False,
}


class RequestError(Exception):
    """A request the server refuses: becomes an HTTP error with a JSON body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


# --------------------------------------------------------------------------------------------------
# requests


@dataclass
class Job:
    """One prompt of a completion request, waiting for the engine."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingConfig
    report: SamplingConfig
    stop_ids: tuple[int, ...]
    top_logprobs: int
    seed: int | None
    future: Future = field(default_factory=Future)

    @property
    def key(self) -> tuple:
        """Jobs with equal keys can share a batch."""
        return (self.sampling, self.report, self.stop_ids, self.top_logprobs, self.seed)


@dataclass(frozen=True)
class ResponseOptions:
    """How a request asks its response to be written (the same for every choice)."""

    logprobs: bool
    """``choices[i].logprobs`` is filled (the request set ``logprobs``)."""
    return_token_ids: bool
    """``choices[i].token_ids`` and ``prompt_token_ids`` are added (vLLM's ``return_token_ids``)."""
    tokens_as_ids: bool
    """Log-prob tokens are spelled ``"token_id:123"`` (vLLM's ``return_tokens_as_token_ids``)."""
    skip_special_tokens: bool
    """The text leaves special tokens out (vLLM's ``skip_special_tokens``, on by default)."""
    extra_stop: frozenset[int]
    """The request's own ``stop_token_ids``: a choice that ends on one names it as ``stop_reason``."""


def _number(body: dict, name: str, default, kind=float, lo=None, hi=None):
    value = body.get(name, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not float(value).is_integer()):
        raise RequestError(f"'{name}' must be {'an integer' if kind is int else 'a number'}, got {value!r}",
                           param=name)
    value = kind(value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise RequestError(f"'{name}' must be in [{lo}, {hi}], got {value}", param=name)
    return value


def parse_prompts(prompt: Any, tokenizer) -> list[list[int]]:
    """``prompt`` as vLLM accepts it: str, list[int], list[str] or list[list[int]]."""
    def one(p) -> list[int]:
        if isinstance(p, str):
            return list(tokenizer(p, add_special_tokens=True)["input_ids"])
        if isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            return list(p)
        raise RequestError("'prompt' must be a string, a list of token ids, or a list of either", param="prompt")

    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        prompts = [one(p) for p in prompt]
    else:
        prompts = [one(prompt)]
    for p in prompts:
        if not p:
            raise RequestError("'prompt' must not be empty", param="prompt")
    return prompts


def parse_completion_request(body: Any, *, tokenizer, model_name: str, context_length: int,
                             default_stop_ids: tuple[int, ...], config: ServeConfig,
                             ) -> tuple[list[Job], ResponseOptions]:
    """Validate a ``/v1/completions`` body; returns one job per prompt and the response options."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    if body.get("model", model_name) != model_name:
        raise RequestError(f"The model `{body.get('model')}` does not exist.", status=404, param="model")
    for name, accepted in UNSUPPORTED.items():
        if name in body and body[name] is not None and body[name] != accepted:
            raise RequestError(f"'{name}'={body[name]!r} is not supported by this server", param=name)
    if body.get("stop"):
        raise RequestError("string 'stop' sequences are not supported; use 'stop_token_ids'", param="stop")
    if "prompt" not in body:
        raise RequestError("'prompt' is required", param="prompt")
    prompts = parse_prompts(body["prompt"], tokenizer)
    vocab = len(tokenizer)
    for p in prompts:
        if min(p) < 0 or max(p) >= vocab:
            raise RequestError(f"prompt token ids must be in [0, {vocab}), got {min(p)}..{max(p)}", param="prompt")
    temperature = _number(body, "temperature", 1.0, lo=0.0, hi=100.0)
    top_p = _number(body, "top_p", 1.0, lo=1e-9, hi=1.0)
    top_k = _number(body, "top_k", 0, kind=int, lo=-1)
    logprobs = body.get("logprobs")
    top_logprobs = 0 if logprobs is None else _number(body, "logprobs", 0, kind=int, lo=0, hi=config.max_logprobs)
    seed = None if body.get("seed") is None else _number(body, "seed", 0, kind=int)
    extra_stop = body.get("stop_token_ids") or []
    if not isinstance(extra_stop, list) or not all(isinstance(t, int) for t in extra_stop):
        raise RequestError("'stop_token_ids' must be a list of token ids", param="stop_token_ids")
    stop = set(extra_stop) | (set() if body.get("ignore_eos") else set(default_stop_ids))
    sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=max(top_k, 0))
    report = sampling if config.logprobs_mode == "processed_logprobs" else SamplingConfig()
    jobs = []
    for p in prompts:
        room = context_length - len(p)
        max_tokens = body.get("max_tokens")
        max_tokens = room if max_tokens is None else _number(body, "max_tokens", 16, kind=int, lo=1)
        if max_tokens > room:
            raise RequestError(
                f"This model's maximum context length is {context_length} tokens. However, you requested "
                f"{len(p) + max_tokens} tokens ({len(p)} in the prompt, {max_tokens} for the completion).",
                param="max_tokens",
            )
        jobs.append(Job(p, max_tokens, sampling, report, tuple(sorted(stop)), top_logprobs, seed))
    options = ResponseOptions(
        logprobs=logprobs is not None,
        return_token_ids=bool(body.get("return_token_ids")),
        tokens_as_ids=bool(body.get("return_tokens_as_token_ids")),
        skip_special_tokens=body.get("skip_special_tokens", True) is not False,
        extra_stop=frozenset(extra_stop),
    )
    return jobs, options


# --------------------------------------------------------------------------------------------------
# responses


def _token_str(tokenizer, tid: int, as_ids: bool) -> str:
    return f"token_id:{tid}" if as_ids else tokenizer.decode([tid], skip_special_tokens=False)


def choice_logprobs(gen: Generated, tokenizer, tokens_as_ids: bool) -> dict:
    """vLLM's ``CompletionLogProbs`` for one choice."""
    tokens = [_token_str(tokenizer, t, tokens_as_ids) for t in gen.token_ids]
    offsets, pos = [], 0
    for t in gen.token_ids:
        offsets.append(pos)
        pos += len(tokenizer.decode([t], skip_special_tokens=False))
    top = []
    for i, lp in enumerate(gen.log_probs):
        entry = {tokens[i]: max(lp, MIN_LOGPROB)}  # vLLM lists the sampled token first
        for tid, tlp in (gen.top_logprobs[i] if gen.top_logprobs else []):
            entry.setdefault(_token_str(tokenizer, tid, tokens_as_ids), max(tlp, MIN_LOGPROB))
        top.append(entry)
    return {"text_offset": offsets, "token_logprobs": list(gen.log_probs), "tokens": tokens, "top_logprobs": top}


def completion_choice(index: int, job: Job, gen: Generated, tokenizer, options: ResponseOptions) -> dict:
    ids = gen.token_ids
    body = ids[:-1] if gen.finished else ids
    text = tokenizer.decode(body, skip_special_tokens=options.skip_special_tokens)
    choice: dict[str, Any] = {
        "index": index,
        "text": text,
        "logprobs": choice_logprobs(gen, tokenizer, options.tokens_as_ids) if options.logprobs else None,
        "finish_reason": "stop" if gen.finished else "length",
        "stop_reason": ids[-1] if gen.finished and ids[-1] in options.extra_stop else None,
    }
    if options.return_token_ids:
        choice["token_ids"] = list(ids)
        choice["prompt_token_ids"] = list(job.prompt)
    return choice


def completion_response(model_name: str, jobs: list[Job], gens: list[Generated], tokenizer,
                        options: ResponseOptions) -> dict:
    prompt_tokens = sum(len(j.prompt) for j in jobs)
    completion_tokens = sum(len(g.token_ids) for g in gens)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [completion_choice(i, j, g, tokenizer, options) for i, (j, g) in enumerate(zip(jobs, gens))],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 409: "ConflictError", 413: "RequestTooLargeError",
               429: "RateLimitError", 503: "ServiceUnavailableError"}


def error_body(message: str, status: int, param: str | None = None) -> dict:
    """OpenAI's (and current vLLM's) error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "ServerError"), "param": param,
                      "code": status}}
