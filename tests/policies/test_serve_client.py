import argparse
import os
import queue
import signal
import threading
import time

import pytest
import requests
import torch
from policy_helpers import cached_tiny, random_prompts, right_padded, start_server, stop_server

from compactrl.cli import main as cli_main
from compactrl.policies.openai_client import (
    OpenAICompletionsPolicy,
    ServerResponseError,
    ServerUnavailableError,
    completion_payload,
    parse_choice,
)
from compactrl.policies.sampling import SamplingConfig
from compactrl.policies.tiny_moe import tiny_moe
from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.serving.batching import gather
from compactrl.serving.cli import load_policy
from compactrl.serving.completions import Job
from compactrl.serving.server import ServeConfig, make_server
from compactrl.types import PolicyRequest, TokenResponse

FP32_TOL = 1e-4


def test_a_batch_is_gathered_in_arrival_order_up_to_its_size():
    jobs: queue.Queue[Job] = queue.Queue()
    assert gather(jobs, max_batch_size=4, wait_s=0.0) == []  # nothing within 0.1 s
    made = [Job([i + 1], 1, SamplingConfig(), SamplingConfig(), (0,), 0, None) for i in range(5)]
    for job in made:
        jobs.put(job)
    assert gather(jobs, max_batch_size=3, wait_s=0.0) == made[:3]
    assert gather(jobs, max_batch_size=3, wait_s=0.0) == made[3:]


@pytest.fixture(scope="module")
def server(tokenizer):
    """An in-process server on a free loopback port (the subprocess tests below cover the CLI)."""
    policy = TransformersPolicy(cached_tiny("glm4_moe"), tokenizer, seed=0)
    srv = make_server(policy, ServeConfig(port=0, model_name="tiny", batch_wait_ms=20))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    host, port = srv.server_address[:2]
    yield srv, f"http://{host}:{port}"
    srv.shutdown()
    srv.server_close()


def max_diff_vs_log_prob(policy, prompts, responses, **kw):
    seqs = [list(p) + list(r.token_ids) for p, r in zip(prompts, responses)]
    tokens, mask = right_padded(seqs)
    with torch.no_grad():
        lp, _ = policy.log_prob(tokens, mask, **kw)
    return max((lp[i, len(p): len(p) + len(r.token_ids)] - torch.tensor(r.log_probs)).abs().max().item()
               for i, (p, r) in enumerate(zip(prompts, responses)))


# -- protocol ---------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_health_models_and_completion_fields(server):
    _, url = server
    assert requests.get(f"{url}/health", timeout=5).status_code == 200
    models = requests.get(f"{url}/v1/models", timeout=5).json()
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == 8192
    body = {"model": "tiny", "prompt": [1, 399, 201, 2, 1], "max_tokens": 6, "logprobs": 2,
            "return_token_ids": True, "return_tokens_as_token_ids": True}
    data = requests.post(f"{url}/v1/completions", json=body, timeout=60).json()
    choice = data["choices"][0]
    assert data["object"] == "text_completion" and data["usage"]["prompt_tokens"] == 5
    assert choice["prompt_token_ids"] == body["prompt"]
    ids = choice["token_ids"]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids]
    assert data["usage"]["completion_tokens"] == len(ids) <= 6
    for t, lp, top in zip(ids, choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"]):
        assert top[f"token_id:{t}"] == lp and 2 <= len(top) <= 3
    assert choice["finish_reason"] in ("stop", "length")
    # a string prompt and a batch of prompts
    data = requests.post(f"{url}/v1/completions", json={"prompt": ["hello", [5, 6, 7]], "max_tokens": 2},
                         timeout=60).json()
    assert [c["index"] for c in data["choices"]] == [0, 1] and data["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("body,status,word", [
    ({"model": "other", "prompt": [1]}, 404, "does not exist"),
    ({"prompt": [1], "n": 2}, 400, "'n'"),
    ({"prompt": [1], "stream": True}, 400, "'stream'"),
    ({"prompt": [1], "stop": ["\n"]}, 400, "stop_token_ids"),
    ({"prompt": [1], "max_tokens": 9000}, 400, "maximum context length"),
    ({"prompt": [1, 99999]}, 400, "token ids must be in"),
    ({"prompt": {"x": 1}}, 400, "'prompt'"),
    ({"prompt": [1], "temperature": "hot"}, 400, "'temperature'"),
    ({"prompt": [1], "logprobs": 50}, 400, "'logprobs'"),
    ({"max_tokens": 3}, 400, "'prompt' is required"),
])
@pytest.mark.timeout(30)
def test_bad_requests_get_vllm_style_errors(server, body, status, word):
    _, url = server
    resp = requests.post(f"{url}/v1/completions", json=body, timeout=30)
    assert resp.status_code == status
    err = resp.json()["error"]
    assert err["code"] == status and word in err["message"]


def test_not_json_unknown_route_and_limits(tokenizer):
    policy = TransformersPolicy(cached_tiny("glm4_moe"), tokenizer, seed=0)
    with make_server(policy, ServeConfig(port=0, model_name="tiny", max_body_bytes=2000)) as srv:
        url = srv.url
        resp = requests.post(f"{url}/v1/completions", data=b"{nope", timeout=10,
                             headers={"Content-Type": "application/json"})
        assert resp.status_code == 400 and "not valid JSON" in resp.json()["error"]["message"]
        assert requests.post(f"{url}/v1/chat/completions", json={}, timeout=10).status_code == 404
        big = requests.post(f"{url}/v1/completions", json={"prompt": [1] * 1000}, timeout=10)
        assert big.status_code == 413 and "at most 2000 bytes" in big.json()["error"]["message"]

        def chunks():  # no Content-Length: the limit must hold on what arrives
            for _ in range(100):
                yield b"[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],"
        chunked = requests.post(f"{url}/v1/completions", data=chunks(), timeout=10,
                                headers={"Content-Type": "application/json"})
        assert chunked.status_code == 413
        # the server survived every one of them
        ok = requests.post(f"{url}/v1/completions", json={"prompt": [1, 5, 6], "max_tokens": 2}, timeout=30)
        assert ok.status_code == 200 and len(ok.json()["choices"]) == 1


# -- client against the server ----------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_client_log_probs_equal_log_prob_and_requests_batch(server, tokenizer):
    srv, url = server
    prompts = random_prompts(12, lo=5, hi=80, seed=21)
    batches_before = srv.engine.batches
    with OpenAICompletionsPolicy(url, "tiny", tokenizer=tokenizer, max_new_tokens=10, max_concurrency=12) as client:
        out = client.act([PolicyRequest(messages=[], prompt_token_ids=p) for p in prompts])
    assert all(isinstance(r, TokenResponse) and 0 < len(r.token_ids) <= 10 for r in out)
    assert srv.engine.batches - batches_before < len(prompts)  # concurrent requests shared batches
    diff = max_diff_vs_log_prob(srv.policy, prompts, out)
    print(f"serve+client: max |sample log-prob - log_prob| = {diff:.2e}")
    assert diff < FP32_TOL
    for r in out:
        body = list(r.token_ids[:-1]) if r.finished else list(r.token_ids)
        assert str(r) == tokenizer.decode(body, skip_special_tokens=False)


@pytest.mark.timeout(120)
def test_batched_server_greedy_equals_in_process(server, tokenizer):
    srv, url = server
    prompts = random_prompts(8, lo=5, hi=60, seed=22)
    with OpenAICompletionsPolicy(url, "tiny", tokenizer=tokenizer, temperature=0.0, max_new_tokens=6,
                                 max_concurrency=8) as client:
        remote = client.act([PolicyRequest(messages=[], prompt_token_ids=p) for p in prompts])
    local = TransformersPolicy(srv.policy.model, tokenizer, temperature=0.0).generate(prompts, 6)
    assert [list(r.token_ids) for r in remote] == [g.token_ids for g in local]


@pytest.mark.timeout(60)
def test_raw_logprobs_mode_reports_the_untempered_model(tokenizer):
    policy = TransformersPolicy(cached_tiny("mixtral"), tokenizer, seed=0)
    srv = make_server(policy, ServeConfig(port=0, model_name="m", logprobs_mode="raw_logprobs"))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        prompts = random_prompts(3, seed=23)
        with OpenAICompletionsPolicy(url, "m", tokenizer=tokenizer, temperature=0.5, max_new_tokens=5) as client:
            out = client.act([PolicyRequest(messages=[], prompt_token_ids=p) for p in prompts])
        assert max_diff_vs_log_prob(policy, prompts, out, temperature=1.0) < FP32_TOL
        assert max_diff_vs_log_prob(policy, prompts, out, temperature=0.5) > 1e-2
    finally:
        srv.shutdown()
        srv.server_close()


def test_http_errors_are_surfaced(server, tokenizer):
    _, url = server
    with OpenAICompletionsPolicy(url, "wrong-name", tokenizer=tokenizer, retries=0) as client:
        with pytest.raises(ServerResponseError, match="404.*does not exist") as info:
            client.act([PolicyRequest(messages=[], prompt_token_ids=[1, 2, 3])])
    assert info.value.status == 404


def test_payload_and_choice_parsing_are_pure():
    body = completion_payload("m", [1, 2], 7, SamplingConfig(temperature=0.3, top_k=5), [2, 0], seed=9)
    assert body["prompt"] == [1, 2] and body["max_tokens"] == 7 and body["top_k"] == 5 and body["seed"] == 9
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"] and body["logprobs"] == 0
    # a server without return_token_ids: ids come from the "token_id:N" logprob tokens
    choice = {"logprobs": {"tokens": ["token_id:7", "token_id:2"], "token_logprobs": [-1.0, -2.0]}}
    g = parse_choice(choice, [2])
    assert g.token_ids == [7, 2] and g.finished and g.log_probs == [-1.0, -2.0]
    with pytest.raises(ServerResponseError, match="token_id"):
        parse_choice({"logprobs": {"tokens": ["abc"], "token_logprobs": [-1.0]}}, [2])
    with pytest.raises(ServerResponseError, match="logprobs"):
        parse_choice({"text": "x", "logprobs": None}, [2])


def test_serve_loads_a_saved_model_directory(tokenizer, tmp_path):
    TransformersPolicy(cached_tiny("mixtral"), tokenizer).save_pretrained(tmp_path)
    args = argparse.Namespace(model=str(tmp_path), tiny=None, tokenizer=None, seed=0, dtype="float32")
    policy, name = load_policy(args)
    assert name == tmp_path.name and policy.stop_token_ids == [0, 2]
    state = cached_tiny("mixtral").state_dict()
    assert all(torch.equal(policy.state_dict()[k], v) for k, v in state.items())
    with pytest.raises(ValueError, match="--model"):
        load_policy(argparse.Namespace(**{**vars(args), "model": str(tmp_path / "missing")}))


def test_cli_help_lists_serve_options(capsys):
    with pytest.raises(SystemExit):
        cli_main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--tiny" in out and "--logprobs-mode" in out and "--max-batch-size" in out


# -- a real `compactrl serve` process ---------------------------------------------------------------

def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_until_busy(pid: int, since: float, cpu_s: float = 0.3, timeout_s: float = 60.0) -> None:
    """Bounded wait until the server has spent ``cpu_s`` of CPU after ``since``: it is generating (idle,
    it only wakes every 0.1 s), instead of guessing how long a request takes to arrive."""
    deadline = time.monotonic() + timeout_s
    while _cpu_seconds(pid) - since < cpu_s:
        assert time.monotonic() < deadline, f"the server used no {cpu_s} s of CPU within {timeout_s} s"
        time.sleep(0.01)

@pytest.mark.timeout(300)
def test_cli_server_agreement_then_killed_server_is_a_clear_error(tokenizer):
    proc, url = start_server("--tiny", "qwen3_moe", "--seed", "0")
    try:
        local = TransformersPolicy(tiny_moe("qwen3_moe", seed=0), tokenizer)  # same seed: same weights
        prompts = random_prompts(6, lo=5, hi=50, seed=31)
        client = OpenAICompletionsPolicy(url, "tiny-qwen3_moe", tokenizer=tokenizer, max_new_tokens=8,
                                         retries=2, backoff=0.1, timeout=60)
        assert client.models() == ["tiny-qwen3_moe"]
        out = client.act([PolicyRequest(messages=[], prompt_token_ids=p) for p in prompts])
        diff = max_diff_vs_log_prob(local, prompts, out)
        print(f"compactrl serve process + client: max |sample log-prob - log_prob| = {diff:.2e}")
        assert diff < FP32_TOL
        # kill -9 in the middle of a long generation: the waiting request fails, it does not hang
        errors: list[BaseException] = []

        def long_request():
            try:
                client.complete(prompts[0], 4000)
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                errors.append(exc)

        idle_cpu = _cpu_seconds(proc.pid)
        t = threading.Thread(target=long_request)
        t.start()
        _wait_until_busy(proc.pid, idle_cpu)
        assert t.is_alive() and not errors  # the kill lands while the request is being generated
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        t.join(timeout=30)
        assert not t.is_alive() and errors and isinstance(errors[0], ServerUnavailableError), errors
        start = time.monotonic()
        with pytest.raises(ServerUnavailableError, match="could not reach"):
            client.act([PolicyRequest(messages=[], prompt_token_ids=prompts[1])])
        assert time.monotonic() - start < 10
        client.close()
    finally:
        stop_server(proc)
