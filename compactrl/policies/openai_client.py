"""A policy that talks to an OpenAI-compatible ``/v1/completions`` server with token ids.

Works against vLLM's server and ``compactrl serve``: the prompt goes out as a list of token ids
(the exact context the wrapper keeps), and the response comes back as token ids with log-probs,
through vLLM's request extras ``return_token_ids`` (``choices[i].token_ids``) and
``return_tokens_as_token_ids`` (logprob tokens spelled ``"token_id:123"``; used when the server does
not return ``token_ids``). Which log-probs come back is the server's choice: vLLM reports the raw
model's by default (``--logprobs-mode raw_logprobs``); start it with
``--logprobs-mode processed_logprobs`` to get those of the distribution actually sampled, the rule of
every other compactrl policy (``compactrl serve`` defaults to it).

Requests for many environments run concurrently on a thread pool. Connection failures and timeouts
are retried with exponential backoff, then raise :class:`ServerUnavailableError`; an HTTP error
raises :class:`ServerResponseError` carrying the server's message. Nothing waits forever: every
request has a connect and a read timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests

from compactrl.policies.sampling import (
    Generated,
    SamplingConfig,
    budgets,
    default_stop_ids,
    prompt_ids_for,
    to_token_response,
)
from compactrl.types import PolicyRequest, TokenResponse

logger = logging.getLogger(__name__)


class PolicyServerError(RuntimeError):
    """The completions server could not produce a response."""


class ServerUnavailableError(PolicyServerError):
    """The server could not be reached (refused, reset, timed out) after every retry."""


class ServerResponseError(PolicyServerError):
    """The server answered with an error status or a body this client cannot read."""

    def __init__(self, message: str, status: int | None = None, body: str | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, body


RETRY_STATUSES = frozenset({429, 502, 503, 504})


def completion_payload(
    model: str, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingConfig,
    stop_token_ids: Sequence[int], *, seed: int | None = None, extra: dict | None = None,
) -> dict[str, Any]:
    """The JSON body of one ``/v1/completions`` request (pure)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": [int(t) for t in prompt_ids],
        "max_tokens": int(max_tokens),
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "logprobs": 0,
        "stop_token_ids": list(stop_token_ids),
        "skip_special_tokens": False,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    if sampling.top_k > 0:
        body["top_k"] = sampling.top_k
    if seed is not None:
        body["seed"] = int(seed)
    body.update(extra or {})
    return body


def _ids_from_logprob_tokens(tokens: Sequence[str]) -> list[int]:
    ids = []
    for tok in tokens:
        if not (isinstance(tok, str) and tok.startswith("token_id:")):
            raise ServerResponseError(
                f"logprob token {tok!r} is not of the form 'token_id:N': the server ignored "
                "return_tokens_as_token_ids and returned no token_ids"
            )
        ids.append(int(tok.split(":", 1)[1]))
    return ids


def parse_choice(choice: dict, stop_ids: Sequence[int]) -> Generated:
    """One ``choices[i]`` of a completions response -> :class:`Generated` (pure)."""
    lp = choice.get("logprobs")
    if not lp or lp.get("token_logprobs") is None:
        raise ServerResponseError("the response has no logprobs: the server must honour 'logprobs': 0")
    logprobs = [float("nan") if x is None else float(x) for x in lp["token_logprobs"]]
    ids = choice.get("token_ids")
    ids = [int(t) for t in ids] if ids is not None else _ids_from_logprob_tokens(lp.get("tokens") or [])
    if len(ids) != len(logprobs):
        raise ServerResponseError(f"{len(ids)} token ids but {len(logprobs)} log-probs in a choice")
    finished = bool(ids) and ids[-1] in set(stop_ids)
    return Generated(ids, logprobs, finished)


class OpenAICompletionsPolicy:
    """A compactrl policy served over HTTP by an OpenAI-compatible completions endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        tokenizer=None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int = 512,
        context_length: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        max_concurrency: int = 16,
        retries: int = 3,
        backoff: float = 0.5,
        timeout: float = 120.0,
        connect_timeout: float = 5.0,
        api_key: str | None = None,
        seed: int | None = None,
        extra_body: dict | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        if backoff < 0 or timeout <= 0 or connect_timeout <= 0:
            raise ValueError(f"backoff must be >= 0 and timeouts > 0, got backoff={backoff}, "
                             f"timeout={timeout}, connect_timeout={connect_timeout}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if tokenizer is None:
            from compactrl.tokenizer import shared_tokenizer

            tokenizer = shared_tokenizer()  # read only here
        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.model = model
        self.tokenizer = tokenizer
        self.sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
        self.max_new_tokens = max_new_tokens
        self.context_length = context_length or 1 << 30
        self.stop_token_ids = sorted(set(stop_token_ids)) if stop_token_ids else default_stop_ids(tokenizer)
        self.retries, self.backoff = retries, backoff
        self.timeout = (connect_timeout, timeout)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.seed = seed
        self.extra_body = dict(extra_body or {})
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="compactrl-client")
        self._local = threading.local()
        self._count = 0
        self._count_lock = threading.Lock()

    # -- plumbing ----------------------------------------------------------------------------------

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def _post(self, path: str, body: dict) -> dict:
        url = f"{self.base_url}{path}"
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                resp = self._session().post(url, json=body, headers=self.headers, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout) as exc:
                last = exc
                self._local.session = None  # a broken pooled connection must not be reused
                logger.warning("POST %s failed (attempt %d/%d): %s", url, attempt + 1, self.retries + 1, exc)
                continue
            if resp.status_code in RETRY_STATUSES and attempt < self.retries:
                logger.warning("POST %s: HTTP %d, retrying", url, resp.status_code)
                continue
            return self._read(resp, url)
        raise ServerUnavailableError(
            f"could not reach {url} after {self.retries + 1} attempts: {type(last).__name__}: {last}"
        ) from last

    @staticmethod
    def _read(resp: requests.Response, url: str) -> dict:
        if resp.status_code != 200:
            message = None
            try:
                err = resp.json()
                if isinstance(err, dict):
                    inner = err.get("error")
                    message = err.get("message") or (inner.get("message") if isinstance(inner, dict) else inner)
            except ValueError:
                pass
            raise ServerResponseError(
                f"{url} answered HTTP {resp.status_code}: {message or resp.text[:500]}",
                status=resp.status_code, body=resp.text,
            )
        try:
            return resp.json()
        except ValueError as exc:
            raise ServerResponseError(f"{url} returned a body that is not JSON: {resp.text[:200]!r}",
                                      status=200, body=resp.text) from exc

    def _next_seed(self) -> int | None:
        if self.seed is None:
            return None
        with self._count_lock:
            self._count += 1
            return self.seed + self._count

    # -- policy ------------------------------------------------------------------------------------

    def complete(self, prompt_ids: Sequence[int], max_new_tokens: int, *, sampling: SamplingConfig | None = None,
                 stop_token_ids: Sequence[int] | None = None, seed: int | None = None) -> Generated:
        """One completion of a token-id prompt (``sampling``, stop ids and seed override the client's)."""
        stop = self.stop_token_ids if stop_token_ids is None else list(stop_token_ids)
        body = completion_payload(self.model, prompt_ids, max_new_tokens, sampling or self.sampling, stop,
                                  seed=self._next_seed() if seed is None else seed, extra=self.extra_body)
        data = self._post("/completions", body)
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices:
            raise ServerResponseError(f"the response has no choices: {str(data)[:200]}")
        return parse_choice(choices[0], stop)

    def act(self, requests: Sequence[PolicyRequest]) -> list[str]:
        prompts = [prompt_ids_for(r, self.tokenizer) for r in requests]
        limits = budgets(requests, [len(p) for p in prompts], self.max_new_tokens, self.context_length)
        out: list[TokenResponse] = []
        futures = [self._pool.submit(self._one, p, n) for p, n in zip(prompts, limits)]
        for f in futures:
            out.append(f.result())
        return out

    def _one(self, prompt: list[int], n: int) -> TokenResponse:
        if n == 0:
            return TokenResponse("", [], [], finished=False)
        return to_token_response(self.complete(prompt, n), self.tokenizer, self.stop_token_ids)

    def models(self) -> list[str]:
        """Model names the server lists under ``/v1/models``."""
        try:
            resp = self._session().get(f"{self.base_url}/models", headers=self.headers, timeout=self.timeout)
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise ServerUnavailableError(f"could not reach {self.base_url}/models: {exc}") from exc
        return [m["id"] for m in self._read(resp, f"{self.base_url}/models").get("data", [])]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> OpenAICompletionsPolicy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
