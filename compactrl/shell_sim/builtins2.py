"""Bash builtins of the shell language: read, local, set, shift, return, break, continue, let,
eval, source/., command, type, declare."""

from __future__ import annotations

import re

from compactrl.shell_sim.builtins import assign_words
from compactrl.shell_sim.fs import FsError
from compactrl.shell_sim.parser import parse
from compactrl.shell_sim.shell import (
    _DEFAULT_IFS,
    IO,
    AbortCommand,
    LoopControl,
    ReturnFromFunction,
    Shell,
)

_IFS_WS = " \t\n"


def _loop_control(kind: str):
    def cmd(sh: Shell, args: list[str], io: IO) -> int:
        if sh.loop_depth == 0:
            sh.shell_error(io.err, f"{kind}: only meaningful in a `for', `while', or `until' loop")
            return 0
        levels = 1
        if args:
            if not re.fullmatch(r"-?\d+", args[0]):
                sh.shell_error(io.err, f"{kind}: {args[0]}: numeric argument required")
                raise LoopControl("break", sh.loop_depth)
            levels = int(args[0])
            if levels < 1:
                sh.shell_error(io.err, f"{kind}: {args[0]}: loop count out of range")
                return 1
        raise LoopControl(kind, min(levels, sh.loop_depth))
    return cmd


def cmd_return(sh: Shell, args: list[str], io: IO) -> int:
    if not sh.scopes:
        sh.shell_error(io.err, "return: can only `return' from a function or sourced script")
        return 1
    if args and not re.fullmatch(r"[+-]?\d+", args[0]):
        sh.shell_error(io.err, f"return: {args[0]}: numeric argument required")
        raise ReturnFromFunction(2)
    raise ReturnFromFunction(int(args[0]) & 255 if args else sh.status)


def cmd_local(sh: Shell, args: list[str], io: IO) -> int:
    if not sh.scopes:
        sh.shell_error(io.err, "local: can only be used in a function")
        return 1
    status = 0
    for a in args:
        if a.startswith("-"):
            continue
        name, eq, value = a.partition("=")
        if not name.isidentifier():
            sh.shell_error(io.err, f"local: `{a}': not a valid identifier")
            status = 1
            continue
        scope = sh.scopes[-1]
        if name not in scope:
            scope[name] = sh.vars.get(name)
        if eq:
            sh.vars[name] = value
        elif scope[name] is None:
            sh.vars.pop(name, None)
    return status


def cmd_declare(sh: Shell, args: list[str], io: IO) -> int:
    flags = "".join(a[1:] for a in args if a.startswith("-"))
    if set(flags) - set("rxgi"):
        sh.shell_error(io.err, f"declare: sim-shell: unsupported options -{flags}")
        return 2
    names = [a for a in args if not a.startswith("-")]
    if sh.scopes and "g" not in flags and "x" not in flags:
        return cmd_local(sh, names, io)
    return assign_words(sh, names, io, "declare", export="x" in flags)


_SET_OPTIONS = {"e": "errexit", "u": "nounset"}


def cmd_set(sh: Shell, args: list[str], io: IO) -> int:
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if a == "--":
            sh.positional = args[i:]
            return 0
        if a in ("-o", "+o"):
            if i >= len(args) or args[i] not in ("errexit", "nounset", "pipefail"):
                sh.shell_error(io.err, f"set: {args[i] if i < len(args) else ''}: sim-shell: unsupported option")
                return 2
            (sh.options.add if a == "-o" else sh.options.discard)(args[i])
            i += 1
            continue
        if a[:1] not in "-+" or len(a) < 2:
            sh.positional = args[i - 1:]
            return 0
        for c in a[1:]:
            if c == "o":  # -euo pipefail: the option name is the next argument
                if i >= len(args) or args[i] not in ("errexit", "nounset", "pipefail"):
                    sh.shell_error(io.err, f"set: {args[i] if i < len(args) else ''}: sim-shell: unsupported option")
                    return 2
                (sh.options.add if a[0] == "-" else sh.options.discard)(args[i])
                i += 1
                continue
            if c not in _SET_OPTIONS:
                if c == "x":
                    sh.shell_error(io.err, "set: -x: sim-shell: unsupported option")
                    return 2
                sh.shell_error(io.err, f"set: {a[0]}{c}: invalid option")
                return 2
            (sh.options.add if a[0] == "-" else sh.options.discard)(_SET_OPTIONS[c])
    return 0


def cmd_shift(sh: Shell, args: list[str], io: IO) -> int:
    n = int(args[0]) if args and args[0].isdigit() else 1
    if n > len(sh.positional):
        return 1
    sh.positional = sh.positional[n:]
    return 0


def cmd_let(sh: Shell, args: list[str], io: IO) -> int:
    if not args:
        sh.shell_error(io.err, "let: expression expected")
        return 1
    value = 0
    for a in args:
        try:
            value = sh.arith(a, io.err, "let: ")
        except AbortCommand:
            return 1
    return 0 if value else 1


def cmd_eval(sh: Shell, args: list[str], io: IO) -> int:
    return _run_source(sh, " ".join(args), io, "eval")


def cmd_source(sh: Shell, args: list[str], io: IO) -> int:
    if not args:
        sh.shell_error(io.err, "source: filename argument required")
        return 2
    try:
        text = sh.fs.read(sh.resolve(args[0]))
    except FsError as exc:
        sh.shell_error(io.err, f"{args[0]}: {exc.strerror}")
        return 1
    return _run_source(sh, text, io, args[0])


def _run_source(sh: Shell, src: str, io: IO, what: str) -> int:
    result, _ = parse(src)
    status = 0
    for group in result.groups:
        status = sh.run_list(group, io.stream, io.out, io.err)
    if result.error is not None:
        sh.report_parse_error(result.error, io.err, prefix=f"bash: {what}: line {getattr(result.error, 'line', 1)}: ")
        return 2
    return status


def cmd_command(sh: Shell, args: list[str], io: IO) -> int:
    if args[:1] in (["-v"], ["-V"]):
        return cmd_type(sh, args[1:], io, short=args[0] == "-v")
    return sh.call(args[0], args[1:], io, functions=False) if args else 0


def cmd_type(sh: Shell, args: list[str], io: IO, short: bool = False) -> int:
    from compactrl.shell_sim.builtins import BUILTINS

    status = 0
    for name in args:
        if name in sh.functions:
            io.out.write(name + "\n" if short else f"{name} is a function\n")
        elif name in BUILTINS or name in _BUILTINS2:
            io.out.write(name + "\n" if short else f"{name} is a shell builtin\n")
        elif name in sh.commands:
            io.out.write(f"/usr/bin/{name}\n" if short else f"{name} is /usr/bin/{name}\n")
        else:
            if not short:
                sh.shell_error(io.err, f"type: {name}: not found")
            status = 1
    return status


# ===================================================================== read
def cmd_read(sh: Shell, args: list[str], io: IO) -> int:
    raw, delim, names, nchars = False, "\n", [], None
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if a == "-r":
            raw = True
        elif a in ("-p", "-t", "-u") and i < len(args):
            i += 1  # prompt (only shown on a terminal), timeout, fd: nothing to do here
        elif a == "-d" and i < len(args):
            delim, i = args[i][:1] or "\0", i + 1
        elif a == "-n" and i < len(args):
            nchars, i = int(args[i]) if args[i].isdigit() else None, i + 1
        elif a in ("-s", "-e"):
            pass
        elif a.startswith("-") and a != "-":
            sh.shell_error(io.err, f"read: {a}: invalid option")
            io.err.write("read: usage: read [-ers] [-a array] [-d delim] [-i text] [-n nchars] [-N nchars] "
                         "[-p prompt] [-t timeout] [-u fd] [name ...]\n")
            return 2
        else:
            names.append(a)
    line, found = _read_record(io, delim, raw, nchars)
    if not found and line == "":
        for name in names or ["REPLY"]:
            sh.vars[name] = ""
        return 1
    _assign_fields(sh, names, line, raw)
    return 0 if found else 1


def _read_record(io: IO, delim: str, raw: bool, nchars: int | None) -> tuple[str, bool]:
    stream = io.stream
    if nchars is not None:
        chunk = stream.text[stream.pos:stream.pos + nchars]
        cut = chunk.find(delim)
        if cut >= 0:
            chunk = chunk[:cut]
            stream.pos += cut + 1
            return chunk, True
        stream.pos += len(chunk)
        return chunk, len(chunk) == nchars
    pieces = []
    while True:
        chunk, found = stream.read_until(delim)
        if not raw and found and delim == "\n" and _odd_backslashes(chunk):
            pieces.append(chunk[:-1])  # a backslash-newline continues the line
            continue
        pieces.append(chunk)
        return "".join(pieces), found


def _odd_backslashes(text: str) -> bool:
    n = len(text) - len(text.rstrip("\\"))
    return n % 2 == 1


def _assign_fields(sh: Shell, names: list[str], line: str, raw: bool) -> None:
    ifs = sh.vars.get("IFS", _DEFAULT_IFS)
    if not names:
        sh.vars["REPLY"] = line if raw else _unescape(line)
        return
    ws = "".join(c for c in ifs if c in _IFS_WS)
    rest = line.strip(ws) if ws else line
    for k, name in enumerate(names):
        if k == len(names) - 1:
            value = rest
            if ifs and rest and rest[-1] in ifs and rest[-1] not in _IFS_WS and _count_fields(rest, ifs) == 1:
                value = rest[:-1]
            sh.vars[name] = value if raw else _unescape(value)
            return
        field, rest = _next_field(rest, ifs, ws, raw)
        sh.vars[name] = field if raw else _unescape(field)


def _next_field(text: str, ifs: str, ws: str, raw: bool) -> tuple[str, str]:
    i = 0
    while i < len(text) and text[i] not in ifs:
        i += 2 if not raw and text[i] == "\\" else 1
    field, rest = text[:i], text[i:]
    if rest:  # one separator: IFS white space around at most one other IFS character
        rest = rest.lstrip(ws) if ws else rest
        if rest and rest[0] in ifs and rest[0] not in _IFS_WS:
            rest = rest[1:]
        rest = rest.lstrip(ws) if ws else rest
    return field, rest


def _count_fields(text: str, ifs: str) -> int:
    return len([f for f in re.split("[" + re.escape(ifs) + "]", text) if f]) or 1


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text, flags=re.DOTALL)


_BUILTINS2 = {
    "read": cmd_read, "local": cmd_local, "declare": cmd_declare, "typeset": cmd_declare, "set": cmd_set,
    "shift": cmd_shift, "return": cmd_return, "break": _loop_control("break"),
    "continue": _loop_control("continue"), "let": cmd_let, "eval": cmd_eval, "source": cmd_source,
    ".": cmd_source, "command": cmd_command, "type": cmd_type,
}
BUILTINS2 = _BUILTINS2
"""The shell-language builtins, merged into the emulator's command table."""
