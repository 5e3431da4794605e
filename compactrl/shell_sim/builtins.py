"""Bash builtins: cd, pwd, echo, printf, test/[, true, false, :, exit, export, unset."""

from __future__ import annotations

import re

from compactrl.shell_sim.fs import ENOENT, ENOTDIR
from compactrl.shell_sim.shell import IO, ExitShell, Shell


def cmd_true(sh: Shell, args: list[str], io: IO) -> int:
    return 0


def cmd_false(sh: Shell, args: list[str], io: IO) -> int:
    return 1


def cmd_pwd(sh: Shell, args: list[str], io: IO) -> int:
    io.out.write(sh.pwd() + "\n")
    return 0


def cmd_cd(sh: Shell, args: list[str], io: IO) -> int:
    if args and args[0] == "--":
        args = args[1:]
    if len(args) > 1:
        sh.shell_error(io.err, "cd: too many arguments")
        return 1
    target = args[0] if args else sh.vars.get("HOME", sh.fs.root)
    print_dir = False
    if target == "-":
        target, print_dir = sh.vars.get("OLDPWD", ""), True
        if not target:
            sh.shell_error(io.err, "cd: OLDPWD not set")
            return 1
    if target == "":
        return 0
    r = sh.resolve(target)
    if not sh.fs.is_dir(r):
        reason = ENOTDIR if sh.fs.is_file(r) else sh.fs.lookup_error(r)
        sh.shell_error(io.err, f"cd: {target}: {reason or ENOENT}")
        return 1
    if r.outside:
        sh.shell_error(io.err, f"cd: {target}: sim-shell: only the work dir and /tmp exist")
        return 1
    sh.vars["OLDPWD"] = sh.pwd()
    sh.cwd = sh.fs.abs_of(r)
    sh.vars["PWD"] = sh.pwd()
    sh.exported.update(("OLDPWD", "PWD"))
    if print_dir:
        io.out.write(sh.pwd() + "\n")
    return 0


def cmd_exit(sh: Shell, args: list[str], io: IO) -> int:
    if not args:
        raise ExitShell(sh.status)
    if not re.fullmatch(r"[ \t]*[+-]?\d+[ \t]*", args[0]):
        sh.shell_error(io.err, f"exit: {args[0]}: numeric argument required")
        raise ExitShell(2)
    if len(args) > 1:
        sh.shell_error(io.err, "exit: too many arguments")
        return 1
    raise ExitShell(int(args[0]) & 255)


def assign_words(sh: Shell, args: list[str], io: IO, builtin: str, export: bool) -> int:
    """``NAME[=value]`` arguments of ``export`` and ``declare``."""
    for a in args:
        name, eq, value = a.partition("=")
        if not name.isidentifier():
            sh.shell_error(io.err, f"{builtin}: `{a}': not a valid identifier")
            return 1
        if eq:
            sh.vars[name] = value
        if export:
            sh.exported.add(name)
    return 0


def cmd_export(sh: Shell, args: list[str], io: IO) -> int:
    return assign_words(sh, args, io, "export", export=True)


def cmd_unset(sh: Shell, args: list[str], io: IO) -> int:
    for a in args:
        sh.vars.pop(a, None)
        sh.exported.discard(a)
    return 0


# ===================================================================== echo / printf
_SIMPLE_ESC = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r",
               "t": "\t", "v": "\v", "\\": "\\"}


def expand_escapes(text: str, echo_style: bool) -> tuple[str, bool]:
    """Backslash escapes of ``echo -e`` / ``printf %b`` (``echo_style``) or a printf format.

    Returns the text and whether ``\\c`` asked to stop all output.
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c != "\\" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        e = text[i + 1]
        i += 2
        if e in _SIMPLE_ESC:
            out.append(_SIMPLE_ESC[e])
        elif e == "c":
            return "".join(out), True
        elif e == '"' and not echo_style:
            out.append('"')
        elif e in "01234567" and (not echo_style or e == "0"):
            start = i if echo_style else i - 1  # echo: \0nnn; printf: \nnn
            j = start
            while j < n and j - start < 3 and text[j] in "01234567":
                j += 1
            out.append(chr(int(text[start:j] or "0", 8) & 0xFF))
            i = j
        elif e == "x":
            j = i
            while j < n and j - i < 2 and text[j] in "0123456789abcdefABCDEF":
                j += 1
            out.append(chr(int(text[i:j], 16)) if j > i else "\\x")
            i = j
        elif e in "uU":
            j = i
            limit = 4 if e == "u" else 8
            while j < n and j - i < limit and text[j] in "0123456789abcdefABCDEF":
                j += 1
            out.append(chr(int(text[i:j], 16)) if j > i else "\\" + e)
            i = j
        else:
            out.append("\\" + e)
    return "".join(out), False


def cmd_echo(sh: Shell, args: list[str], io: IO) -> int:
    newline, escapes = True, False
    while args and re.fullmatch(r"-[neE]+", args[0]):
        for c in args[0][1:]:
            newline = newline and c != "n"
            escapes = True if c == "e" else (False if c == "E" else escapes)
        args = args[1:]
    text = " ".join(args)
    stop = False
    if escapes:
        text, stop = expand_escapes(text, echo_style=True)
    io.out.write(text + ("\n" if newline and not stop else ""))
    return 0


_CONV = re.compile(r"%([-+ #0]*)(\*|\d+)?(?:\.(\*|\d*))?([diouxXfFeEgGcsbq%])?")


def _printf_number(sh: Shell, io: IO, arg: str, state: dict, conv: str) -> int | float:
    text = arg.strip()
    if text[:1] in ("'", '"'):
        return ord(text[1]) if len(text) > 1 else 0
    if conv in "fFeEgG":
        m = re.match(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text)
        value = float(m.group(0)) if m else 0.0
        ok = bool(m) and m.group(0) == text
    else:
        m = re.match(r"[+-]?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9]\d*)", text)
        value = int(m.group(0), 0) if m and not re.fullmatch(r"[+-]?0[0-7]+", m.group(0)) else (
            int(m.group(0), 8) if m else 0)
        ok = bool(m) and m.group(0) == text
    if not ok and text:
        sh.shell_error(io.err, f"printf: {arg}: invalid number")
        state["status"] = 1
    elif not text and arg:
        sh.shell_error(io.err, f"printf: {arg}: invalid number")
        state["status"] = 1
    return value


def _printf_one(sh: Shell, io: IO, m: re.Match, args: list[str], state: dict) -> str | None:
    flags, width, prec, conv = m.group(1), m.group(2), m.group(3), m.group(4)
    if conv is None:
        return None
    if conv == "%":
        return "%"

    def take() -> str | None:
        if state["i"] < len(args):
            state["i"] += 1
            return args[state["i"] - 1]
        return None

    if width == "*":
        width = str(int(_printf_number(sh, io, take() or "0", state, "d")))
    if prec == "*":
        prec = str(int(_printf_number(sh, io, take() or "0", state, "d")))
    arg = take()
    spec = "%" + flags + (width or "") + ("." + prec if prec is not None else "")
    if conv in "sbq":
        text = arg or ""
        if conv == "b":
            text, stop = expand_escapes(text, echo_style=True)
            state["stop"] = state["stop"] or stop
        elif conv == "q":
            text = _shell_quote_q(text)
        return (spec + "s") % text
    if conv == "c":
        return (spec + "s") % ((arg or "")[:1])
    value = _printf_number(sh, io, arg or "0", state, conv)
    if conv in "diouxX":
        value = int(value)
        if conv in "ouxX" and value < 0:
            value &= (1 << 64) - 1
        return (spec + ("d" if conv in "iu" else conv)) % value
    return (spec + conv) % float(value)


def _shell_quote_q(text: str) -> str:
    if text == "":
        return "''"
    return re.sub(r"([^A-Za-z0-9_./,:@%+=-])", r"\\\1", text)


def cmd_printf(sh: Shell, args: list[str], io: IO) -> int:
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        io.err.write("printf: usage: printf [-v var] format [arguments]\n")
        return 2
    fmt, rest = args[0], args[1:]
    state = {"i": 0, "status": 0, "stop": False}
    out: list[str] = []
    while True:
        consumed_before = state["i"]
        has_conv = False
        pos = 0
        while pos < len(fmt) and not state["stop"]:
            k = fmt.find("%", pos)
            literal = fmt[pos:] if k < 0 else fmt[pos:k]
            text, stop = expand_escapes(literal, echo_style=False)
            out.append(text)
            if stop:
                state["stop"] = True
                break
            if k < 0:
                break
            m = _CONV.match(fmt, k)
            piece = _printf_one(sh, io, m, rest, state) if m else None
            if piece is None:
                bad = fmt[m.end()] if m and m.end() < len(fmt) else "%"
                sh.shell_error(io.err, f"printf: `{bad}': invalid format character")
                io.out.write("".join(out))
                return 1
            has_conv = has_conv or m.group(4) != "%"
            out.append(piece)
            pos = m.end()
        if state["stop"] or not has_conv or state["i"] >= len(rest) or state["i"] == consumed_before:
            break
    io.out.write("".join(out))
    return int(state["status"])


# ===================================================================== test / [
class _TestError(Exception):
    pass


_UNARY = set("efdsrwxLhbcpSgukOGNtznv")
_BINARY = {"=", "==", "!=", "<", ">", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "-nt", "-ot", "-ef"}


def _int(text: str) -> int:
    if not re.fullmatch(r"[ \t]*[+-]?\d+[ \t]*", text):
        raise _TestError(f"{text}: integer expression expected")
    return int(text)


def _unary(sh: Shell, op: str, arg: str) -> bool:
    if op == "z":
        return arg == ""
    if op == "n":
        return arg != ""
    if op == "v":
        return arg in sh.vars
    if op == "t":
        return False
    r = sh.resolve(arg) if arg else None
    if r is None:
        return False
    is_file, is_dir = sh.fs.is_file(r), sh.fs.is_dir(r)
    checks = {
        "e": is_file or is_dir or r.devnull, "f": is_file, "d": is_dir,
        "s": (is_file and sh.fs.read(r) != "") or is_dir,
        "r": is_file or is_dir or r.devnull, "w": is_file or is_dir or r.devnull, "x": is_dir,
        "c": r.devnull, "O": is_file or is_dir, "G": is_file or is_dir,
    }
    return checks.get(op, False)


def _binary(sh: Shell, a: str, op: str, b: str) -> bool:
    if op in ("=", "=="):
        return a == b
    if op == "!=":
        return a != b
    if op == "<":
        return a < b
    if op == ">":
        return a > b
    if op in ("-nt", "-ot"):
        return False
    if op == "-ef":
        return sh.resolve(a) == sh.resolve(b) and sh.fs.exists(sh.resolve(a))
    x, y = _int(a), _int(b)
    return {"-eq": x == y, "-ne": x != y, "-lt": x < y, "-le": x <= y, "-gt": x > y, "-ge": x >= y}[op]


def _is_unary(tok: str) -> bool:
    return len(tok) == 2 and tok[0] == "-" and tok[1] in _UNARY


def _test(sh: Shell, a: list[str]) -> bool:
    n = len(a)
    if n == 0:
        return False
    if n == 1:
        return a[0] != ""
    if n == 2:
        if a[0] == "!":
            return a[1] == ""
        if _is_unary(a[0]):
            return _unary(sh, a[0][1], a[1])
        raise _TestError(f"{a[0]}: unary operator expected")
    if n == 3:
        if a[1] in _BINARY:
            return _binary(sh, a[0], a[1], a[2])
        if a[1] in ("-a", "-o"):
            x, y = a[0] != "", a[2] != ""
            return (x and y) if a[1] == "-a" else (x or y)
        if a[0] == "!":
            return not _test(sh, a[1:])
        if a[0] == "(" and a[2] == ")":
            return a[1] != ""
        raise _TestError(f"{a[1]}: binary operator expected")
    if n == 4:
        if a[0] == "!":
            return not _test(sh, a[1:])
        if a[0] == "(" and a[3] == ")":
            return _test(sh, a[1:3])
    return _TestParser(sh, a).parse()


class _TestParser:
    """The general case: ``expr := and (-o and)*``, ``and := not (-a not)*``."""

    def __init__(self, sh: Shell, args: list[str]) -> None:
        self.sh, self.a, self.i = sh, args, 0

    def parse(self) -> bool:
        value = self._or()
        if self.i < len(self.a):
            raise _TestError("too many arguments")
        return value

    def _peek(self) -> str | None:
        return self.a[self.i] if self.i < len(self.a) else None

    def _or(self) -> bool:
        value = self._and()
        while self._peek() == "-o":
            self.i += 1
            rhs = self._and()
            value = value or rhs
        return value

    def _and(self) -> bool:
        value = self._not()
        while self._peek() == "-a":
            self.i += 1
            rhs = self._not()
            value = value and rhs
        return value

    def _not(self) -> bool:
        if self._peek() == "!":
            self.i += 1
            return not self._not()
        return self._primary()

    def _primary(self) -> bool:
        tok = self._peek()
        if tok is None:
            raise _TestError("argument expected")
        if tok == "(":
            self.i += 1
            value = self._or()
            if self._peek() != ")":
                raise _TestError("`)' expected")
            self.i += 1
            return value
        nxt = self.a[self.i + 1] if self.i + 1 < len(self.a) else None
        if nxt in _BINARY and self.i + 2 < len(self.a):
            self.i += 3
            return _binary(self.sh, tok, nxt, self.a[self.i - 1])
        if _is_unary(tok) and nxt is not None:
            self.i += 2
            return _unary(self.sh, tok[1], nxt)
        self.i += 1
        return tok != ""


def cmd_test(sh: Shell, args: list[str], io: IO, name: str = "test") -> int:
    try:
        return 0 if _test(sh, args) else 1
    except _TestError as exc:
        sh.shell_error(io.err, f"{name}: {exc}")
        return 2


def cmd_bracket(sh: Shell, args: list[str], io: IO) -> int:
    if not args or args[-1] != "]":
        sh.shell_error(io.err, "[: missing `]'")
        return 2
    return cmd_test(sh, args[:-1], io, name="[")


BUILTINS = {
    "cd": cmd_cd, "pwd": cmd_pwd, "echo": cmd_echo, "printf": cmd_printf, "test": cmd_test,
    "[": cmd_bracket, "true": cmd_true, "false": cmd_false, ":": cmd_true, "exit": cmd_exit,
    "export": cmd_export, "unset": cmd_unset,
}
