"""``compactrl`` command line: ``train | eval | serve | bench``.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``;
this file only dispatches, so the modules stay importable without the CLI and import lazily
(``compactrl serve`` does not pay for the trainer's imports).

A bad value is one line on stderr, ``compactrl <cmd>: error: ...`` naming the option (and the
allowed values where there is a list), and exit code 2: argparse's own checks, and any
``ValueError`` a subcommand raises while validating its configuration.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

SUBCOMMANDS = {
    "train": ("compactrl.training.cli", "train a policy (SFT warm start, then PPO or GRPO)"),
    "eval": ("compactrl.eval.cli", "evaluate a policy (scripted, a saved model, a server) on an env or a task set"),
    "serve": ("compactrl.serving.cli", "serve a local Hugging Face model over an OpenAI-compatible API"),
    "gateway": ("compactrl.gateway.app", "OpenAI-compatible chat gateway that records black-box agents' calls"),
    "bench": ("compactrl.bench", "run a benchmark script from benchmarks/"),
    "tasks": ("compactrl.cli_tasks", "prepare task sets: SWE-bench rows' environments and work trees"),
}

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

USAGE_ERROR = 2


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (``prog: error: message``), exit code 2."""

    def error(self, message: str):
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser | None]:
    parser = OneLineParser(prog="compactrl", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="WARNING", type=str.upper, choices=LOG_LEVELS,
                        help="logging level (default: WARNING)")
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    chosen_parser = None
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # import only the module that runs
            importlib.import_module(module).add_arguments(p)
            chosen_parser = p
    return parser, chosen_parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser, chosen = build_parser(argv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except ValueError as exc:  # a bad configuration: say which, without a traceback
        (chosen or parser).error(str(exc))
        return USAGE_ERROR  # not reached: error() exits


if __name__ == "__main__":
    sys.exit(main())
