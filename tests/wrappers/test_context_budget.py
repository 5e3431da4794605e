"""ContextBudget: invariants over random action sequences (hypothesis), plus edge cases."""

from __future__ import annotations

import pytest
from budget_checks import TOK, Move, check_episode, run, same_floats
from echo_env import EchoEnv
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from compactrl.tokenizer import IM_END_ID, load_tokenizer
from compactrl.types import TokenResponse
from compactrl.wrappers import ContextBudget, ContextBudgetConfig

pytestmark = pytest.mark.timeout(120)

UNICODE = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400)


MOVES = st.one_of(
    st.builds(Move, kind=st.just("str"), text=UNICODE),
    st.builds(Move, kind=st.just("str"), text=st.sampled_from(["Summary: the value is 42.", "REWARD <tool>test</tool>"])),
    st.builds(
        Move,
        kind=st.just("tokens"),
        ids=st.lists(st.integers(0, len(TOK) - 1), min_size=0, max_size=300).map(tuple),
        stop=st.booleans(),
        log_probs=st.booleans(),
    ),
    st.sampled_from([Move(kind="submit")] + [Move(kind="str", text="<tool>view a.py 1 40</tool>")] * 4),
)
CONFIGS = st.builds(
    ContextBudgetConfig,
    budget=st.integers(700, 2500),
    reserve=st.integers(8, 120),
    tool_output_cap=st.integers(24, 300),
    max_compactions=st.integers(0, 4),
    max_summary_tokens=st.one_of(st.none(), st.integers(4, 8)),
)


def make_env(config: ContextBudgetConfig, **env_kw) -> ContextBudget:
    return ContextBudget(EchoEnv(**env_kw), config, tokenizer=TOK)


@settings(max_examples=40)
@given(CONFIGS, st.lists(MOVES, min_size=1, max_size=12), st.integers(0, 2**31 - 1))
def test_invariants_over_random_action_sequences(config, moves, seed):
    try:
        env = make_env(config)
    except ValueError:
        assume(False)
    try:
        log = run(env, seed, moves)
    except ValueError as exc:  # a task too long for this budget is refused at reset
        assert "budget" in str(exc)
        assume(False)
    check_episode(env, log)


@settings(max_examples=10)
@given(st.lists(MOVES, min_size=1, max_size=8), st.integers(0, 2**31 - 1))
def test_seeded_runs_are_reproducible(moves, seed):
    cfg = ContextBudgetConfig(budget=900, reserve=64, tool_output_cap=120, max_compactions=3)
    a, b = run(make_env(cfg), seed, moves), run(make_env(cfg), seed, moves)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x["next_obs"] == y["next_obs"] and x["reward"] == y["reward"]
        assert x["next_info"].get("prompt_token_ids") == y["next_info"].get("prompt_token_ids")
        if "trace" in x["next_info"]:
            tx, ty = x["next_info"]["trace"], y["next_info"]["trace"]
            assert tx.token_ids == ty.token_ids and tx.policy_mask == ty.policy_mask
            assert same_floats(tx.log_probs, ty.log_probs) and tx.rewards == ty.rewards


def test_compaction_happens_and_new_trace_starts_from_summary():
    cfg = ContextBudgetConfig(budget=1200, reserve=64, tool_output_cap=200, max_compactions=2)
    env = make_env(cfg, max_output_chars=600, max_turns=60)
    obs, info = env.reset(seed=3)
    steps = 0
    while not info["compaction_required"]:
        obs, _, term, trunc, info = env.step("<tool>view a.py 1 40</tool>")
        steps += 1
        assert not (term or trunc)
    assert steps >= 2 and obs[-1]["content"] == cfg.summary_instruction
    old_trace_len = len(info["prompt_token_ids"])
    obs, reward, term, trunc, info = env.step("Facts: LIMIT = 7 in app/config.py.")
    assert info["compacted"] and info["trace_index"] == 1 and reward == 0.0 and not (term or trunc)
    assert [m["role"] for m in obs] == ["system", "user", "user", "tool"]
    assert obs[2]["content"] == cfg.summary_header + "Facts: LIMIT = 7 in app/config.py."
    assert obs[3]["content"].startswith("echo[")  # the tool output held back during the summary
    tr = info["trace"]
    assert tr.ends_with_summary and len(tr) > old_trace_len
    summary_ids = [t for t, m in zip(tr.token_ids, tr.summary_mask) if m]
    assert TOK.decode(summary_ids) == "Facts: LIMIT = 7 in app/config.py.<|im_end|>"
    assert len(info["prompt_token_ids"]) < old_trace_len


def test_budget_exhaustion_truncates_after_max_compactions():
    cfg = ContextBudgetConfig(budget=1000, reserve=48, tool_output_cap=150, max_compactions=1)
    env = make_env(cfg, max_output_chars=900, max_turns=500)
    _, info = env.reset(seed=0)
    for _ in range(500):
        action = "summary" if info["compaction_required"] else "<tool>view a.py</tool>"
        _, _, term, trunc, info = env.step(action)
        if term or trunc:
            break
    assert trunc and not term and info["budget_exhausted"]
    assert info["num_compactions"] == 1 and info["num_traces"] == 2 and info["trace"].trace_index == 1


def test_long_tool_output_is_clipped_head_and_tail():
    cfg = ContextBudgetConfig(budget=2000, reserve=32, tool_output_cap=60, max_compactions=0)
    env = make_env(cfg, max_output_chars=3000)
    env.reset(seed=1)
    obs, _, _, _, info = env.step("look")
    content = obs[-1]["content"]
    # the output's length is drawn from the reset seed: seed 1 draws ~800 tokens over the cap
    assert info["clipped_tokens"] > 0, "seed 1 no longer draws an output over the cap: pick a seed that does"
    assert "tokens clipped ..." in content and content.startswith("echo[4] ")
    fmt = env.fmt
    turn = [*fmt.tool.header, *fmt.encode(content), *fmt.tool.footer, *fmt.generation_prompt]
    assert info["prompt_token_ids"][-len(turn):] == turn  # the context ends with exactly the clipped turn
    assert len(fmt.encode(content)) <= cfg.tool_output_cap + 4
    assert f"[... {info['clipped_tokens']} tokens clipped ...]" in content


@pytest.mark.parametrize(
    ("field", "value"),
    [("budget", 0), ("reserve", 0), ("reserve", 5000), ("tool_output_cap", -1), ("max_compactions", -1),
     ("summary_instruction", " "), ("max_summary_tokens", 10_000), ("clip_marker", "no field"),
     ("tool_role", "assistant")],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ContextBudgetConfig(**{field: value})


def test_budget_too_small_is_refused_at_construction_and_reset():
    with pytest.raises(ValueError, match="budget"):
        make_env(ContextBudgetConfig(budget=300, reserve=100, tool_output_cap=100))
    with pytest.raises(ValueError, match="tool_output_cap"):
        make_env(ContextBudgetConfig(budget=2000, tool_output_cap=3))
    env = ContextBudget(EchoEnv(task_words=3000), ContextBudgetConfig(budget=1200, reserve=64), tokenizer=TOK)
    with pytest.raises(ValueError, match="budget"):
        env.reset(seed=0)


def test_bad_actions_raise_clear_errors():
    env = make_env(ContextBudgetConfig())
    env.reset(seed=0)
    with pytest.raises(ValueError, match="at least one"):
        env.step(TokenResponse("", [], None, finished=False))
    with pytest.raises(ValueError, match="token ids must lie"):
        env.step(TokenResponse("x", [len(TOK) + 5]))
    with pytest.raises(ValueError, match="str or TokenResponse"):
        env.step(42)


def test_overlong_token_response_is_cut_to_max_new_tokens():
    cfg = ContextBudgetConfig(reserve=16)
    env = make_env(cfg)
    env.reset(seed=0)
    ids = list(range(100, 140))
    obs, _, _, _, info = env.step(TokenResponse(TOK.decode(ids), ids, [-1.0] * 40))
    assert obs[2]["content"] == TOK.decode(ids[:16])
    prompt = info["prompt_token_ids"]
    start = prompt.index(ids[0])
    assert prompt[start : start + 17] == ids[:16] + [IM_END_ID]  # closed by a forced end-of-turn


def test_step_after_end_requires_reset():
    env = make_env(ContextBudgetConfig())
    with pytest.raises(RuntimeError, match="reset"):
        env.step("x")
    env.reset(seed=0)
    *_, term, _, _ = env.step("SUBMIT")
    assert term
    with pytest.raises(RuntimeError, match="reset"):
        env.step("x")


def test_check_env_passes_on_wrapped_env():
    from gymnasium.utils.env_checker import check_env

    env = make_env(ContextBudgetConfig())
    check_env(env, skip_render_check=True)


def test_other_chat_templates_work_and_non_appending_ones_are_refused():
    tok = load_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}: {{ m['content'] }}<|im_end|>{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant: {% endif %}"
    )
    env = ContextBudget(EchoEnv(), ContextBudgetConfig(budget=900, reserve=40, tool_output_cap=100), tokenizer=tok)
    assert env.fmt.assistant_footer_rest == () and env.fmt.end_of_turn == IM_END_ID
    log = run(env, 5, [Move(kind="str", text="hello"), Move(kind="tokens", ids=(300, 301), stop=True)], max_steps=400)
    for s in log:
        rendered = tok.apply_chat_template(list(s["obs"]), tokenize=False, add_generation_prompt=True)
        assert tok.decode(s["info"]["prompt_token_ids"]) == rendered
    tok.chat_template = "{{ messages[-1]['content'] }}"  # re-renders instead of appending
    with pytest.raises(ValueError, match="tokenizer"):
        ContextBudget(EchoEnv(), tokenizer=tok)


@settings(max_examples=30)
@given(st.integers(500, 900), st.integers(8, 40), st.integers(0, 2**31 - 1))
def test_budget_holds_when_every_response_uses_all_its_tokens(budget, reserve, seed):
    """Worst case for the room kept for a summary: unfinished responses of exactly max_new_tokens ids."""
    cfg = ContextBudgetConfig(budget=budget, reserve=reserve, tool_output_cap=40, max_compactions=4)
    env = make_env(cfg, max_output_chars=90, max_turns=300, task_words=10)
    _, info = env.reset(seed=seed)
    for t in range(400):
        n = info["max_new_tokens"]
        ids = [100 + (t + i) % 500 for i in range(n)]
        _, _, term, trunc, info = env.step(TokenResponse(TOK.decode(ids), ids, finished=False))
        if term or trunc:
            break
        assert len(info["prompt_token_ids"]) + cfg.reserve <= cfg.budget
    assert info["num_compactions"] == 4
