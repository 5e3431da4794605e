"""Training config: presets, validation, JSON round trip, CLI generated from the dataclasses."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactrl.algos import config as C
from compactrl.algos import train_cli

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
        ({"env.max_new_tokens": 5000}, "env.max_new_tokens"),
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
