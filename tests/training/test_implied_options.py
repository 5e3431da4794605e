"""A train option that turns a feature on picks a working value for what the feature needs, and says so."""

from __future__ import annotations

import argparse

from compactrl.training import cli as train_cli


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    return parser.parse_args(["--preset", "smoke", *argv])


def test_a_black_box_source_picks_the_local_sandbox_and_says_so(capsys):
    args = _args("--rollout.source", "mini_swe_agent")
    cfg = train_cli.config_from_args(args)
    assert (cfg.rollout.source, cfg.env.backend) == ("mini_swe_agent", "local")
    train_cli._say_implied(args)
    assert capsys.readouterr().out == ("compactrl train: env.backend=local (rollout.source=mini_swe_agent runs the "
                                       "agent's commands in a real sandbox; set --env.backend to choose)\n")


def test_a_given_value_is_kept_and_nothing_is_said(capsys):
    args = _args("--rollout.source", "mini_swe_agent", "--env.backend", "docker")
    assert train_cli.config_from_args(args).env.backend == "docker"
    train_cli._say_implied(args)
    assert capsys.readouterr().out == ""
    assert train_cli.config_from_args(_args()).env.backend == "sim"  # the env source needs no sandbox
