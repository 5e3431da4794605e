"""``diff`` (normal, ``-u``, ``-q``), ``expr`` and ``bc`` (arbitrary precision with ``scale``)."""

from __future__ import annotations

import difflib
import re
from decimal import ROUND_DOWN, Decimal, InvalidOperation, getcontext

from compactrl.shell_sim.common import getopt, missing, read_input
from compactrl.shell_sim.fs import FsError
from compactrl.shell_sim.gnudiff import opcodes as gnu_opcodes
from compactrl.shell_sim.shell import IO, Shell

SIM_MTIME = "2026-01-01 00:00:00.000000000 +0000"
"""The modification time ``diff -u`` headers show in the sim (files have no times there)."""


# ===================================================================== diff
def cmd_diff(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("diff", args, "uqsbwiU:", io, code=2, long={"brief": "q", "unified=": "U", "report-identical-files": "s",
                                                            "ignore-all-space": "w", "ignore-case": "i"})
    if len(o.operands) != 2:
        what = "missing operand after" if len(o.operands) < 2 else "extra operand"
        io.err.write(f"diff: {what} '{(o.operands or ['diff'])[-1]}'\ndiff: Try 'diff --help' for more information.\n")
        return 2
    texts = []
    for path in o.operands:
        try:
            texts.append(read_input(sh, io, path))
        except FsError as exc:
            missing("diff", path, exc, io)
    if len(texts) < 2:
        return 2
    a, b = _lines(texts[0]), _lines(texts[1])
    key = _diff_key(o.has("w"), o.has("i"))
    same = [key(x) for x in a] == [key(x) for x in b]
    if same:
        if o.has("s"):
            io.out.write(f"Files {o.operands[0]} and {o.operands[1]} are identical\n")
        return 0
    if o.has("q"):
        io.out.write(f"Files {o.operands[0]} and {o.operands[1]} differ\n")
        return 1
    ops = gnu_opcodes([key(x) for x in a], [key(x) for x in b])
    if o.has("u") or o.has("U"):
        context = int(o.last("U", "3") or 3)
        io.out.write(f"--- {o.operands[0]}\t{SIM_MTIME}\n+++ {o.operands[1]}\t{SIM_MTIME}\n")
        io.out.write("".join(_unified(a, b, ops, context)))
    else:
        io.out.write("".join(_normal(a, b, ops)))
    return 1


def _diff_key(ignore_space: bool, icase: bool):
    def key(line: str) -> str:
        text = re.sub(r"\s+", "", line) if ignore_space else line
        return text.lower() if icase else text
    return key


def _lines(text: str) -> list[str]:
    """Lines keeping their newline; a last line without one is marked for the ``\\`` note."""
    return re.findall(r"[^\n]*\n|[^\n]+", text)


def _show(prefix: str, line: str) -> str:
    if line.endswith("\n"):
        return prefix + line
    return prefix + line + "\n\\ No newline at end of file\n"


def _range(lo: int, hi: int) -> str:
    return f"{lo + 1}" if hi - lo == 1 else f"{lo + 1},{hi}"


def _normal(a: list[str], b: list[str], ops) -> list[str]:
    out = []
    for tag, i1, i2, j1, j2 in ops:
        if tag == "equal":
            continue
        if tag == "delete":
            out.append(f"{_range(i1, i2)}d{j1}\n")
        elif tag == "insert":
            out.append(f"{i1}a{_range(j1, j2)}\n")
        else:
            out.append(f"{_range(i1, i2)}c{_range(j1, j2)}\n")
        out.extend(_show("< ", x) for x in a[i1:i2])
        if tag == "replace":
            out.append("---\n")
        out.extend(_show("> ", x) for x in b[j1:j2])
    return out


def _unified(a: list[str], b: list[str], ops, n: int) -> list[str]:
    out = []
    for group in _groups(ops, n):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_urange(i1, i2)} +{_urange(j1, j2)} @@\n")
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                out.extend(_show(" ", x) for x in a[a1:a2])
                continue
            out.extend(_show("-", x) for x in a[a1:a2])
            out.extend(_show("+", x) for x in b[b1:b2])
    return out


def _groups(ops, n: int):
    matcher = difflib.SequenceMatcher(None, [], [])
    matcher.get_opcodes = lambda: ops  # type: ignore[method-assign]
    return matcher.get_grouped_opcodes(n)


def _urange(lo: int, hi: int) -> str:
    length = hi - lo
    start = lo + 1 if length else lo
    return f"{start}" if length == 1 else f"{start},{length}"


# ===================================================================== expr
class _ExprError(Exception):
    def __init__(self, msg: str, code: int = 2) -> None:
        super().__init__(msg)
        self.code = code


def cmd_expr(sh: Shell, args: list[str], io: IO) -> int:
    if not args:
        io.err.write("expr: missing operand\nTry 'expr --help' for more information.\n")
        return 2
    try:
        parser = _Expr(args)
        value = parser.or_()
        if parser.i < len(args):
            raise _ExprError(f"syntax error: unexpected argument '{args[parser.i]}'")
    except _ExprError as exc:
        io.err.write(f"expr: {exc}\n")
        return exc.code
    io.out.write(f"{value}\n")
    return 1 if value in ("", "0") or re.fullmatch(r"-?0+", str(value)) else 0


class _Expr:
    def __init__(self, args: list[str]) -> None:
        self.a, self.i = args, 0

    def peek(self) -> str | None:
        return self.a[self.i] if self.i < len(self.a) else None

    def take(self) -> str:
        if self.i >= len(self.a):
            raise _ExprError(f"syntax error: missing argument after '{self.a[-1]}'")
        self.i += 1
        return self.a[self.i - 1]

    def binary(self, ops: tuple[str, ...], sub, fn):
        left = sub()
        while self.peek() in ops:
            op = self.take()
            left = fn(op, left, sub())
        return left

    def or_(self):
        return self.binary(("|",), self.and_, lambda op, x, y: x if _truthy(x) else (y if _truthy(y) else 0))

    def and_(self):
        return self.binary(("&",), self.cmp, lambda op, x, y: x if _truthy(x) and _truthy(y) else 0)

    def cmp(self):
        def fn(op, x, y):
            xi, yi = _int_or_none(x), _int_or_none(y)
            a, b = (xi, yi) if xi is not None and yi is not None else (str(x), str(y))
            return int({"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op])
        return self.binary(("=", "!=", "<", "<=", ">", ">="), self.add, fn)

    def add(self):
        return self.binary(("+", "-"), self.mul, lambda op, x, y: _num(x) + _num(y) if op == "+" else _num(x) - _num(y))

    def mul(self):
        def fn(op, x, y):
            a, b = _num(x), _num(y)
            if op != "*" and b == 0:
                raise _ExprError("division by zero")
            if op == "*":
                return a * b
            q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
            return q if op == "/" else a - b * q
        return self.binary(("*", "/", "%"), self.match, fn)

    def match(self):
        left = self.primary()
        while self.peek() == ":":
            self.take()
            left = _expr_match(str(left), self.primary())
        return left

    def primary(self):
        tok = self.take()
        if tok == "(":
            value = self.or_()
            if self.take() != ")":
                raise _ExprError("syntax error: expecting ')'")
            return value
        if tok == "length":
            return len(str(self.primary()))
        if tok == "substr":
            s, p, n = str(self.primary()), _num(self.primary()), _num(self.primary())
            return s[p - 1:p - 1 + n] if p >= 1 and n >= 1 else ""
        if tok == "index":
            s, chars = str(self.primary()), str(self.primary())
            return next((k + 1 for k, c in enumerate(s) if c in chars), 0)
        if tok == "match":
            return _expr_match(str(self.primary()), self.primary())
        if tok == "+":
            return self.take()
        return tok


def _expr_match(s: str, pattern) -> str | int:
    from compactrl.shell_sim.regex import compile_posix

    m = compile_posix(str(pattern), extended=False).match(s)
    if compile_posix(str(pattern), extended=False).groups:
        return m.group(1) or "" if m else ""
    return len(m.group(0)) if m else 0


def _truthy(v) -> bool:
    return v not in ("", 0, "0")


def _int_or_none(v) -> int | None:
    return int(v) if isinstance(v, int) or re.fullmatch(r"-?\d+", str(v)) else None


def _num(v) -> int:
    n = _int_or_none(v)
    if n is None:
        raise _ExprError("non-integer argument")
    return n


# ===================================================================== bc
_BC_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|([a-z][a-z0-9_]*)|(\^|\*|/|%|\+|-|\(|\)|=|,))")


class _BcError(Exception):
    pass


def cmd_bc(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("bc", args, "lqs", io, long={"mathlib": "l", "quiet": "q"})
    getcontext().prec = 200
    env = {"scale": Decimal(20 if o.has("l") else 0)}
    try:
        text = "".join(read_input(sh, io, p) for p in o.operands) + io.stdin
    except FsError as exc:
        io.err.write(f"bc: {exc.strerror}\n")
        return 1
    for stmt in re.split(r"[;\n]", re.sub(r"/\*.*?\*/|#[^\n]*", "", text, flags=re.S)):
        stmt = stmt.strip()
        if not stmt or stmt == "quit":
            if stmt == "quit":
                break
            continue
        try:
            value = _Bc(stmt, env).statement()
        except (_BcError, InvalidOperation, ZeroDivisionError) as exc:
            io.err.write("Runtime error (func=(main), adr=0): Divide by zero\n" if isinstance(exc, ZeroDivisionError)
                         or "zero" in str(exc).lower() else f"(standard_in) 1: {exc or 'syntax error'}\n")
            continue
        if value is not None:
            io.out.write(_bc_format(value) + "\n")
    return 0


class _Bc:
    """One statement: an assignment (``scale=2``, ``x=3``) or an expression to print. Values carry
    their bc scale (digits after the point) as ``(Decimal, scale)``."""

    def __init__(self, text: str, env: dict[str, Decimal]) -> None:
        self.toks, pos = [], 0
        while pos < len(text):
            m = _BC_TOKEN.match(text, pos)
            if not m or m.end() == pos:
                if text[pos:].strip():
                    raise _BcError("syntax error")
                break
            self.toks.append(m.group(1) or m.group(2) or m.group(3))
            pos = m.end()
        self.i, self.env = 0, env

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        if self.i >= len(self.toks):
            raise _BcError("syntax error")
        self.i += 1
        return self.toks[self.i - 1]

    def statement(self) -> tuple[Decimal, int] | None:
        if len(self.toks) > 2 and self.toks[1] == "=" and self.toks[0][0].isalpha():
            name = self.take()
            self.take()
            value, _ = self.expr()
            self.env[name] = value
            return None
        value = self.expr()
        if self.i < len(self.toks):
            raise _BcError("syntax error")
        return value

    @property
    def scale(self) -> int:
        return int(self.env.get("scale", Decimal(0)))

    def expr(self):
        left = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            right = self.term()
            left = (left[0] + right[0] if op == "+" else left[0] - right[0], max(left[1], right[1]))
        return left

    def term(self):
        left = self.power()
        while self.peek() in ("*", "/", "%"):
            op = self.take()
            right = self.power()
            if op == "*":
                scale = min(left[1] + right[1], max(self.scale, left[1], right[1]))
                left = (_trunc(left[0] * right[0], scale), scale)
            elif op == "/":
                if right[0] == 0:
                    raise ZeroDivisionError()
                left = (_trunc(left[0] / right[0], self.scale), self.scale)
            else:
                if right[0] == 0:
                    raise ZeroDivisionError()
                q = _trunc(left[0] / right[0], self.scale)
                scale = max(self.scale + right[1], left[1])
                left = (_trunc(left[0] - q * right[0], scale), scale)
        return left

    def power(self):
        base = self.unary()
        if self.peek() == "^":
            self.take()
            exp = self.power()
            n = int(exp[0])
            scale = min(base[1] * abs(n), max(self.scale, base[1])) if n >= 0 else self.scale
            return (_trunc(base[0] ** n, scale), scale)
        return base

    def unary(self):
        if self.peek() == "-":
            self.take()
            value = self.unary()
            return (-value[0], value[1])
        return self.primary()

    def primary(self):
        tok = self.take()
        if tok == "(":
            value = self.expr()
            if self.take() != ")":
                raise _BcError("syntax error")
            return value
        if tok[0].isdigit() or tok[0] == ".":
            return (Decimal(tok), len(tok.split(".")[1]) if "." in tok else 0)
        if tok == "sqrt" and self.peek() == "(":
            self.take()
            value = self.expr()
            self.take()
            scale = max(self.scale, value[1])
            return (_trunc(value[0].sqrt(), scale), scale)
        if tok[0].isalpha():
            value = self.env.get(tok, Decimal(0))
            return (value, max(-value.as_tuple().exponent, 0) if isinstance(value.as_tuple().exponent, int) else 0)
        raise _BcError("syntax error")


def _trunc(value: Decimal, scale: int) -> Decimal:
    return value.quantize(Decimal(1).scaleb(-scale), rounding=ROUND_DOWN)


def _bc_format(value: tuple[Decimal, int]) -> str:
    number, scale = value
    text = f"{_trunc(number, scale):f}"
    if text.startswith("0.") or text.startswith("-0."):
        text = text.replace("0.", ".", 1)
    if text in ("0", "-0") or re.fullmatch(r"-?\.?0*", text):
        text = "0" if scale == 0 or not text.strip("-.0") else text
    return text


CALC = {"diff": cmd_diff, "expr": cmd_expr, "bc": cmd_bc}
