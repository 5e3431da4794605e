"""CompactCode-v0 episodes end to end with learned policies: the wrapper's prompts in, token-carrying
responses out, compaction included; the finished traces' recorded log-probs must equal ``log_prob``."""

import math
import threading

import gymnasium as gym
import pytest
import torch
from policy_helpers import cached_tiny, right_padded

import compactrl  # noqa: F401  (registers the env ids)
from compactrl.policies.openai_client import OpenAICompletionsPolicy
from compactrl.policies.transformers_policy import TransformersPolicy
from compactrl.serving.server import ServeConfig, make_server
from compactrl.types import PolicyRequest, TokenResponse
from compactrl.wrappers.context_budget import ContextBudget

RESERVE, CAP = 24, 64


def _budget_wrapper(env) -> ContextBudget:
    while not isinstance(env, ContextBudget):
        env = env.env
    return env


def make_env(tokenizer, max_turns: int = 5):
    """``gym.make("CompactCode-v0")`` with a budget small enough that the episode compacts (sized from
    a probe reset: system + task + room for a summary request, a summary and a clipped tool output)."""
    kw = dict(max_turns=max_turns, reserve=RESERVE, tool_output_cap=CAP, tokenizer=tokenizer)
    probe = gym.make("CompactCode-v0", budget=8192, **kw)
    _, info = probe.reset(seed=0)
    room = getattr(_budget_wrapper(probe), "_summary_room", 150)  # room to ask for a summary
    budget = len(info["prompt_token_ids"]) + 2 * RESERVE + CAP + room + 100
    return gym.make("CompactCode-v0", budget=budget, max_compactions=2, **kw)


def run_episode(env, policy, seed=0):
    obs, info = env.reset(seed=seed)
    traces, steps = [], 0
    while True:
        request = PolicyRequest(messages=obs, prompt_token_ids=info["prompt_token_ids"],
                                max_new_tokens=info["max_new_tokens"],
                                compaction_required=info["compaction_required"])
        [response] = policy.act([request])
        assert isinstance(response, TokenResponse) and len(response.token_ids) <= info["max_new_tokens"]
        obs, _, terminated, truncated, info = env.step(response)
        steps += 1
        if "trace" in info:
            traces.append(info["trace"])
        if terminated or truncated:
            return traces, steps


def check_traces(traces, trainer: TransformersPolicy) -> float:
    """Every policy token carries its sampling log-prob, equal to the trainer's recomputation."""
    tokens, mask = right_padded([t.token_ids for t in traces])
    with torch.no_grad():
        lp, _ = trainer.log_prob(tokens, mask)
    diff, sampled = 0.0, 0
    for i, t in enumerate(traces):
        t.validate()
        for pos, (is_policy, recorded) in enumerate(zip(t.policy_mask, t.log_probs)):
            if is_policy:
                assert not math.isnan(recorded)
                diff = max(diff, abs(lp[i, pos].item() - recorded))
                sampled += 1
    assert sampled > 0
    return diff


@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch", ["glm4_moe", pytest.param("qwen3_moe", marks=pytest.mark.slow),
                                  pytest.param("mixtral", marks=pytest.mark.slow)])
def test_episode_with_transformers_policy(arch, tokenizer):
    policy = TransformersPolicy(cached_tiny(arch), tokenizer, seed=0)
    traces, steps = run_episode(make_env(tokenizer), policy)
    assert steps >= 3 and len(traces) >= 2 and traces[0].ends_with_summary
    diff = check_traces(traces, policy)
    print(f"{arch}: {steps} steps, {len(traces)} traces, max |trace log-prob - log_prob| = {diff:.2e}")
    assert diff < 1e-4


@pytest.mark.timeout(300)
def test_episode_with_client_against_serve(tokenizer):
    served = TransformersPolicy(cached_tiny("qwen3_moe"), tokenizer, seed=0)
    srv = make_server(served, ServeConfig(port=0, model_name="tiny"))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        with OpenAICompletionsPolicy(url, "tiny", tokenizer=tokenizer, seed=0) as client:
            traces, steps = run_episode(make_env(tokenizer), client)
        assert steps >= 3 and len(traces) >= 2
        diff = check_traces(traces, served)
        print(f"client+serve: {steps} steps, {len(traces)} traces, max |trace log-prob - log_prob| = {diff:.2e}")
        assert diff < 1e-4
    finally:
        srv.shutdown()
        srv.server_close()
