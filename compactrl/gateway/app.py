"""``compactrl gateway``: an OpenAI-compatible, recording server for black-box agents.

Routes (each also under ``/s/<session>/...``, which names the session the call belongs to; the
header ``X-Session-Id`` does the same, and calls naming neither are recorded under ``default``):

* ``POST /v1/chat/completions``: messages, tools and tool calls (:mod:`compactrl.gateway.chat`),
  ``n``, ``temperature``/``top_p``/``top_k``, ``stop``, ``max_tokens``, ``logprobs``/``top_logprobs``,
  ``seed``, ``stream`` (server-sent events, ``stream_options.include_usage``), and vLLM's
  ``return_token_ids`` (``choices[i].token_ids`` and ``prompt_token_ids``);
* ``POST /v1/completions`` (as ``compactrl serve``), ``GET /v1/models``, ``GET /health``;
* ``POST /v1/sessions/<session>/reward`` with ``{"reward": float, "info": {...}}`` ends a session;
  ``GET /v1/sessions`` lists the finished ones.

``X-Agent-Id`` names the conversation a call belongs to (by default: a hash of its first two turns,
so a sub-agent with its own system prompt or task is another conversation), ``X-Parent-Agent-Id``
the agent that spawned it. It runs in front of a :class:`TransformersPolicy` in this process or of
an upstream ``/v1/completions`` engine by URL (:mod:`compactrl.gateway.engines`), on the same
FastAPI/uvicorn pieces as ``compactrl serve``: loopback by default, body-size and in-flight limits,
every malformed body a 4xx with a message.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

from fastapi import Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from compactrl.gateway.chat import (
    ChatRequest,
    SampledTurns,
    assistant_key,
    content_text,
    cut_at_stop,
    parse_tool_calls,
    prompt_ids,
)
from compactrl.gateway.constrain import ToolCallGrammar, ToolChoice, parse_tool_choice
from compactrl.gateway.engines import Engine, LocalEngine, UpstreamEngine
from compactrl.gateway.recording import CallRecord, Recorder, SampledChoice, check_session
from compactrl.policies.routing import encode_routes
from compactrl.policies.sampling import Generated, SamplingConfig
from compactrl.serving.completions import (
    MIN_LOGPROB,
    Job,
    RequestError,
    completion_response,
    parse_completion_request,
)
from compactrl.serving.server import ApiServer, CompletionBody, ServeConfig, api_app, await_all
from compactrl.wrappers.chat_format import chat_format

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewayConfig:
    """Settings of ``compactrl gateway`` (the server settings it shares with ``serve`` in ``serve``)."""

    serve: ServeConfig = field(default_factory=ServeConfig)
    """Address, model name, batching, log-prob mode, limits."""
    record_dir: str | None = None
    """Where session files go (default: a new temporary directory)."""
    default_max_tokens: int = 512
    """Response length when a request names none (capped by the room left in the context)."""
    max_n: int = 16
    """Largest ``n`` (choices per request)."""
    max_buffered: int = 64
    """Records a session keeps in memory before they are appended to its file."""
    max_open_sessions: int = 4096
    """Sessions whose sampled turns (for exact re-rendering) and buffers are kept; the least recent go."""
    policy_version: int = 0
    """Version recorded with every call at start; :attr:`Gateway.policy_version` may move it on."""
    tool_choice_tries: int = 4
    """Samples per choice, at most, when an engine that cannot mask logits (upstream, vLLM) answers a
    ``tool_choice`` of "required" or a named function: the first that is such a call is kept."""

    def __post_init__(self) -> None:
        for name in ("default_max_tokens", "max_n", "max_buffered", "max_open_sessions", "tool_choice_tries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class RewardBody(BaseModel):
    reward: float
    info: dict = Field(default_factory=dict)


def _agent_of(request: ChatRequest, header: str | None) -> str:
    if header:
        return header
    root = [(m.role, content_text(m.content)) for m in request.messages[:2]]
    return "root-" + hashlib.sha1(json.dumps(root).encode()).hexdigest()[:16]


class Gateway(ApiServer):
    """The gateway as an in-process object: ``with Gateway(engine, config) as gw: gw.url ...``."""

    def __init__(self, engine: Engine, config: GatewayConfig | None = None) -> None:
        self.engine, self.config = engine, config or GatewayConfig()
        self.fmt = chat_format(engine.tokenizer)
        self.policy_version = self.config.policy_version
        record_dir = self.config.record_dir or tempfile.mkdtemp(prefix="compactrl-gateway-")
        self.recorder = Recorder(record_dir, max_buffered=self.config.max_buffered,
                                 max_open_sessions=self.config.max_open_sessions)
        self._turns: OrderedDict[str, SampledTurns] = OrderedDict()
        self._turns_lock = threading.Lock()
        s = self.config.serve
        app = api_app("compactrl gateway", max_body_bytes=s.max_body_bytes, max_concurrent=s.max_concurrent_requests)
        self._routes(app)
        super().__init__(app, s.host, s.port, on_close=self._close)

    def _close(self) -> None:
        self.recorder.flush()
        self.engine.close()

    # -- sessions ------------------------------------------------------------------------------

    def _session(self, path_session: str | None, request: Request) -> str:
        name = path_session or request.headers.get("x-session-id") or "default"
        try:
            return check_session(name)
        except ValueError as exc:
            raise RequestError(str(exc), param="session") from exc

    def sampled_turns(self, session: str) -> SampledTurns:
        with self._turns_lock:
            turns = self._turns.get(session)
            if turns is None:
                turns = self._turns[session] = SampledTurns()
                while len(self._turns) > self.config.max_open_sessions:
                    self._turns.popitem(last=False)
            self._turns.move_to_end(session)
            return turns

    def finish_session(self, session: str, reward: float, info: dict | None = None) -> Path:
        """End a session with its outcome (what ``POST /v1/sessions/<session>/reward`` does)."""
        path = self.recorder.finish(check_session(session), reward, info)
        with self._turns_lock:
            self._turns.pop(session, None)
        return path

    # -- routes --------------------------------------------------------------------------------

    def _routes(self, app) -> None:
        s = self.config.serve

        async def health() -> Response:
            return Response(status_code=200)

        async def models() -> dict:
            return {"object": "list", "data": [{
                "id": s.model_name, "object": "model", "created": int(time.time()), "owned_by": "compactrl",
                "root": s.model_name, "max_model_len": self.engine.context_length}]}

        async def chat(body: ChatRequest, request: Request, session: str | None = None):
            return await self.chat(body, request, session)

        async def completions(body: CompletionBody, request: Request, session: str | None = None) -> dict:
            return await self.completions(body, request, session)

        async def reward(session: str, body: RewardBody) -> dict:
            try:
                path = self.finish_session(session, body.reward, body.info)
            except ValueError as exc:
                raise RequestError(str(exc), param="session") from exc
            return {"session": session, "path": str(path)}

        async def sessions() -> dict:
            return {"finished": [p.name.removesuffix(".jsonl") for p in self.recorder.finished_sessions()]}

        app.get("/health")(health)
        app.post("/v1/sessions/{session}/reward")(reward)
        app.get("/v1/sessions")(sessions)
        for prefix in ("", "/s/{session}"):
            app.get(prefix + "/v1/models")(models)
            app.post(prefix + "/v1/chat/completions")(chat)
            app.post(prefix + "/v1/completions")(completions)

    def _check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.serve.model_name:
            raise RequestError(f"The model `{name}` does not exist.", status=404, param="model")

    async def completions(self, body: CompletionBody, request: Request, path_session: str | None) -> dict:
        t0 = time.time()
        session = self._session(path_session, request)
        e = self.engine
        jobs, options = parse_completion_request(
            body.model_dump(exclude_unset=True), tokenizer=e.tokenizer, model_name=self.config.serve.model_name,
            context_length=e.context_length, default_stop_ids=e.stop_ids, config=self.config.serve)
        gens = await self._generate(jobs, session, request.headers.get("x-agent-id") or "completions",
                                    request, t0, "completions")
        return completion_response(self.config.serve.model_name, jobs, gens, e.tokenizer, options)

    async def _generate(self, jobs: list[Job], session: str, agent: str, request: Request, t0: float,
                        route: str, choice: ToolChoice | None = None) -> list[Generated]:
        try:
            index = self.recorder.next_index(session)
        except ValueError as exc:  # a finished session takes no more calls
            raise RequestError(str(exc), status=409, param="session") from exc
        version = self.policy_version
        t1 = time.time()
        gens = await self._sample(jobs, choice)
        t2 = time.time()
        prompts: OrderedDict[tuple[int, ...], list[Generated]] = OrderedDict()
        for j, g in zip(jobs, gens):
            prompts.setdefault(tuple(j.prompt), []).append(g)
        for k, (prompt, out) in enumerate(prompts.items()):  # one record per distinct prompt
            self.recorder.record(CallRecord(
                session=session, index=index if k == 0 else self.recorder.next_index(session), agent=agent,
                parent_agent=request.headers.get("x-parent-agent-id"), prompt_ids=list(prompt),
                choices=[SampledChoice(list(g.token_ids), list(g.log_probs), g.finished, encode_routes(g.routed_experts))
                         for g in out],
                policy_version=version, model=self.config.serve.model_name, route=route, t_received=t0,
                queue_s=t1 - t0, generate_s=t2 - t1,
                sampling={"temperature": jobs[0].sampling.temperature, "top_p": jobs[0].sampling.top_p,
                          "top_k": jobs[0].sampling.top_k,
                          **({"tool_choice": choice.label, "constrained": self._how(choice)} if choice else {})},
            ))
        return gens

    def _how(self, choice: ToolChoice) -> str:
        """How a ``tool_choice`` is enforced by this engine: "masked" logits or "rejection" sampling."""
        return "masked" if hasattr(self.engine, "submit_constrained") else "rejection"

    async def _sample(self, jobs: list[Job], choice: ToolChoice | None) -> list[Generated]:
        timeout = self.config.serve.request_timeout_s
        if choice is None:
            return await await_all(self.engine.submit(jobs), timeout)
        if self._how(choice) == "masked":
            return await await_all(self.engine.submit_constrained(jobs, choice), timeout)
        # rejection: sample again (up to tool_choice_tries) each choice that is not a whole call
        grammar = ToolCallGrammar(choice)
        gens: list[Generated] = await await_all(self.engine.submit(jobs), timeout)
        for attempt in range(1, self.config.tool_choice_tries):
            todo = [i for i, g in enumerate(gens) if not self._is_call(grammar, g)]
            if not todo:
                break
            retry = [replace(jobs[i], future=Future(), seed=None if jobs[i].seed is None else jobs[i].seed + attempt)
                     for i in todo]
            for i, g in zip(todo, await await_all(self.engine.submit(retry), timeout)):
                gens[i] = g
        else:
            if any(not self._is_call(grammar, g) for g in gens):
                logger.warning("tool_choice %s: no call in %d samples; answering the last", choice.label,
                               self.config.tool_choice_tries)
        return gens

    def _is_call(self, grammar: ToolCallGrammar, gen: Generated) -> bool:
        if not gen.finished:
            return False
        state = grammar.feed(grammar.start, self.fmt.decode(gen.token_ids[:-1]))
        return state is not None and grammar.accepting(state)

    async def chat(self, req: ChatRequest, request: Request, path_session: str | None):
        t0 = time.time()
        self._check_model(req.model)
        session = self._session(path_session, request)
        choice = parse_tool_choice(req.tool_choice, req.tools)
        jobs = self._chat_jobs(req, session)
        gens = await self._generate(jobs, session, _agent_of(req, request.headers.get("x-agent-id")),
                                    request, t0, "chat", choice)
        choices = [self._chat_choice(i, g, req, session) for i, g in enumerate(gens)]
        usage = {"prompt_tokens": len(jobs[0].prompt), "completion_tokens": sum(len(c["token_ids"]) for c in choices)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        response = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(t0),
                    "model": self.config.serve.model_name, "choices": choices, "usage": usage}
        if req.return_token_ids:
            response["prompt_token_ids"] = list(jobs[0].prompt)
        else:
            for c in choices:
                del c["token_ids"]
        if req.stream:
            return StreamingResponse(_sse(response, req), media_type="text/event-stream")
        return response

    def _chat_jobs(self, req: ChatRequest, session: str) -> list[Job]:
        s, e = self.config.serve, self.engine
        if req.n > self.config.max_n:
            raise RequestError(f"'n' must be at most {self.config.max_n}, got {req.n}", param="n")
        top = req.top_logprobs or 0
        if top and not req.logprobs:
            raise RequestError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        if top > s.max_logprobs:
            raise RequestError(f"'top_logprobs' must be at most {s.max_logprobs}, got {top}", param="top_logprobs")
        if req.tool_choice == "none":
            req = req.model_copy(update={"tools": None})
        prompt = prompt_ids(self.fmt, req, self.sampled_turns(session))
        room = e.context_length - len(prompt)
        asked = req.max_completion_tokens or req.max_tokens
        if room < 1 or (asked is not None and asked > room):
            raise RequestError(
                f"This model's maximum context length is {e.context_length} tokens. However, you requested "
                f"{len(prompt) + (asked or 1)} tokens ({len(prompt)} in the messages, {asked or 1} for the "
                "completion).", param="messages")
        sampling = SamplingConfig(temperature=1.0 if req.temperature is None else req.temperature,
                                  top_p=1.0 if req.top_p is None else req.top_p, top_k=max(req.top_k or 0, 0))
        report = sampling if s.logprobs_mode == "processed_logprobs" else SamplingConfig()
        stop = tuple(sorted(set(e.stop_ids) | set(req.stop_token_ids or ())))
        max_tokens = asked or min(self.config.default_max_tokens, room)
        return [Job(prompt, max_tokens, sampling, report, stop, top, req.seed) for _ in range(req.n)]

    def _chat_choice(self, index: int, gen: Generated, req: ChatRequest, session: str) -> dict:
        stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        ids, text, hit = cut_at_stop(self.fmt, list(gen.token_ids), stops)
        finished = gen.finished and not hit
        if not hit:
            text = self.fmt.decode(ids[:-1] if finished else ids)
        content, calls = parse_tool_calls(text) if req.tools and req.tool_choice != "none" else (text, [])
        self.sampled_turns(session).put(
            assistant_key(content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls]),
            ids, finished)
        message: dict = {"role": "assistant", "content": content if content or not calls else None}
        if calls:
            message["tool_calls"] = calls
        reason = "tool_calls" if calls else "stop" if finished or hit else "length"
        choice = {"index": index, "message": message, "finish_reason": reason, "logprobs": None,
                  "token_ids": ids}
        if req.logprobs:
            choice["logprobs"] = {"content": self._logprob_entries(gen, len(ids))}
        return choice

    def _logprob_entries(self, gen: Generated, n: int) -> list[dict]:
        out = []
        for i in range(n):
            tok = self.fmt.decode([gen.token_ids[i]])
            top = [{"token": (t := self.fmt.decode([tid])), "logprob": max(lp, MIN_LOGPROB),
                    "bytes": list(t.encode())} for tid, lp in (gen.top_logprobs[i] if gen.top_logprobs else [])]
            out.append({"token": tok, "logprob": max(gen.log_probs[i], MIN_LOGPROB), "bytes": list(tok.encode()),
                        "top_logprobs": top})
        return out


def _sse(response: dict, req: ChatRequest) -> Iterator[str]:
    """A finished chat response as OpenAI's ``chat.completion.chunk`` events."""
    base = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
            "model": response["model"]}

    def event(choices: list, **extra) -> str:
        return "data: " + json.dumps({**base, "choices": choices, **extra}) + "\n\n"

    for c in response["choices"]:
        i, msg, lps = c["index"], c["message"], (c["logprobs"] or {}).get("content")
        yield event([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        if msg.get("tool_calls"):
            if msg["content"]:
                yield event([{"index": i, "delta": {"content": msg["content"]}, "finish_reason": None,
                              "logprobs": {"content": lps} if lps else None}])
            calls = [{"index": k, **tc} for k, tc in enumerate(msg["tool_calls"])]
            yield event([{"index": i, "delta": {"tool_calls": calls}, "finish_reason": None}])
        else:
            for piece, lp in _pieces(msg["content"] or "", lps):
                yield event([{"index": i, "delta": {"content": piece}, "finish_reason": None,
                              "logprobs": {"content": lp} if lp else None}])
        yield event([{"index": i, "delta": {}, "finish_reason": c["finish_reason"]}])
    if req.stream_options is not None and req.stream_options.include_usage:
        yield event([], usage=response["usage"])
    yield "data: [DONE]\n\n"


def _pieces(text: str, lps: list | None) -> Iterator[tuple[str, list | None]]:
    """Content in token-sized pieces, each with its log-prob entry (one piece when there are none)."""
    if not lps:
        yield text, None
        return
    pos = 0
    for k, entry in enumerate(lps):
        piece = text[pos: pos + len(entry["token"])] if k < len(lps) - 1 else text[pos:]
        pos += len(piece)
        yield piece, [entry]


# --------------------------------------------------------------------------------------------------
# CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from compactrl.serving.cli import add_model_arguments, add_server_arguments

    source = parser.add_mutually_exclusive_group(required=True)
    add_model_arguments(parser, source)
    source.add_argument("--upstream", help="URL of an OpenAI-compatible /v1/completions engine to front")
    parser.add_argument("--upstream-model", help="model name the upstream engine serves (with --upstream; default: "
                                                 "the one its /v1/models lists)")
    parser.add_argument("--context-length", type=int, default=8192, help="the upstream model's context (tokens)")
    add_server_arguments(parser)
    parser.add_argument("--record-dir", required=True, help="directory for the session files")
    parser.add_argument("--default-max-tokens", type=int, default=GatewayConfig.default_max_tokens)
    parser.add_argument("--max-n", type=int, default=GatewayConfig.max_n)


def upstream_model(url: str, tokenizer) -> str:
    """The model an upstream engine serves when ``--upstream-model`` is not given: the one name its
    ``/v1/models`` lists (printed); none or several is a ``ValueError`` naming them."""
    from compactrl.policies.openai_client import OpenAICompletionsPolicy, PolicyServerError

    probe = OpenAICompletionsPolicy(url, "", tokenizer=tokenizer, max_concurrency=1, retries=0, timeout=30.0)
    try:
        names = probe.models()
    except PolicyServerError as exc:
        raise ValueError(f"--upstream-model: not given, and {url} did not list its models ({exc})") from None
    finally:
        probe.close()
    if len(names) != 1:
        raise ValueError(f"--upstream-model: expected one of the models {url} serves, {names}; give it")
    print(f"compactrl gateway: --upstream-model {names[0]} (the one model {url} lists)", flush=True)  # noqa: T201
    return names[0]


def build_engine(args: argparse.Namespace) -> tuple[Engine, str]:
    if args.upstream:
        from compactrl.tokenizer import load_tokenizer

        tok = load_tokenizer(args.tokenizer)
        model = args.upstream_model or upstream_model(args.upstream, tok)
        return UpstreamEngine(args.upstream, model, tok, context_length=args.context_length), model
    from compactrl.serving.cli import load_policy

    policy, name = load_policy(args)
    if getattr(args, "engine", "transformers") == "vllm":
        from compactrl.serving.batching import PolicyEngine
        from compactrl.serving.cli import vllm_served

        return PolicyEngine(vllm_served(policy, args), max_batch_size=args.max_batch_size,
                            batch_wait_ms=args.batch_wait_ms, owns_policy=True), name
    return LocalEngine(policy, max_batch_size=args.max_batch_size, batch_wait_ms=args.batch_wait_ms,
                       threads=args.threads), name


def run(args: argparse.Namespace) -> int:
    import torch

    from compactrl.serving.cli import serve_config, serve_until_signal

    if args.threads:
        torch.set_num_threads(args.threads)
    engine, name = build_engine(args)
    config = GatewayConfig(serve=serve_config(args, name), record_dir=args.record_dir,
                           default_max_tokens=args.default_max_tokens, max_n=args.max_n)
    gateway = Gateway(engine, config)
    print(f"compactrl gateway: model {config.serve.model_name!r} on {gateway.url}/v1, "
          f"sessions in {gateway.recorder.directory}", flush=True)
    serve_until_signal(gateway)
    return 0
