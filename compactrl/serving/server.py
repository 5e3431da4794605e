"""``compactrl serve``: an OpenAI-compatible completions server for a local Hugging Face model on CPU.

It implements the subset of vLLM's OpenAI-compatible API that token-level RL clients use:

* ``GET /health`` (200 when up), ``GET /v1/models``;
* ``POST /v1/completions`` with ``prompt`` as a string, a list of token ids, or a list of either;
  ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``logprobs`` (top-k count),
  and vLLM's extras ``stop_token_ids``, ``ignore_eos``, ``skip_special_tokens``,
  ``return_token_ids`` (``choices[i].token_ids``, ``prompt_token_ids``) and
  ``return_tokens_as_token_ids`` (logprob tokens spelled ``"token_id:123"``).

Concurrent requests are batched: a single engine thread gathers requests for up to
``--batch-wait-ms`` and generates every group with equal sampling settings in one KV-cached batch.
The HTTP layer is FastAPI on uvicorn (as vLLM's own server) with a pydantic request model; errors
come back as OpenAI's ``{"error": {"message", "type", "param", "code"}}``, a body over
``--max-body-bytes`` gets a 413 and requests beyond ``--max-concurrent-requests`` a 429.
``compactrl gateway`` (:mod:`compactrl.gateway`) adds chat completions and recording on the same pieces.
Streaming, ``n > 1``, ``echo``, string ``stop`` and penalties are refused with a 400 naming the field.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import queue
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from compactrl.policies.sampling import Generated, SamplingConfig
from compactrl.policies.transformers_policy import TransformersPolicy, generate_tokens

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class ServeConfig:
    """Settings of ``compactrl serve``."""

    host: str = "127.0.0.1"
    """Address to bind (loopback by default: the server has no authentication)."""
    port: int = 8000
    """TCP port (0 picks a free one and logs it)."""
    model_name: str = "compactrl"
    """Name clients must send as ``model`` and that ``/v1/models`` lists."""
    max_batch_size: int = 32
    """Most requests generated together in one batch."""
    batch_wait_ms: float = 5.0
    """How long the engine waits for more requests before starting a batch."""
    max_logprobs: int = 20
    """Largest ``logprobs`` (top-k) a request may ask for."""
    logprobs_mode: str = "processed_logprobs"
    """"processed_logprobs": log-probs of the distribution sampled (temperature, top-k/top-p);
    "raw_logprobs": of the untouched model (vLLM's default)."""
    request_timeout_s: float = 600.0
    """A request still ungenerated after this long gets a 503."""
    max_body_bytes: int = 8 << 20
    """Largest request body accepted; a larger one gets a 413 before it is parsed."""
    max_concurrent_requests: int = 512
    """Most requests in flight at once; beyond, a 429 (a client retries, the server stays responsive)."""
    threads: int | None = None
    """Intra-op threads of the generation thread (None: torch's default). On a loaded machine one
    thread can be many times faster than a team whose members wait for each other."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.batch_wait_ms < 0:
            raise ValueError(f"batch_wait_ms must be >= 0, got {self.batch_wait_ms}")
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be >= 0, got {self.max_logprobs}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.max_body_bytes < 1 or self.max_concurrent_requests < 1:
            raise ValueError(f"max_body_bytes and max_concurrent_requests must be >= 1, got "
                             f"{self.max_body_bytes} and {self.max_concurrent_requests}")


# --------------------------------------------------------------------------------------------------
# request parsing (pure)


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
                             default_stop_ids: tuple[int, ...], config: ServeConfig) -> tuple[list[Job], dict]:
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
    options = dict(
        logprobs=logprobs is not None,
        return_token_ids=bool(body.get("return_token_ids")),
        tokens_as_ids=bool(body.get("return_tokens_as_token_ids")),
        skip_special_tokens=body.get("skip_special_tokens", True) is not False,
        extra_stop=frozenset(extra_stop),
    )
    return jobs, options


# --------------------------------------------------------------------------------------------------
# responses (pure)


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


def completion_choice(index: int, job: Job, gen: Generated, tokenizer, options: dict) -> dict:
    ids = gen.token_ids
    body = ids[:-1] if gen.finished else ids
    text = tokenizer.decode(body, skip_special_tokens=options["skip_special_tokens"])
    choice: dict[str, Any] = {
        "index": index,
        "text": text,
        "logprobs": choice_logprobs(gen, tokenizer, options["tokens_as_ids"]) if options["logprobs"] else None,
        "finish_reason": "stop" if gen.finished else "length",
        "stop_reason": ids[-1] if gen.finished and ids[-1] in options["extra_stop"] else None,
    }
    if options["return_token_ids"]:
        choice["token_ids"] = list(ids)
        choice["prompt_token_ids"] = list(job.prompt)
    return choice


def completion_response(model_name: str, jobs: list[Job], gens: list[Generated], tokenizer, options: dict) -> dict:
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


# --------------------------------------------------------------------------------------------------
# the batching engine


class CompletionEngine:
    """One thread that gathers concurrent jobs and generates each compatible group as one batch."""

    def __init__(self, policy: TransformersPolicy, *, max_batch_size: int = 32, batch_wait_ms: float = 5.0,
                 threads: int | None = None):
        self.policy = policy
        self.threads = threads
        """Intra-op threads of the engine thread (None: torch's default for a new thread). With OpenMP
        the setting is per thread, so the caller's ``torch.set_num_threads`` does not reach it."""
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self._queue: queue.Queue[Job] = queue.Queue()
        self._closed = threading.Event()
        self.batches = 0
        """Generation batches run so far (with ``jobs``, shows how well requests are batched)."""
        self.jobs = 0
        self._thread = threading.Thread(target=self._loop, name="compactrl-serve-engine", daemon=True)
        self._thread.start()

    def submit(self, jobs: list[Job]) -> list[Future]:
        if self._closed.is_set():
            raise RequestError("the server is shutting down", status=503)
        for j in jobs:
            self._queue.put(j)
        return [j.future for j in jobs]

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=30)

    def _gather(self) -> list[Job]:
        try:
            jobs = [self._queue.get(timeout=0.1)]
        except queue.Empty:
            return []
        deadline = time.monotonic() + self.batch_wait_s
        while len(jobs) < self.max_batch_size:
            try:
                jobs.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return jobs

    def _loop(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        while not self._closed.is_set():
            jobs = self._gather()
            groups: dict[tuple, list[Job]] = {}
            for j in jobs:
                groups.setdefault(j.key, []).append(j)
            for group in groups.values():
                self._run(group)

    def _run(self, group: list[Job]) -> None:
        first = group[0]
        generator = self.policy.generator
        if first.seed is not None:
            generator = torch.Generator(device=generator.device).manual_seed(first.seed)
        try:
            gens = generate_tokens(
                self.policy.model, [j.prompt for j in group], [j.max_tokens for j in group],
                sampling=first.sampling, stop_ids=first.stop_ids, pad_id=self.policy.pad_token_id,
                generator=generator, top_logprobs=first.top_logprobs, report=first.report,
            )
        except Exception as exc:  # surfaced to every waiting request as a 500
            logger.exception("generation failed")
            for j in group:
                j.future.set_exception(exc)
            return
        self.batches += 1
        self.jobs += len(group)
        for j, g in zip(group, gens):
            j.future.set_result(g)


class PolicyEngine:
    """A policy with ``generate(prompts, budgets, sampling=, stop_token_ids=, seeds=)`` that runs elsewhere
    (a :class:`~compactrl.serving.vllm.policy.VLLMPolicy`: the vLLM engine process), behind one thread.

    Jobs that arrive while a generation runs are gathered; each group with equal sampling settings
    goes to the engine as one call (vLLM schedules the group's prompts together). Log-probs are
    those of the distribution sampled (``processed_logprobs``); top log-probs are refused.
    """

    def __init__(self, policy, *, max_batch_size: int = 64, batch_wait_ms: float = 5.0,
                 owns_policy: bool = False) -> None:
        import queue
        import threading

        self.policy, self.owns_policy = policy, owns_policy
        self.tokenizer = policy.tokenizer
        self.context_length = policy.context_length
        self.stop_ids = tuple(policy.stop_token_ids)
        self.max_batch_size, self.batch_wait_s = max_batch_size, batch_wait_ms / 1000.0
        self._queue: queue.Queue[Job] = queue.Queue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="compactrl-policy-engine", daemon=True)
        self._thread.start()

    def submit(self, jobs: list[Job]) -> list[Future]:
        if self._closed.is_set():
            raise RequestError("the server is shutting down", status=503)
        if any(j.top_logprobs for j in jobs):
            raise RequestError("top log-probs are not returned by this engine", param="top_logprobs")
        if any(j.report != j.sampling for j in jobs):
            raise RequestError("this engine reports the log-probs of the distribution sampled (processed_logprobs)",
                               param="logprobs_mode")
        for j in jobs:
            self._queue.put(j)
        return [j.future for j in jobs]

    def _loop(self) -> None:
        import queue
        import time

        while not self._closed.is_set():
            try:
                jobs = [self._queue.get(timeout=0.1)]
            except queue.Empty:
                continue
            deadline = time.monotonic() + self.batch_wait_s
            while len(jobs) < self.max_batch_size:
                try:
                    jobs.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            groups: dict[tuple, list[Job]] = {}
            for j in jobs:
                groups.setdefault((j.sampling, j.stop_ids), []).append(j)
            for (sampling, stop_ids), group in groups.items():
                try:
                    gens = self.policy.generate([j.prompt for j in group], [j.max_tokens for j in group],
                                                sampling=sampling, stop_token_ids=list(stop_ids),
                                                seeds=[j.seed for j in group])
                except Exception as exc:  # noqa: BLE001 - every waiting request gets it (a 500)
                    for j in group:
                        j.future.set_exception(exc)
                    continue
                for j, g in zip(group, gens):
                    j.future.set_result(g)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=30)
        if self.owns_policy:  # e.g. the vLLM engine process that the gateway command started
            self.policy.close()



# --------------------------------------------------------------------------------------------------
# HTTP: FastAPI on uvicorn (the gateway builds on the same pieces)


class CompletionBody(BaseModel):
    """A ``/v1/completions`` body. Pydantic checks the types; :func:`parse_completion_request` the
    ranges and combinations (unknown vLLM extras pass through to it)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | list[int] | list[str | list[int]]
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    logprobs: int | None = None
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None


class Limits:
    """ASGI middleware: refuses bodies over ``max_body_bytes`` (413) and requests beyond
    ``max_concurrent`` in flight (429), before any handler runs, so overload cannot pile up work."""

    def __init__(self, app, *, max_body_bytes: int, max_concurrent: int) -> None:
        self.app, self.max_body_bytes, self.max_concurrent = app, max_body_bytes, max_concurrent
        self.active = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_body_bytes:
            await _send_json(send, 413, error_body(
                f"the request body must be at most {self.max_body_bytes} bytes, got {length.decode()!r}", 413))
            return
        if self.active >= self.max_concurrent:
            await _send_json(send, 429, error_body(
                f"too many requests in flight (limit {self.max_concurrent}); retry later", 429))
            return
        received = 0

        async def counted():  # a chunked body carries no length: count what arrives
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                raise HTTPException(413, f"the request body must be at most {self.max_body_bytes} bytes")
            return message

        self.active += 1
        try:
            await self.app(scope, counted, send)
        finally:
            self.active -= 1


async def _send_json(send, status: int, payload: dict) -> None:
    data = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """The first pydantic error as one sentence naming the field (a body that is not JSON included)."""
    err = exc.errors()[0]
    loc = [str(x) for x in err.get("loc", ()) if x != "body"]
    if err.get("type") == "json_invalid":
        return f"the body is not valid JSON: {err.get('msg')}", None
    if not loc:
        return f"the request body must be a JSON object: {err.get('msg')}", None
    field = loc[0]  # deeper parts name union members and list indices, not what the client wrote
    if err.get("type") == "missing":
        return f"'{field}' is required", field
    return f"'{field}': {err.get('msg')} (got {str(err.get('input'))[:80]!r})", field


def api_app(title: str, *, max_body_bytes: int, max_concurrent: int) -> FastAPI:
    """A FastAPI app whose every error is an OpenAI-style JSON body (``{"error": {...}}``)."""
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestError)
    async def _request_error(_req: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), exc.status, exc.param), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return JSONResponse(error_body(message, 400, param), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail), exc.status_code), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _bug(_req: Request, exc: Exception) -> JSONResponse:  # answer, never drop the connection
        logger.exception("request failed")
        return JSONResponse(error_body(f"{type(exc).__name__}: {exc}", 500), status_code=500)

    app.add_middleware(Limits, max_body_bytes=max_body_bytes, max_concurrent=max_concurrent)
    return app


async def await_all(futures: list[Future], timeout_s: float) -> list:
    """Results of engine futures, awaited without blocking the event loop; 503 on timeout."""
    try:
        return list(await asyncio.wait_for(asyncio.gather(*map(asyncio.wrap_future, futures)), timeout_s))
    except TimeoutError as exc:
        raise RequestError("generation timed out", status=503) from exc


def add_completion_routes(app: FastAPI, *, engine, tokenizer, context_length: int, stop_ids: tuple[int, ...],
                          config: ServeConfig) -> None:
    """``/health``, ``/v1/models`` and ``/v1/completions`` over an engine with ``submit(jobs) -> futures``."""

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": config.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "compactrl", "root": config.model_name, "max_model_len": context_length,
        }]}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody) -> dict:
        jobs, options = parse_completion_request(
            body.model_dump(exclude_unset=True), tokenizer=tokenizer, model_name=config.model_name,
            context_length=context_length, default_stop_ids=stop_ids, config=config,
        )
        gens = await await_all(engine.submit(jobs), config.request_timeout_s)
        return completion_response(config.model_name, jobs, gens, tokenizer, options)


class ApiServer:
    """An ASGI app served by uvicorn, bound at construction (port 0 picks a free one).

    ``serve_forever()`` blocks (in the main thread it also handles SIGINT/SIGTERM); ``start()`` runs it
    in a daemon thread and returns once it accepts connections; ``shutdown()`` stops it and waits.
    """

    def __init__(self, app, host: str, port: int, *, on_close=None) -> None:
        self.app = app
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it: without, a JSON response (headers and body written apart)
        # waits for the client's delayed ACK, ~40 ms per call on loopback
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.bind((host, port))
        self._sock.listen(2048)
        self.server_address = self._sock.getsockname()[:2]
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                                     timeout_keep_alive=60, backlog=2048))
        self._on_close = on_close
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    def serve_forever(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        finally:
            self._done.set()

    def start(self) -> ApiServer:
        self._thread = threading.Thread(target=self.serve_forever, name="compactrl-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started and not self._done.is_set() and time.monotonic() < deadline:
            time.sleep(0.005)  # uvicorn offers no started-event; poll its flag briefly
        if not self._server.started:
            raise RuntimeError(f"the server on {self.url} did not start")
        return self

    def shutdown(self) -> None:
        self._server.should_exit = True
        if self._thread is not None or self._server.started:
            self._done.wait(timeout=30)

    def server_close(self) -> None:
        self._sock.close()
        if self._on_close is not None:
            self._on_close()

    def stop(self) -> None:
        """``shutdown`` then ``server_close``."""
        self.shutdown()
        self.server_close()

    def __enter__(self) -> ApiServer:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


class CompletionServer(ApiServer):
    """``compactrl serve``: a :class:`TransformersPolicy` behind ``/v1/completions`` with batching."""

    def __init__(self, policy: TransformersPolicy, config: ServeConfig) -> None:
        self.policy, self.config = policy, config
        self.engine = CompletionEngine(policy, max_batch_size=config.max_batch_size,
                                       batch_wait_ms=config.batch_wait_ms, threads=config.threads)
        app = api_app("compactrl serve", max_body_bytes=config.max_body_bytes,
                      max_concurrent=config.max_concurrent_requests)
        add_completion_routes(app, engine=self.engine, tokenizer=policy.tokenizer,
                              context_length=policy.context_length, stop_ids=tuple(policy.stop_token_ids),
                              config=config)
        super().__init__(app, config.host, config.port, on_close=self.engine.close)


class EngineServer(ApiServer):
    """``compactrl serve --engine vllm``: ``/v1/completions`` over an engine with ``submit(jobs)`` (a
    :class:`PolicyEngine` in front of the vLLM engine process), closed with the server."""

    def __init__(self, engine: PolicyEngine, config: ServeConfig) -> None:
        self.engine, self.config = engine, config
        app = api_app("compactrl serve", max_body_bytes=config.max_body_bytes,
                      max_concurrent=config.max_concurrent_requests)
        add_completion_routes(app, engine=engine, tokenizer=engine.tokenizer, context_length=engine.context_length,
                              stop_ids=engine.stop_ids, config=config)
        super().__init__(app, config.host, config.port, on_close=engine.close)


def vllm_served(policy: TransformersPolicy, args: argparse.Namespace):
    """``--engine vllm``: ``policy``'s model served by a vLLM engine process (its weights written to a
    temporary directory), sampling like ``policy``; the caller closes it."""
    import tempfile

    from compactrl.serving.vllm.policy import VLLMPolicy

    return VLLMPolicy.from_model(
        policy.model, policy.tokenizer, tempfile.mkdtemp(prefix="compactrl-vllm-model."),
        engine=dict(dtype=args.dtype, threads=args.threads or 1), seed=args.seed,
        max_new_tokens=policy.max_new_tokens, stop_token_ids=policy.stop_token_ids)


def make_server(policy: TransformersPolicy, config: ServeConfig) -> CompletionServer:
    """A bound (not yet serving) server: ``start()`` (or ``serve_forever``), later ``stop()``."""
    return CompletionServer(policy, config)


# --------------------------------------------------------------------------------------------------
# CLI


def add_model_arguments(parser: argparse.ArgumentParser, source) -> None:
    """The model to load (``source``: a mutually exclusive group the caller may extend)."""
    source.add_argument("--model", help="local Hugging Face model directory")
    source.add_argument("--tiny", choices=("glm4_moe", "qwen3_moe", "mixtral"),
                        help="serve a freshly built tiny random MoE model of this architecture")
    parser.add_argument("--tokenizer", help="tokenizer directory (default: the model's, else the packaged one)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed and tiny-model init seed")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (generation thread too)")
    parser.add_argument("--engine", choices=("transformers", "vllm"), default="transformers",
                        help="what generates: the model in this process, or a vLLM engine process in its own "
                             "environment (bash scripts/setup.sh --vllm; docs/policies.md)")


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The :class:`ServeConfig` options."""
    parser.add_argument("--served-model-name", help="name clients send as 'model' (default: from the source)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (0 = any free port; default: 8000)")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--max-logprobs", type=int, default=20)
    parser.add_argument("--logprobs-mode", default="processed_logprobs", choices=LOGPROBS_MODES)
    parser.add_argument("--max-body-bytes", type=int, default=ServeConfig.max_body_bytes)
    parser.add_argument("--max-concurrent-requests", type=int, default=ServeConfig.max_concurrent_requests)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser, parser.add_mutually_exclusive_group(required=True))
    add_server_arguments(parser)


def serve_config(args: argparse.Namespace, default_name: str) -> ServeConfig:
    return ServeConfig(
        host=args.host, port=args.port, model_name=args.served_model_name or default_name,
        max_batch_size=args.max_batch_size, batch_wait_ms=args.batch_wait_ms,
        max_logprobs=args.max_logprobs, logprobs_mode=args.logprobs_mode,
        max_body_bytes=args.max_body_bytes, max_concurrent_requests=args.max_concurrent_requests,
        threads=args.threads,
    )


def load_policy(args: argparse.Namespace) -> tuple[TransformersPolicy, str]:
    from compactrl.tokenizer import load_tokenizer

    dtype = getattr(torch, args.dtype)
    if args.tiny:
        from compactrl.policies.tiny_moe import tiny_moe

        tok = load_tokenizer(args.tokenizer)
        model = tiny_moe(args.tiny, vocab_size=len(tok), seed=args.seed, dtype=dtype)
        return TransformersPolicy(model, tok, seed=args.seed), f"tiny-{args.tiny}"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(args.model)
    if not (path / "config.json").is_file():
        raise ValueError(f"--model must be a local Hugging Face model directory, {path} has no config.json")
    tok_dir = args.tokenizer or (str(path) if (path / "tokenizer_config.json").is_file() else None)
    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True) if tok_dir else load_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True,
                                                 experts_implementation="grouped_mm").eval()
    return TransformersPolicy(model, tok, seed=args.seed), path.name


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    policy, default_name = load_policy(args)
    if getattr(args, "engine", "transformers") == "vllm":
        engine = PolicyEngine(vllm_served(policy, args), max_batch_size=args.max_batch_size,
                              batch_wait_ms=args.batch_wait_ms, owns_policy=True)
        server: ApiServer = EngineServer(engine, serve_config(args, default_name))
    else:
        server = make_server(policy, serve_config(args, default_name))
    print(f"compactrl serve: model {server.config.model_name!r} on {server.url}/v1", flush=True)
    serve_until_signal(server)
    return 0


def serve_until_signal(server: ApiServer) -> None:
    """Serve in a background thread until SIGINT or SIGTERM, then stop gracefully (exit status 0;
    uvicorn in the main thread would re-raise the signal after its own shutdown)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    try:
        stop.wait()
    finally:
        server.stop()
