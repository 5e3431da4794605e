"""Gateway cost: overhead per call vs calling the policy directly, and requests/s with concurrent clients.

    python benchmarks/gateway_bench.py                      # tiny glm4_moe, 40 calls, 32 clients
    python benchmarks/gateway_bench.py --calls 20 --clients 32 --requests-per-client 4 --threads 1

Overhead: the same chat (a fixed system + user turn, greedy, ``--max-tokens`` new tokens, so every
path generates the same tokens) timed three ways, one call at a time: ``policy.generate`` on the
prompt ids (direct), the gateway's engine without HTTP (``engine.submit``), and a full
``POST /v1/chat/completions`` over loopback (rendering, pydantic, recording, JSON). The table gives
the median and the overhead of each path over direct.

Concurrency: ``--clients`` threads, each with its own HTTP session, send ``--requests-per-client``
chat requests (sampled, distinct prompts) at once; requests/s and completion tokens/s are over the
whole burst, with the median latency, and the engine's batches show how the requests shared them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import requests
import torch

from compactrl.gateway import Gateway, GatewayConfig, LocalEngine
from compactrl.gateway.chat import ChatRequest, prompt_ids
from compactrl.policies.sampling import SamplingConfig
from compactrl.policies.tiny_moe import tiny_moe
from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.serving.completions import Job
from compactrl.serving.server import ServeConfig
from compactrl.tokenizer import load_tokenizer

MESSAGES = [{"role": "system", "content": "You are a coding agent. Answer with one shell command."},
            {"role": "user", "content": "The tests in tests/test_util.py fail. Find out why and fix it."}]


def _median_s(fn, n: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def overhead(gw: Gateway, policy: TransformersPolicy, calls: int, max_tokens: int) -> dict:
    greedy = SamplingConfig(temperature=0.0)
    prompt = prompt_ids(gw.fmt, ChatRequest(messages=MESSAGES), None)
    stop = tuple(policy.stop_token_ids)
    session = requests.Session()
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0.0}
    # greedy on one prompt: every path generates the same tokens
    direct = _median_s(lambda: policy.generate([prompt], max_tokens, sampling=greedy), calls)
    engine = _median_s(lambda: gw.engine.submit([Job(prompt, max_tokens, greedy, greedy, stop, 0, None)])[0]
                       .result(), calls)

    def http():
        r = session.post(f"{gw.url}/s/bench/v1/chat/completions", json=body, timeout=120)
        r.raise_for_status()

    full = _median_s(http, calls)
    return {"prompt_tokens": len(prompt), "max_tokens": max_tokens, "direct_ms": 1e3 * direct,
            "engine_ms": 1e3 * engine, "gateway_http_ms": 1e3 * full,
            "engine_overhead_ms": 1e3 * (engine - direct), "gateway_overhead_ms": 1e3 * (full - direct)}


def burst(gw: Gateway, clients: int, per_client: int, max_tokens: int) -> dict:
    latencies: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    start_gate = threading.Barrier(clients + 1)

    def client(k: int) -> None:
        session = requests.Session()
        start_gate.wait()
        for i in range(per_client):
            msgs = [MESSAGES[0], {"role": "user", "content": f"{MESSAGES[1]['content']} (client {k}, try {i})"}]
            t = time.perf_counter()
            r = session.post(f"{gw.url}/s/burst-{k}/v1/chat/completions", timeout=600,
                             json={"model": "tiny", "messages": msgs, "max_tokens": max_tokens})
            r.raise_for_status()
            with lock:
                latencies.append(time.perf_counter() - t)
                tokens[0] += r.json()["usage"]["completion_tokens"]

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    batches0, jobs0 = gw.engine.engine.batches, gw.engine.engine.jobs
    start_gate.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    n = clients * per_client
    return {"clients": clients, "requests": n, "wall_s": wall, "requests_per_s": n / wall,
            "completion_tokens_per_s": tokens[0] / wall, "median_latency_s": statistics.median(latencies),
            "mean_batch": (gw.engine.engine.jobs - jobs0) / max(gw.engine.engine.batches - batches0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="glm4_moe", choices=("glm4_moe", "qwen3_moe", "mixtral"))
    ap.add_argument("--calls", type=int, default=40, help="timed calls per path (overhead)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of the generation thread")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    policy = TransformersPolicy(tiny_moe(args.arch, seed=0), load_tokenizer(), seed=0)
    config = GatewayConfig(serve=ServeConfig(port=0, model_name="tiny", max_batch_size=32, batch_wait_ms=5))
    with Gateway(LocalEngine(policy, max_batch_size=32, batch_wait_ms=5, threads=args.threads), config) as gw:
        over = overhead(gw, policy, args.calls, args.max_tokens)
        conc = burst(gw, args.clients, args.requests_per_client, args.max_tokens)
    print(f"one call, {over['prompt_tokens']} prompt tokens, {over['max_tokens']} new (median of {args.calls}):")
    print(f"  direct policy.generate   {over['direct_ms']:8.1f} ms")
    print(f"  engine (no HTTP)         {over['engine_ms']:8.1f} ms   overhead {over['engine_overhead_ms']:+7.1f} ms")
    print(f"  gateway chat over HTTP   {over['gateway_http_ms']:8.1f} ms   overhead {over['gateway_overhead_ms']:+7.1f} ms")
    print(f"{conc['clients']} concurrent clients, {conc['requests']} requests: {conc['requests_per_s']:.1f} req/s, "
          f"{conc['completion_tokens_per_s']:.0f} completion tokens/s, median latency "
          f"{conc['median_latency_s']:.2f} s, {conc['mean_batch']:.1f} requests per generation batch")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "overhead": over, "concurrency": conc}, f, indent=2)


if __name__ == "__main__":
    main()
