"""Which command-line option applies when: every option either applies or is refused, never ignored.

Each subcommand keeps a table ``{dest: Applies(when, test)}``: the option applies where ``test(context)``
holds (``test=None``: always). :func:`refuse_ignored` raises ``ValueError`` naming the first option
the command line gave where it would not apply, and the CLI prints it as one line with exit code 2::

    compactrl eval: error: --summary-quality applies only with --policy oracle (got --policy random)

Whether an option was *given* (not left at its default) is recorded while argparse parses:
:func:`track_given` makes each optional action also note its ``dest`` in the namespace, and
:func:`given` reads that set back. Defaults stay real values, so code that reads ``args.x`` (and
parsers built without the CLI, as in tests) is unchanged.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GIVEN = "_given_options"
"""Namespace attribute holding the ``dest`` of every option the command line gave."""


@dataclass(frozen=True)
class Applies:
    """Where an option applies."""

    when: str
    """Said after "applies only" when it is refused, e.g. ``"with --tasks"``."""
    test: Callable[[Any], bool] | None = None
    """Whether it applies, given the subcommand's context (None: always)."""
    got: Callable[[Any], str] | None = None
    """What the command line has instead, said in parentheses (e.g. ``"got --policy random"``)."""


ALWAYS = Applies("always")


_TRACKING: dict[type, type] = {}


def _tracking_class(cls: type) -> type:
    if cls not in _TRACKING:
        def __call__(self, parser, namespace, values, option_string=None):
            setattr(namespace, GIVEN, {*(getattr(namespace, GIVEN, None) or ()), self.dest})
            return cls.__call__(self, parser, namespace, values, option_string)

        _TRACKING[cls] = type(cls.__name__, (cls,), {"__call__": __call__})
    return _TRACKING[cls]


def track_given(parser: argparse.ArgumentParser) -> None:
    """Make every optional action of ``parser`` record its ``dest`` when the command line gives it
    (argparse calls an action only for what was given; defaults are set without it)."""
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction):
            action.__class__ = _tracking_class(type(action))


def given(args: argparse.Namespace) -> frozenset[str]:
    """The ``dest`` of every option the command line gave (empty for a namespace built by hand)."""
    return frozenset(getattr(args, GIVEN, None) or ())


def option_name(parser: argparse.ArgumentParser, dest: str) -> str:
    """The long option string of ``dest`` (``--max-turns``)."""
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return max(action.option_strings, key=len)
    return "--" + dest.replace("_", "-")


def refuse_ignored(args: argparse.Namespace, table: Mapping[str, Applies], context: Any,
                   names: Callable[[str], str] | None = None) -> None:
    """``ValueError`` naming the first given option of ``table`` that would not apply in ``context``."""
    names = names or (lambda dest: "--" + dest.replace("_", "-"))
    for dest in sorted(given(args) & set(table)):
        rule = table[dest]
        if rule.test is not None and not rule.test(context):
            got = f" ({rule.got(context)})" if rule.got else ""
            raise ValueError(f"{names(dest)} applies only {rule.when}{got}")


def undecided(parser: argparse.ArgumentParser, table: Mapping[str, Applies],
              patterns: Iterable[str] = ()) -> list[str]:
    """Options of ``parser`` that ``table`` does not decide (``patterns``: dest prefixes decided
    as a whole, e.g. the trainer's ``cfg:`` fields). A test keeps this empty."""
    return [max(a.option_strings, key=len) for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)
            and a.dest not in table and not any(a.dest.startswith(p) for p in patterns)]
