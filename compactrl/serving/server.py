"""``compactrl serve``: an OpenAI-compatible completions server for a local Hugging Face model on CPU.

It implements the subset of vLLM's OpenAI-compatible API that token-level RL clients use:
``GET /health`` (200 when up), ``GET /v1/models``, and ``POST /v1/completions`` (the formats:
:mod:`compactrl.serving.completions`).

Concurrent requests are batched: a single engine thread gathers requests for up to
``--batch-wait-ms`` and generates every group with equal sampling settings in one KV-cached batch
(:mod:`compactrl.serving.batching`). The HTTP layer is FastAPI on uvicorn (as vLLM's own server)
with a pydantic request model; errors come back as OpenAI's ``{"error": {"message", "type",
"param", "code"}}``, a body over ``--max-body-bytes`` gets a 413 and requests beyond
``--max-concurrent-requests`` a 429. ``compactrl gateway`` (:mod:`compactrl.gateway`) adds chat
completions and recording on the same pieces. The command line is :mod:`compactrl.serving.cli`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.serving.batching import CompletionEngine, JobEngine, PolicyEngine
from compactrl.serving.completions import (
    LOGPROBS_MODES,
    RequestError,
    completion_response,
    error_body,
    parse_completion_request,
)

logger = logging.getLogger(__name__)


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


def add_completion_routes(app: FastAPI, *, engine: JobEngine, tokenizer, context_length: int, stop_ids: tuple[int, ...],
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


def make_server(policy: TransformersPolicy, config: ServeConfig) -> CompletionServer:
    """A bound (not yet serving) server: ``start()`` (or ``serve_forever``), later ``stop()``."""
    return CompletionServer(policy, config)
