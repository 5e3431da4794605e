"""The SFT demonstrators: imitable choices, and summaries whose quality decides the outcome."""

from __future__ import annotations

import re

import pytest

from compactrl.policies.scripted.demonstrators import ReadingOrderOracle
from compactrl.training.config import preset
from compactrl.training.rollouts import make_env_fns
from compactrl.types import PolicyRequest

BUDGET = 860  # the main preset's: the first summary falls between reading the fact and fixing


def play(policy, seed: int, budget: int = BUDGET):
    env = make_env_fns(preset("main").env, split="train", count=1, budget=budget)[0]()
    obs, info = env.reset(seed=seed)
    turns, done, reward = [], False, 0.0
    while not done:
        req = PolicyRequest(obs, info["prompt_token_ids"], info["max_new_tokens"], info["compaction_required"],
                            task=env.unwrapped.task)
        text = policy.act([req])[0]
        turns.append((info["compaction_required"], text))
        obs, reward, terminated, truncated, info = env.step(text)
        done = terminated or truncated
    return env.unwrapped.task, turns, reward, truncated


def first_summary(turns):
    return next(text for summary, text in turns if summary)


@pytest.mark.parametrize("reproduce_first", [False, True])
def test_a_perfect_summariser_solves_every_task(reproduce_first):
    policy = ReadingOrderOracle(summary_quality=1.0, seed=0, reproduce_first=reproduce_first)
    for seed in range(12):
        _, turns, reward, truncated = play(policy, seed)
        assert reward == 1.0 and not truncated, turns


def test_reproduce_first_tests_before_fixing_and_states_the_fix():
    task, turns, _, _ = play(ReadingOrderOracle(summary_quality=1.0, seed=0, reproduce_first=True), seed=3)
    actions = [text for summary, text in turns if not summary]
    fact = task.metadata["facts"][0]
    first_test = next(i for i, a in enumerate(actions) if a.endswith("<tool>test</tool>"))
    first_replace = next(i for i, a in enumerate(actions) if "<tool>replace" in a)
    assert first_test < first_replace
    assert f"then fix {fact['key']} = {fact['value']!r} in {task.metadata['bug_file']}" in actions[first_test]


def test_a_summary_that_drops_the_fact_leaves_no_trace_of_its_value_and_the_run_fails():
    """The value survives a summary only in its facts line: a dropped fact is gone from the plan too."""
    policy = ReadingOrderOracle(summary_quality=0.0, seed=0, reproduce_first=True)
    checked = 0
    for seed in range(12):
        task, turns, reward, _ = play(policy, seed)
        fact, fix = task.metadata["facts"][0], task.metadata["fix"][0]
        summary = first_summary(turns)
        if "then fix" not in turns[turns.index((True, summary)) - 1][1]:
            continue  # the compaction fell elsewhere (before the bug file was seen)
        checked += 1
        assert re.search(rf"\b{fact['key']} = ", summary) is None, summary
        assert f"next: fix {fact['key']} in {fix['file']}" in summary
        assert reward == 0.0
    assert checked >= 8


def test_a_kept_fact_is_enough_to_fix_without_reading_the_files_again():
    policy = ReadingOrderOracle(summary_quality=1.0, seed=0, reproduce_first=True)
    task, turns, reward, _ = play(policy, seed=3)
    fact, fix = task.metadata["facts"][0], task.metadata["fix"][0]
    summary = first_summary(turns)
    assert f"\n{fact['key']} = {fact['value']!r}\n" in summary
    assert f"next: replace {fix['old'].strip()} in {fix['file']}" in summary
    after = [text for summary_turn, text in turns[turns.index((True, summary)) + 1:] if not summary_turn]
    assert "<tool>replace" in after[0] and not any("<tool>view" in a for a in after)
    assert reward == 1.0


def test_demonstrator_success_follows_summary_quality():
    """At the main budget the demonstrator's success is its summary quality (+ the few late compactions)."""
    rates = {}
    for quality in (0.0, 0.5, 1.0):
        policy = ReadingOrderOracle(summary_quality=quality, seed=1, reproduce_first=True)
        rates[quality] = sum(play(policy, seed)[2] for seed in range(60)) / 60
    assert rates[0.0] <= 0.2 and rates[1.0] == 1.0
    assert 0.35 <= rates[0.5] <= 0.75


def test_the_main_preset_warm_starts_in_two_phases_with_their_own_demonstrator_and_budget():
    """Phase 1 (``sft.demonstrator`` at ``sft.budget``) and phase 2 (``sft.second_demonstrator`` at the
    training budget) collect different demonstrations; only the second runs the tests before fixing."""
    from compactrl.tokenizer import load_tokenizer
    from compactrl.training.config import override, preset
    from compactrl.training.trainer import collect_demonstrations

    cfg = override(preset("main"), {"sft.demo_episodes": 8, "env.num_envs": 4})
    assert cfg.sft.budget != cfg.env.context_budget.budget and cfg.sft.second_demonstrator == "reproduce_first"
    tok = load_tokenizer()

    def texts(second: bool) -> list[str]:
        demos, stats = collect_demonstrations(cfg, pad_id=0, second=second)
        assert stats["episodes"] == 8
        return [tok.decode(row[mask.bool()].tolist()) for row, mask in zip(demos["tokens"], demos["attention_mask"])]

    first, second = texts(False), texts(True)
    assert not any("Next: run the tests, then fix" in t for t in first)
    assert sum("Next: run the tests, then fix" in t for t in second) >= 4
    with pytest.raises(ValueError, match="sft.second_demonstrator"):
        override(preset("main"), {"sft.second_demonstrator": "nobody"})


def test_a_second_phase_alone_continues_a_pretrained_model(tmp_path):
    """``sft.copy_steps = sft.steps = 0`` with a second phase: only the second phase's demonstrations
    are collected and trained on (a saved SFT model continued on another regime's episodes), and
    the run saves its ``sft_model``; with no step in any phase there is no SFT at all."""
    import json

    from compactrl.training.config import override, preset
    from compactrl.training.trainer import train

    base = override(preset("smoke"), {"rl.iterations": 0, "rl.critic_pretrain_steps": 0, "eval.initial": False})
    train(base, tmp_path / "first")
    cfg = override(base, {"model.pretrained": str(tmp_path / "first" / "sft_model"), "sft.copy_steps": 0,
                          "sft.steps": 0, "sft.second_steps": 2})
    assert cfg.sft.total_steps == 2
    train(cfg, tmp_path / "second")
    row = json.loads((tmp_path / "second" / "metrics.jsonl").read_text().splitlines()[0])
    assert "sft/second_final_nll" in row and "sft/final_nll" not in row and row["time/sft_demos_s"] == 0.0
    assert (tmp_path / "second" / "sft_model" / "model.safetensors").exists()
    none = override(cfg, {"sft.second_demonstrator": "none"})
    assert none.sft.total_steps == 0
    train(none, tmp_path / "none")
    row = json.loads((tmp_path / "none" / "metrics.jsonl").read_text().splitlines()[0])
    assert not any(k.startswith("sft/") for k in row) and not (tmp_path / "none" / "sft_model").exists()


# sha256 (first 16 hex digits) of the JSON list of every response, over task seeds 0-7 of the main
# preset's env (demonstrator seed 7), recorded from the demonstrator as it was before it moved
# from compactrl.training.sft to compactrl.policies.scripted.demonstrators as an OraclePolicy subclass
RECORDED = {
    ("reading_order", 0.5, 860): "cf2737ee6b6ad1f7", ("reading_order", 1.0, 860): "6a1f099c6c1774c0",
    ("reproduce_first", 0.5, 860): "b505b1928b5721bb", ("reproduce_first", 1.0, 860): "4ebbbb0489d6613e",
    ("reproduce_first", 0.5, 896): "463ccb909b27ce8d", ("reproduce_first", 1.0, 896): "9c55820430dc4ba7",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind, quality, budget", sorted(RECORDED))
def test_demonstrated_episodes_are_the_recorded_ones(kind, quality, budget):
    import hashlib
    import json

    from compactrl.training.trainer import make_demonstrator

    digest = hashlib.sha256()
    for seed in range(8):
        _, turns, _, _ = play(make_demonstrator(kind, quality, 7), seed, budget)
        digest.update(json.dumps([text for _, text in turns]).encode())
    assert digest.hexdigest()[:16] == RECORDED[kind, quality, budget]
