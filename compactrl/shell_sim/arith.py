"""Bash arithmetic (``$((...))``, ``((...))``, ``for ((;;))``, ``let``): 64-bit signed integers
and C's operators with bash's precedence, variables read as nested expressions, assignments."""

from __future__ import annotations

import re
from collections.abc import Callable

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+#[0-9A-Za-z@_]+|0[xX][0-9A-Fa-f]+|\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|"
                    r"(?P<op><<=|>>=|\*\*|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&^|]=|[-+*/%<>=!~&^|?:,()]))")
_BINARY = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", ">", "<=", ">="), ("<<", ">>"),
           ("+", "-"), ("*", "/", "%")]
_ASSIGN = {"=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "^=", "|="}
MAX_DEPTH = 64


class ArithError(Exception):
    """An arithmetic error; ``str()`` is bash's message after ``EXPR: ``."""


def wrap(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _number(text: str) -> int:
    if "#" in text:
        base_s, digits = text.split("#", 1)
        base = int(base_s)
        if not 2 <= base <= 64:
            raise ArithError(f"invalid arithmetic base (error token is \"{text}\")")
        alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ@_"
        value = 0
        for c in digits:
            d = alphabet.index(c) if base > 36 else int(c, 36) if c.isalnum() else 99
            if d >= base:
                raise ArithError(f"value too great for base (error token is \"{text}\")")
            value = value * base + d
        return wrap(value)
    if text[:2] in ("0x", "0X"):
        return wrap(int(text, 16))
    if len(text) > 1 and text[0] == "0":
        if any(c in "89" for c in text):
            raise ArithError(f"value too great for base (error token is \"{text}\")")
        return wrap(int(text, 8))
    return wrap(int(text))


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                raise ArithError(f"syntax error: invalid arithmetic operator (error token is \"{text[pos:].strip()}\")")
            kind = m.lastgroup or "op"
            self.toks.append((kind, m.group(kind), m.start(kind)))
            pos = m.end()
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def error_token(self) -> str:
        if self.i >= len(self.toks):
            return self.toks[-1][1] if self.toks else ""
        return self.text[self.toks[self.i][2]:].strip()

    def fail(self, what: str) -> ArithError:
        return ArithError(f"syntax error: {what} (error token is \"{self.error_token()}\")")

    def parse(self):
        if not self.toks:
            return ("num", 0)
        node = self.comma()
        if self.i < len(self.toks):
            raise self.fail("invalid arithmetic operator" if self.toks[self.i][0] == "op" else "syntax error in expression")
        return node

    def comma(self):
        node = self.assign()
        while self.peek() == ",":
            self.i += 1
            node = ("comma", node, self.assign())
        return node

    def assign(self):
        if self.i + 1 < len(self.toks) and self.toks[self.i][0] == "name" and self.toks[self.i + 1][1] in _ASSIGN:
            name, op = self.toks[self.i][1], self.toks[self.i + 1][1]
            self.i += 2
            pos = self.toks[self.i][2] if self.i < len(self.toks) else len(self.text)
            return ("assign", name, op, self.assign(), pos)
        return self.ternary()

    def ternary(self):
        cond = self.binary(0)
        if self.peek() != "?":
            return cond
        self.i += 1
        yes = self.comma() if self.peek() != ":" else None
        if yes is None or self.peek() != ":":
            raise self.fail("`:' expected for conditional expression")
        self.i += 1
        return ("if", cond, yes, self.assign())

    def binary(self, level: int):
        if level == len(_BINARY):
            return self.power()
        node = self.binary(level + 1)
        while self.peek() in _BINARY[level]:
            op = self.peek()
            self.i += 1
            pos = self.toks[self.i][2] if self.i < len(self.toks) else len(self.text)
            node = ("bin", op, node, self.binary(level + 1), pos)
        return node

    def power(self):
        base = self.unary()
        if self.peek() == "**":
            self.i += 1
            pos = self.toks[self.i][2] if self.i < len(self.toks) else len(self.text)
            return ("bin", "**", base, self.power(), pos)
        return base

    def unary(self):
        op = self.peek()
        if op in ("++", "--") and self.i + 1 < len(self.toks) and self.toks[self.i + 1][0] == "name":
            self.i += 2
            return ("pre", op, self.toks[self.i - 1][1])
        if op in ("!", "~", "-", "+"):
            self.i += 1
            return ("un", op, self.unary())
        return self.postfix()

    def postfix(self):
        if self.i >= len(self.toks):
            raise ArithError(f"syntax error: operand expected (error token is \"{self.error_token()}\")")
        kind, text, _ = self.toks[self.i]
        if kind == "num":
            self.i += 1
            return ("num", _number(text))
        if kind == "name":
            self.i += 1
            if self.peek() in ("++", "--"):
                self.i += 1
                return ("post", self.toks[self.i - 1][1], text)
            return ("var", text)
        if text == "(":
            self.i += 1
            node = self.comma()
            if self.peek() != ")":
                raise self.fail("missing `)'" if self.peek() is None else "invalid arithmetic operator")
            self.i += 1
            return node
        raise ArithError(f"syntax error: operand expected (error token is \"{self.error_token()}\")")


class Evaluator:
    """Evaluates expressions with ``get(name) -> str`` and ``set_(name, value)`` for variables."""

    def __init__(self, get: Callable[[str], str], set_: Callable[[str, str], None]) -> None:
        self.get, self.set_ = get, set_
        self.depth = 0
        self.text = ""

    def evaluate(self, text: str) -> int:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise ArithError(f"expression recursion level exceeded (error token is \"{text.strip()}\")")
            saved, self.text = getattr(self, "text", ""), text
            try:
                return self.eval(_Parser(text).parse())
            finally:
                self.text = saved
        finally:
            self.depth -= 1

    def var(self, name: str) -> int:
        value = self.get(name).strip()
        if not value:
            return 0
        if re.fullmatch(r"[+-]?\d+", value):
            return wrap(int(value))
        return self.evaluate(value)

    def eval(self, node) -> int:
        kind = node[0]
        if kind == "num":
            return node[1]
        if kind == "var":
            return self.var(node[1])
        if kind == "comma":
            self.eval(node[1])
            return self.eval(node[2])
        if kind == "if":
            return self.eval(node[2]) if self.eval(node[1]) else self.eval(node[3])
        if kind == "un":
            v = self.eval(node[2])
            return {"!": int(not v), "~": wrap(~v), "-": wrap(-v), "+": v}[node[1]]
        if kind in ("pre", "post"):
            old = self.var(node[2])
            new = wrap(old + (1 if node[1] == "++" else -1))
            self.set_(node[2], str(new))
            return new if kind == "pre" else old
        if kind == "assign":
            _, name, op, rhs, pos = node
            value = self.eval(rhs) if op == "=" else self.apply(op[:-1], self.var(name), self.eval(rhs), pos)
            self.set_(name, str(value))
            return value
        op = node[1]
        if op == "&&":
            return int(bool(self.eval(node[2])) and bool(self.eval(node[3])))
        if op == "||":
            return int(bool(self.eval(node[2])) or bool(self.eval(node[3])))
        return self.apply(op, self.eval(node[2]), self.eval(node[3]), node[4])

    def apply(self, op: str, a: int, b: int, pos: int) -> int:
        if op in ("/", "%"):
            if b == 0:
                raise ArithError(f"division by 0 (error token is \"{self.text[pos:]}\")")
            q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
            return wrap(q if op == "/" else a - b * q)
        if op == "**":
            if b < 0:
                raise ArithError(f"exponent less than 0 (error token is \"{self.text[pos:]}\")")
            return wrap(pow(a, b, 1 << 64))
        if op in ("<<", ">>"):
            return wrap(a << (b & 63)) if op == "<<" else a >> (b & 63)
        table = {"+": a + b, "-": a - b, "*": a * b, "&": a & b, "|": a | b, "^": a ^ b,
                 "==": int(a == b), "!=": int(a != b), "<": int(a < b), ">": int(a > b),
                 "<=": int(a <= b), ">=": int(a >= b)}
        return wrap(table[op])
