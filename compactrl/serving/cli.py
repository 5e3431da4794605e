"""``compactrl serve`` on the command line: its options, the model it loads, and serving until a signal.

``compactrl serve (--model DIR | --tiny ARCH) [--engine transformers|vllm] [server options]`` prints
``compactrl serve: model '<name>' on <url>/v1`` once it accepts connections, and exits with status 0
on SIGINT or SIGTERM. ``compactrl gateway`` and ``compactrl eval`` reuse the model options and
:func:`load_policy`.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

import torch

from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.serving.batching import PolicyEngine
from compactrl.serving.completions import LOGPROBS_MODES
from compactrl.serving.server import ApiServer, EngineServer, ServeConfig, make_server


def vllm_served(policy: TransformersPolicy, args: argparse.Namespace):
    """``--engine vllm``: ``policy``'s model served by a vLLM engine process (its weights written to a
    temporary directory), sampling like ``policy``; the caller closes it."""
    import tempfile

    from compactrl.serving.vllm.policy import VLLMPolicy

    return VLLMPolicy.from_model(
        policy.model, policy.tokenizer, tempfile.mkdtemp(prefix="compactrl-vllm-model."),
        engine=dict(dtype=args.dtype, threads=args.threads or 1), seed=args.seed,
        max_new_tokens=policy.max_new_tokens, stop_token_ids=policy.stop_token_ids)


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
