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
Errors come back as vLLM does: ``{"object": "error", "message", "type", "param", "code"}``.
Streaming, ``n > 1``, ``echo``, string ``stop`` and penalties are refused with a 400 naming the field.
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import signal
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import torch

from compactrl.policies.transformers_policy import (
    Generated,
    SamplingConfig,
    TransformersPolicy,
    generate_tokens,
)

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


def error_body(message: str, status: int, param: str | None = None) -> dict:
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(status, "ServerError")
    return {"object": "error", "message": message, "type": kind, "param": param, "code": status}


# --------------------------------------------------------------------------------------------------
# the batching engine


class CompletionEngine:
    """One thread that gathers concurrent jobs and generates each compatible group as one batch."""

    def __init__(self, policy: TransformersPolicy, *, max_batch_size: int = 32, batch_wait_ms: float = 5.0):
        self.policy = policy
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


# --------------------------------------------------------------------------------------------------
# HTTP


class CompletionServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, policy: TransformersPolicy, config: ServeConfig) -> None:
        super().__init__(address, _Handler)
        self.policy = policy
        self.config = config
        self.engine = CompletionEngine(policy, max_batch_size=config.max_batch_size,
                                       batch_wait_ms=config.batch_wait_ms)

    def server_close(self) -> None:
        self.engine.close()
        super().server_close()

    def complete(self, body: Any) -> dict:
        tok = self.policy.tokenizer
        jobs, options = parse_completion_request(
            body, tokenizer=tok, model_name=self.config.model_name, context_length=self.policy.context_length,
            default_stop_ids=tuple(self.policy.stop_token_ids), config=self.config,
        )
        futures = self.engine.submit(jobs)
        deadline = time.monotonic() + self.config.request_timeout_s
        try:
            gens = [f.result(timeout=max(0.0, deadline - time.monotonic())) for f in futures]
        except TimeoutError as exc:
            raise RequestError("generation timed out", status=503) from exc
        return completion_response(self.config.model_name, jobs, gens, tok, options)

    def models(self) -> dict:
        return {"object": "list", "data": [{
            "id": self.config.model_name, "object": "model", "created": int(time.time()),
            "owned_by": "compactrl", "root": self.config.model_name,
            "max_model_len": self.policy.context_length,
        }]}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive for pooled clients
    server: CompletionServer

    def log_message(self, fmt: str, *args) -> None:
        logger.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, status: int, payload: dict | None) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(200, None)
        elif path == "/v1/models":
            self._send(200, self.server.models())
        else:
            self._send(404, error_body(f"no route {path}", 404))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path != "/v1/completions":
            self._send(404, error_body(f"no route {path} (only /v1/completions is served)", 404))
            return
        try:
            body = json.loads(raw or b"null")
            self._send(200, self.server.complete(body))
        except json.JSONDecodeError as exc:
            self._send(400, error_body(f"the body is not valid JSON: {exc}", 400))
        except RequestError as exc:
            self._send(exc.status, error_body(str(exc), exc.status, exc.param))
        except Exception as exc:  # a server bug must still answer, not drop the connection
            logger.exception("request failed")
            self._send(500, error_body(f"{type(exc).__name__}: {exc}", 500))


def make_server(policy: TransformersPolicy, config: ServeConfig) -> CompletionServer:
    """A bound (not yet serving) server; call ``serve_forever`` and later ``shutdown``/``server_close``."""
    return CompletionServer((config.host, config.port), policy, config)


# --------------------------------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="local Hugging Face model directory")
    src.add_argument("--tiny", choices=("glm4_moe", "qwen3_moe", "mixtral"),
                     help="serve a freshly built tiny random MoE model of this architecture")
    parser.add_argument("--tokenizer", help="tokenizer directory (default: the model's, else the packaged one)")
    parser.add_argument("--served-model-name", help="name clients send as 'model' (default: from the source)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (0 = any free port; default: 8000)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed and tiny-model init seed")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-wait-ms", type=float, default=5.0)
    parser.add_argument("--max-logprobs", type=int, default=20)
    parser.add_argument("--logprobs-mode", default="processed_logprobs", choices=LOGPROBS_MODES)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")


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
    config = ServeConfig(
        host=args.host, port=args.port, model_name=args.served_model_name or default_name,
        max_batch_size=args.max_batch_size, batch_wait_ms=args.batch_wait_ms,
        max_logprobs=args.max_logprobs, logprobs_mode=args.logprobs_mode,
    )
    server = make_server(policy, config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, name="compactrl-serve-http", daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    print(f"compactrl serve: model {config.model_name!r} on http://{host}:{port}/v1", flush=True)
    stop.wait()
    server.shutdown()
    server.server_close()
    return 0
