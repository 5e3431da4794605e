"""Helpers shared by the emulated commands: GNU option parsing, reading inputs, line splitting."""

from __future__ import annotations

from dataclasses import dataclass

from compactrl.shell_sim.fs import FsError, quote_shell
from compactrl.shell_sim.shell import IO, Shell, UsageError

__all__ = ["IO", "Opts", "Shell", "UsageError", "getopt", "read_input", "split_lines", "join_lines"]


@dataclass
class Opts:
    """Parsed options in order (flag, value) plus the operands."""

    flags: list[tuple[str, str | None]]
    operands: list[str]

    def has(self, flag: str) -> bool:
        return any(f == flag for f, _ in self.flags)

    def last(self, flag: str, default: str | None = None) -> str | None:
        vals = [v for f, v in self.flags if f == flag]
        return vals[-1] if vals else default

    def all(self, flag: str) -> list[str]:
        return [v or "" for f, v in self.flags if f == flag]


def getopt(name: str, args: list[str], spec: str, io: IO, *, long: dict[str, str] | None = None,
           code: int = 1, usage: str = "", permute: bool = True, help_text: str | None = None) -> Opts:
    """GNU ``getopt_long``: clustered short flags, ``-xVALUE``/``-x VALUE``, ``--`` and permutation.

    ``spec`` lists short flags, a ``:`` after one that takes a value. ``long`` maps long option
    names (``"name"`` or ``"name="`` when it takes a value) to the short flag they mean. On a bad
    option the message is followed by ``usage`` and "Try '... --help'", or by the whole
    ``help_text`` for tools that print their full usage (sed).
    """
    fail_usage = (usage, help_text)
    takes = {c for i, c in enumerate(spec) if c != ":" and spec[i + 1:i + 2] == ":"}
    flags, operands = [], []
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if a == "--":
            operands.extend(args[i:])
            break
        if a.startswith("--") and long is not None:
            i = _long_option(name, a, args, i, long, flags, io, code, fail_usage)
            continue
        if not a.startswith("-") or a == "-":
            operands.append(a)
            if not permute:
                operands.extend(args[i:])
                break
            continue
        k = 1
        while k < len(a):
            c = a[k]
            if c not in spec or c == ":":
                _fail(name, f"invalid option -- '{c}'", io, code, fail_usage)
            if c in takes:
                value = a[k + 1:]
                if not value:
                    if i >= len(args):
                        _fail(name, f"option requires an argument -- '{c}'", io, code, fail_usage)
                    value = args[i]
                    i += 1
                flags.append((c, value))
                break
            flags.append((c, None))
            k += 1
    return Opts(flags, operands)


def _long_option(name, a, args, i, long, flags, io, code, usage) -> int:
    body, eq, value = a[2:].partition("=")
    matches = [k for k in long if k.rstrip("=") == body] or [k for k in long if k.startswith(body)]
    if len({long[m] for m in matches}) != 1:
        what = "unrecognized option" if not matches else "option is ambiguous;"
        _fail(name, f"{what} '{a}'" if not matches else f"option '{a}' is ambiguous", io, code, usage)
    key = matches[0]
    if key.endswith("="):
        if not eq:
            if i >= len(args):
                _fail(name, f"option '--{key.rstrip('=')}' requires an argument", io, code, usage)
            value = args[i]
            i += 1
        flags.append((long[key], value))
    else:
        if eq:
            _fail(name, f"option '--{key}' doesn't allow an argument", io, code, usage)
        flags.append((long[key], None))
    return i


def _fail(name: str, msg: str, io: IO, code: int, usage: tuple[str, str | None]) -> None:
    short, full = usage
    io.err.write(f"{name}: {msg}\n")
    if full is not None:
        io.err.write(full)
        raise UsageError(code)
    if short:
        io.err.write(short + "\n")
    io.err.write(f"Try '{name} --help' for more information.\n")
    raise UsageError(code)


def read_input(sh: Shell, io: IO, path: str) -> str:
    """Contents of an operand (``-`` is standard input); raises :class:`FsError`."""
    if path == "-":
        return io.stdin
    return sh.fs.read(sh.resolve(path))


def split_lines(text: str) -> list[str]:
    """Lines without their newline; a final unterminated line counts as a line."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def join_lines(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def missing(name: str, path: str, exc: FsError, io: IO) -> None:
    """``name: path: strerror`` with the file name quoted as GNU's ``quotef`` does."""
    io.err.write(f"{name}: {quote_shell(path, always=False)}: {exc.strerror}\n")


def parse_int(text: str) -> int | None:
    t = text.strip(" \t")
    if t[:1] in "+-":
        sign, t = t[0], t[1:]
    else:
        sign = ""
    if not t.isdigit() or not t.isascii():
        return None
    return int(sign + t)
