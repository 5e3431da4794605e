"""Training config: presets, validation, JSON round trip, CLI generated from the dataclasses."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactrl.training import cli as train_cli
from compactrl.training import config as C

pytestmark = pytest.mark.timeout(60)


def _parser():
    p = argparse.ArgumentParser()
    train_cli.add_arguments(p)
    return p


@pytest.mark.parametrize("name", sorted(C.PRESETS))
def test_presets_are_valid_and_round_trip_through_json(name):
    cfg = C.preset(name)
    again = C.TrainConfig.from_dict(__import__("json").loads(cfg.to_json()))
    assert again == cfg


def test_every_field_has_a_docstring():
    for name, _tp, _default, doc in C.iter_fields():
        assert doc, f"config field {name} has no docstring"


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"rl.lr": -1.0}, "rl.lr"),
        ({"rl.lmbda": 1.5}, "rl.lmbda"),
        ({"rl.algo": "sac"}, "rl.algo"),
        ({"rl.boundary": "other"}, "rl.boundary"),
        ({"rl.truncation": "ignore"}, "rl.truncation"),
        ({"sft.summary_quality": 2.0}, "sft.summary_quality"),
        ({"env.context_budget.reserve": 5000}, "env.context_budget.reserve"),
        ({"env.context_budget.budget": 0}, "env.context_budget.budget"),
        ({"rl.ppo.clip_eps_low": 2.0}, "rl.ppo.clip_eps_low"),
        ({"rl.grpo.eps": -1.0}, "rl.grpo.eps"),
        ({"rl.lmbda": "sometimes"}, "rl.lmbda"),
        ({"rl.value_lmbda": 2.0}, "rl.value_lmbda"),
        ({"env.env_kwargs": '{"budget": 3}'}, "env.env_kwargs"),
        ({"env.context_budget": 3}, "env.context_budget"),
        ({"env.env_kwargs": "[1]"}, "env.env_kwargs"),
        ({"env.env_kwargs": "{bad json"}, "env.env_kwargs"),
        ({"rl.algo": "grpo", "rl.group_size": 3, "rl.episodes_per_iter": 32}, "rl.episodes_per_iter"),
        ({"eval.temperature": -1.0}, "eval.temperature"),
        ({"threads": 0}, "threads"),
        ({"rl.nope": 1}, "rl.nope"),
        ({"nosection.x": 1}, "nosection.x"),
    ],
)
def test_bad_values_raise_value_error_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        C.override(C.preset("main"), changes)


def test_unknown_fields_in_a_stored_config_are_rejected():
    raw = C.preset("smoke").to_dict()
    raw["rl"]["typo"] = 3
    with pytest.raises(ValueError, match="typo"):
        C.TrainConfig.from_dict(raw)


def test_cli_has_one_option_per_field_with_its_docstring_as_help():
    help_text = _parser().format_help()
    for name, _tp, _default, _doc in C.iter_fields():
        assert f"--{name}" in help_text
    assert "GAE lambda" in help_text and "--no-rl.whiten_advantages" in help_text
    assert "--env.context_budget.max_summary_tokens INT|none" in help_text


def test_cli_overrides_apply_on_top_of_the_preset():
    args = _parser().parse_args(["--preset", "smoke", "--algo", "grpo", "--rl.lr", "0.01",
                                 "--no-sft.enabled", "--rl.boundary", "cut", "--env.num_envs", "3"])
    cfg = train_cli.config_from_args(args)
    smoke = C.preset("smoke")
    assert cfg.rl.algo == "grpo" and cfg.rl.lr == 0.01 and cfg.rl.boundary == "cut"
    assert cfg.sft.enabled is False and cfg.env.num_envs == 3
    assert cfg.rl.iterations == smoke.rl.iterations  # untouched fields keep the preset's values


def test_cli_rejects_invalid_choice():
    with pytest.raises(SystemExit):
        _parser().parse_args(["--rl.boundary", "sideways"])


@given(lr=st.floats(1e-6, 1.0), lmbda=st.floats(0.0, 1.0), iters=st.integers(0, 1000))
def test_property_valid_overrides_are_applied_exactly(lr, lmbda, iters):
    cfg = C.override(C.preset("main"), {"rl.lr": lr, "rl.lmbda": lmbda, "rl.iterations": iters})
    assert (cfg.rl.lr, cfg.rl.lmbda, cfg.rl.iterations) == (lr, lmbda, iters)
    assert dataclasses.replace(cfg.rl, lr=C.preset("main").rl.lr, lmbda=C.preset("main").rl.lmbda,
                               iterations=C.preset("main").rl.iterations) == C.preset("main").rl


def test_cli_parses_nested_optional_and_literal_union_fields():
    args = _parser().parse_args(["--preset", "smoke", "--env.context_budget.budget", "700",
                                 "--env.context_budget.max_summary_tokens", "12", "--rl.ppo.value_clip_eps", "none",
                                 "--rl.lmbda", "adaptive", "--rl.lmbda_alpha", "2", "--rl.value_lmbda", "0.9",
                                 "--rl.grpo.scale_by_std", "--no-rl.ppo.train_summaries"])
    cfg = train_cli.config_from_args(args)
    assert cfg.env.context_budget.budget == 700 and cfg.env.context_budget.max_summary_tokens == 12
    assert cfg.rl.ppo.value_clip_eps is None and cfg.rl.lmbda == "adaptive" and cfg.rl.lmbda_alpha == 2.0
    assert cfg.rl.value_lmbda == 0.9 and cfg.rl.ppo.train_summaries is False
    cfg = train_cli.config_from_args(_parser().parse_args(["--rl.lmbda", "0.5"]))
    assert cfg.rl.lmbda == 0.5


@pytest.mark.parametrize("argv, option, allowed", [
    (["--rl.boundary", "sideways"], "--rl.boundary", "'bootstrap', 'cut'"),
    (["--env.difficulty", "bogus"], "--env.difficulty", "'tiny', 'easy', 'default', 'hard'"),
    (["--rl.lmbda", "often"], "--rl.lmbda", "adaptive"),
])
def test_a_bad_cli_value_is_one_line_naming_the_option_and_the_allowed_values(argv, option, allowed, capsys):
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and option in err and allowed in err, err


def test_the_compactionrl_preset_is_the_reference_recipe():
    """gamma 1, adaptive lambda 1 - 1/(1.5 l), value lambda 1, 50 critic pre-training steps on fresh
    rollouts, 2 critic updates per policy update, GAE across trace boundaries; the RLConfig defaults."""
    cfg = C.preset("compactionrl")
    rl = cfg.rl
    assert (rl.gamma, rl.lmbda, rl.lmbda_alpha, rl.value_lmbda) == (1.0, "adaptive", 1.5, 1.0)
    assert (rl.critic_pretrain_steps, rl.critic_updates, rl.boundary, rl.algo) == (50, 2, "bootstrap", "ppo")
    assert rl.critic_lr != rl.lr and cfg.model.critic_head_init == 0.0
    assert rl == C.RLConfig()
    main = C.preset("main")
    assert (cfg.env, cfg.model, cfg.sft, cfg.eval) == (main.env, main.model, main.sft, main.eval)


def test_the_main_preset_is_the_reference_recipe_over_four_iterations_and_evaluates_every_two():
    main = C.preset("main")
    assert main.rl == dataclasses.replace(C.RLConfig(), iterations=4)
    assert (main.rl.boundary, main.rl.lmbda, main.rl.value_lmbda) == ("bootstrap", "adaptive", 1.0)
    assert main.eval.every == 2
    ctx = main.env.context_budget
    assert (ctx.budget, ctx.reserve, ctx.tool_output_cap, ctx.max_compactions) == (860, 64, 192, 4)
