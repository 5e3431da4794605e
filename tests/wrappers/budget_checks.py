"""Shared drivers and invariant checks for the context-budget wrapper tests."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from compactrl.tokenizer import IM_END_ID, load_tokenizer
from compactrl.types import TokenResponse
from compactrl.wrappers import ContextBudget

TOK = load_tokenizer()


@dataclass(frozen=True)
class Move:
    """One policy response, independent of what the env asks (the driver adapts it to max_new_tokens)."""

    kind: str  # "str" | "tokens" | "submit"
    text: str = ""
    ids: tuple[int, ...] = ()
    stop: bool = False  # a token response that sampled the end-of-turn id
    log_probs: bool = True


def str_action(text: str, max_new: int):
    """A plain-text response and the policy ids the wrapper must record for it."""
    expected = (TOK.encode(text, add_special_tokens=False, split_special_tokens=True) + [IM_END_ID])[:max_new]
    return text, expected, [math.nan] * len(expected)


def to_action(move: Move, max_new: int, step: int):
    """The response a policy obeying ``max_new_tokens`` would give, and the policy ids it carries."""
    if move.kind == "submit":
        move = Move(kind="str", text="SUBMIT")
    if move.kind == "str":
        return str_action(move.text, max_new)
    body = [i for i in move.ids if i not in (0, IM_END_ID)][: max_new - 1] or [7 + step % 50]
    ids = body + [IM_END_ID] if move.stop else body
    lps = [-(1 + (i + step) % 7) / 3 for i in range(len(ids))] if move.log_probs else None
    text = TOK.decode(body)
    return TokenResponse(text, ids, lps, finished=move.stop), ids, lps or [math.nan] * len(ids)


def same_floats(a, b) -> bool:
    return len(a) == len(b) and all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b))


def run(env: ContextBudget, seed: int, moves: list[Move] | Callable, max_steps: int = 200, options=None):
    """Drive one episode; returns one record per step (obs, info, action, carried ids, outcome).

    ``moves``: a list of :class:`Move` (cycled), or ``respond(obs, info, t) -> (action, ids, log_probs)``.
    """
    obs, info = env.reset(seed=seed, options=options)
    log = []
    for t in range(max_steps):
        if callable(moves):
            action, ids, lps = moves(obs, info, t)
        else:
            action, ids, lps = to_action(moves[t % len(moves)], info["max_new_tokens"], t)
        nobs, reward, term, trunc, ninfo = env.step(action)
        log.append(dict(obs=obs, info=info, action=action, ids=ids, lps=lps, reward=reward, term=term,
                        trunc=trunc, next_obs=nobs, next_info=ninfo))
        obs, info = nobs, ninfo
        if term or trunc:
            return log
    raise AssertionError("episode did not end")


def check_episode(env: ContextBudget, log: list[dict]) -> None:
    cfg = env.config
    traces, calls, carried = [], [], []  # finished traces, prompts of the current trace, action ids
    summaries = 0
    for s in log:
        info, obs = s["info"], s["obs"]
        prompt = info["prompt_token_ids"]
        # the invariant: prompt + reserve never exceeds the budget, at every model call
        assert len(prompt) + cfg.reserve <= cfg.budget
        assert info["context_tokens"] == len(prompt)
        assert info["max_new_tokens"] == (cfg.summary_tokens if info["compaction_required"] else cfg.reserve)
        assert env.observation_space.contains(obs)
        # the ids are exactly the observation rendered by the chat template (per part)
        assert TOK.decode(prompt) == TOK.apply_chat_template(list(obs), tokenize=False, add_generation_prompt=True)
        calls.append(prompt)
        carried.append(s)
        ninfo = s["next_info"]
        assert ninfo["compacted"] == info["compaction_required"]
        if info["compaction_required"]:
            assert obs[-1] == {"role": "user", "content": cfg.summary_instruction}
            assert s["reward"] == 0.0
        if ninfo["compacted"]:
            summaries += 1
            # the summary text opens the next trace (cut to max_new_tokens when it was too long)
            cut = not isinstance(s["action"], TokenResponse) and s["ids"][-1:] != [IM_END_ID]
            summary_text = TOK.decode(s["ids"]) if cut else str(s["action"])
            first = s["next_obs"][:3]
            assert first[:2] == log[0]["obs"][:2]
            assert first[2] == {"role": "user", "content": cfg.summary_header + summary_text}
            assert ninfo["trace_index"] == info["trace_index"] + 1
        if "trace" in ninfo:
            tr = ninfo["trace"]
            tr.validate()
            traces.append(tr)
            assert tr.trace_index == len(traces) - 1 == info["trace_index"]
            assert tr.ends_with_summary == ninfo["compacted"]
            # policy tokens are exactly the ids the actions carried, in order, with their log-probs
            pol = [i for i, p in enumerate(tr.policy_mask) if p]
            assert [tr.token_ids[i] for i in pol] == [t for c in carried for t in c["ids"]]
            assert same_floats([tr.log_probs[i] for i in pol], [x for c in carried for x in c["lps"]])
            # rewards sit on the last policy token of each response
            ends, n = [], 0
            for c in carried:
                n += len(c["ids"])
                ends.append(pol[n - 1])
            assert sorted(tr.rewards) == ends
            assert [tr.rewards[e] for e in ends] == [c["reward"] for c in carried]
            # summary tokens: exactly the last response of a trace that ends with a summary
            summ = [i for i, m in enumerate(tr.summary_mask) if m]
            assert summ == (pol[len(pol) - len(carried[-1]["ids"]):] if tr.ends_with_summary else [])
            # every prompt of the trace is a prefix of it
            for p in calls:
                assert tr.token_ids[: len(p)] == p
            calls, carried = [], []
    last = log[-1]["next_info"]
    assert last["num_traces"] == len(traces) == last["num_compactions"] + 1 == summaries + 1
    assert last["summary_tokens"] == sum(sum(t.summary_mask) for t in traces)
    assert last["context_tokens_max"] == max(len(s["info"]["prompt_token_ids"]) for s in log)
    assert last["num_compactions"] <= cfg.max_compactions
    if last.get("budget_exhausted"):
        assert log[-1]["trunc"] and last["num_compactions"] == cfg.max_compactions
