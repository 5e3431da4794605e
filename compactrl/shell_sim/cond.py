"""``[[ ... ]]``: string, pattern (``==``, ``!=``), regex (``=~``, setting ``BASH_REMATCH``),
arithmetic (``-eq`` ...) and file tests, combined with ``!``, ``&&``, ``||`` and parentheses.
Words are expanded without field splitting or globbing, as bash does inside ``[[``."""

from __future__ import annotations

import re

from compactrl.shell_sim.builtins import _binary, _is_unary, _unary
from compactrl.shell_sim.parser import Word
from compactrl.shell_sim.regex import RegexError, compile_posix
from compactrl.shell_sim.shell import Shell, pattern_regex

_STRING_OPS = {"==", "=", "!=", "<", ">", "=~"}
_ARITH_OPS = {"-eq", "-ne", "-lt", "-le", "-gt", "-ge"}
_FILE_OPS = {"-nt", "-ot", "-ef"}


class CondError(Exception):
    """A malformed ``[[`` expression (bash reports it and the command's status is 2)."""


class _Cond:
    def __init__(self, sh: Shell, toks: list) -> None:
        self.sh, self.toks, self.i = sh, toks, 0
        self.skip = False  # inside the operand of a short-circuited && or ||: parse, do not expand

    def peek_op(self) -> str | None:
        """The current token when it is an operator (a bare word such as ``&&`` or ``-f``)."""
        if self.i >= len(self.toks):
            return None
        kind, value = self.toks[self.i]
        if kind == "op":
            return value
        return value.raw if _bare(value) else None

    def word(self) -> str:
        kind, value = self.toks[self.i]
        self.i += 1
        if kind == "op" or self.skip:
            return "" if self.skip else value
        return self.sh.expand_word(value, split=False)[0]

    def parse(self) -> bool:
        value = self.or_()
        if self.i < len(self.toks):
            raise CondError(f"syntax error in conditional expression: unexpected token `{self.peek_op() or ''}'")
        return value

    def or_(self) -> bool:
        value = self.and_()
        while self.peek_op() == "||":
            self.i += 1
            value = self.operand(self.and_, skip=value) or value
        return value

    def and_(self) -> bool:
        value = self.not_()
        while self.peek_op() == "&&":
            self.i += 1
            value = self.operand(self.not_, skip=not value) and value
        return value

    def operand(self, parse, skip: bool) -> bool:
        """The right operand of ``&&``/``||``; when ``skip`` it is only parsed (no expansion, no
        ``BASH_REMATCH``), as bash does not evaluate it."""
        outer, self.skip = self.skip, self.skip or skip
        try:
            return parse()
        finally:
            self.skip = outer

    def not_(self) -> bool:
        if self.peek_op() == "!":
            self.i += 1
            return not self.not_()
        return self.primary()

    def primary(self) -> bool:
        if self.i >= len(self.toks):
            raise CondError("unexpected argument to conditional expression")
        op = self.peek_op()
        if op == "(":
            self.i += 1
            value = self.or_()
            if self.peek_op() != ")":
                raise CondError("expected `)'")
            self.i += 1
            return value
        if op and _is_unary(op) and self.i + 1 < len(self.toks):
            self.i += 1
            return _unary(self.sh, op[1], self.word())
        left = self.word()
        op = self.peek_op()
        if op in _STRING_OPS or op in _ARITH_OPS or op in _FILE_OPS:
            self.i += 1
            if self.i >= len(self.toks):
                raise CondError(f"unexpected argument `{op}' to conditional binary operator")
            return self.binary(left, op)
        return left != ""

    def binary(self, left: str, op: str) -> bool:
        kind, value = self.toks[self.i]
        self.i += 1
        if op in ("==", "=", "!=") and not self.skip:
            word = value if kind == "word" else Word([], value)
            matched = bool(pattern_regex(self.sh, word).fullmatch(left))
            return matched == (op != "!=")
        if self.skip:
            return False
        right = value if kind == "op" else self.sh.expand_word(value, split=False)[0]
        if op == "=~":
            return self.regex(left, value if kind == "word" else None, right)
        if op in ("<", ">"):
            return left < right if op == "<" else left > right
        if op in _ARITH_OPS:
            x, y = self.sh.arith(left), self.sh.arith(right)
            return {"-eq": x == y, "-ne": x != y, "-lt": x < y, "-le": x <= y, "-gt": x > y, "-ge": x >= y}[op]
        return _binary(self.sh, left, op, right)

    def regex(self, left: str, word: Word | None, right: str) -> bool:
        pattern = right
        if word is not None:  # quoted parts match literally
            pattern = "".join(re.sub(r"([\\.^$*+?()\[\]{}|])", r"\\\1", self.sh.param_op(p) if p.var else p.text)
                              if p.quoted else (self.sh.param_op(p) if p.var else p.text) for p in word.parts)
        try:
            m = compile_posix(pattern, extended=True).search(left)
        except RegexError:
            return False
        for key in [k for k in self.sh.vars if k.startswith("BASH_REMATCH")]:
            del self.sh.vars[key]
        if not m:
            return False
        groups = [m.group(0), *(g or "" for g in m.groups())]
        self.sh.vars["BASH_REMATCH"] = groups[0]
        for k, g in enumerate(groups):
            self.sh.vars[f"BASH_REMATCH[{k}]"] = g
        return True


def _bare(word: Word) -> bool:
    return all(not p.quoted and not p.var for p in word.parts)


def evaluate_cond(sh: Shell, toks: list) -> bool:
    try:
        return _Cond(sh, toks).parse()
    except IndexError:
        raise CondError("syntax error in conditional expression") from None
