"""A POSIX awk interpreter with mawk 1.3.4's observable behaviour (Debian's default ``awk``).

Covered: patterns (expressions, ``/re/``, ranges, BEGIN/END), actions with ``print``/``printf``
(including ``> file`` / ``>> file``), assignments, ``if``/``while``/``do``/``for``/``for (k in a)``,
``next``/``exit``/``break``/``continue``, arrays and ``delete``, user functions, the POSIX string
and math built-ins, ``-F``/``-v``. Strings are byte strings as in mawk (``length("é") == 2``).
Not covered: ``getline``, pipes, ``system``, ``rand``/``srand``, ``RS`` other than newline.
``for (k in a)`` visits keys in insertion order; mawk uses hash order, so only order-insensitive
uses agree (documented).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from compactrl.shell_sim.fs import FsError
from compactrl.shell_sim.regex import RegexError, posix_to_python
from compactrl.shell_sim.shell import IO, Shell

MAX_INT = 2**31 - 1
_NUM_RX = re.compile(
    r"[ \t\n\f\r\v]*[+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?"
    r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE)


class AwkError(Exception):
    """A syntax or run-time error; the message follows mawk's wording where known."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class _Uninit:
    def __repr__(self) -> str:
        return "<uninit>"


UNINIT = _Uninit()


class StrNum(str):
    """Input-derived text (fields, ``-v`` values, ``split`` parts) that may compare as a number."""

    num: float | None

    def __new__(cls, text: str) -> StrNum:
        obj = super().__new__(cls, text)
        m = _NUM_RX.match(text)
        obj.num = _strtod(text) if m and text[m.end():].strip(" \t\n\f\r\v") == "" else None
        return obj


def _strtod(text: str) -> float:
    m = _NUM_RX.match(text)
    if not m:
        return 0.0
    t = m.group(0).strip(" \t\n\f\r\v")
    body = t.lstrip("+-")
    sign = -1.0 if t.startswith("-") else 1.0
    if body[:2].lower() == "0x":
        return sign * float.fromhex(body)
    return sign * float(body) if body.lower() not in ("nan",) else -math.nan if sign < 0 else math.nan


def _num_to_str(x: float, fmt: str) -> str:
    if x == int(x) if math.isfinite(x) else False:
        if -MAX_INT <= x <= MAX_INT:
            return str(int(x))
    if math.isnan(x):
        return "-nan" if math.copysign(1.0, x) < 0 else "nan"
    return _c_format(fmt, [x])


def _c_format(fmt: str, args: list) -> str:
    """C printf for one conversion already validated by the caller."""
    m = re.fullmatch(r"%([-+ #0]*)(\d*)(?:\.(\d*))?([a-zA-Z])", fmt)
    if not m:
        return fmt
    x = float(args[0])
    if math.isnan(x) or math.isinf(x):
        text = ("-" if math.copysign(1.0, x) < 0 else "") + ("nan" if math.isnan(x) else "inf")
        return f"{text:>{m.group(2) or 0}}" if "-" not in m.group(1) else f"{text:<{m.group(2) or 0}}"
    return fmt % x


# ===================================================================== lexer
_KEYWORDS = {"BEGIN", "END", "function", "func", "if", "else", "while", "for", "do", "break", "continue",
             "next", "nextfile", "exit", "return", "delete", "in", "getline", "print", "printf"}
_BUILTINS = {"length", "substr", "index", "split", "sub", "gsub", "match", "sprintf", "sin", "cos", "atan2",
             "exp", "log", "sqrt", "int", "tolower", "toupper", "rand", "srand", "system", "close", "fflush"}
_PUNCT = ["+=", "-=", "*=", "/=", "%=", "^=", "==", "<=", ">=", "!=", "++", "--", "&&", "||", ">>", "!~",
          "{", "}", "(", ")", "[", "]", ";", ",", "+", "-", "*", "/", "%", "^", "!", ">", "<", "|", "?",
          ":", "~", "$", "="]


@dataclass
class Tok:
    kind: str  # num str ere name func kw punct nl eof
    value: object
    line: int


def _unescape(s: str) -> str:
    esc = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "/": "/", "a": "\a", "b": "\b",
           "f": "\f", "v": "\v"}

    def repl(m: re.Match) -> str:
        e = m.group(1)
        if e[0] in "01234567":
            return chr(int(e, 8) & 0xFF)
        return esc.get(e, "\\" + e)

    return re.sub(r"\\([0-7]{1,3}|.)", repl, s, flags=re.DOTALL)


def tokenize(src: str) -> list[Tok]:
    toks: list[Tok] = []
    i, n, line = 0, len(src), 1
    while i < n:
        c = src[i]
        if c in " \t\r":
            i += 1
        elif c == "\\" and i + 1 < n and src[i + 1] == "\n":
            i += 2
            line += 1
        elif c == "\n":
            toks.append(Tok("nl", "\n", line))
            line += 1
            i += 1
        elif c == "#":
            while i < n and src[i] != "\n":
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
                if j <= n and src[j - 1] == "\n":
                    raise AwkError(f"line {line}: runaway string constant \"{src[i + 1:j - 1]} ...")
            if j >= n:
                raise AwkError(f"line {line}: runaway string constant \"{src[i + 1:j]} ...")
            toks.append(Tok("str", _unescape(src[i + 1:j]), line))
            i = j + 1
        elif c == "/" and _regex_allowed(toks):
            j = i + 1
            while j < n and src[j] != "/":
                if src[j] == "\n":
                    raise AwkError(f"line {line}: runaway regular expression /{src[i + 1:j]} ...")
                j += 2 if src[j] == "\\" else 1
            if j >= n:
                raise AwkError(f"line {line}: runaway regular expression /{src[i + 1:j]} ...")
            toks.append(Tok("ere", src[i + 1:j], line))
            i = j + 1
        elif c.isdigit() or (c == "." and i + 1 < n and src[i + 1].isdigit()):
            m = re.match(r"(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", src[i:])
            assert m is not None
            toks.append(Tok("num", float(m.group(0)), line))
            i += m.end()
        elif c.isalpha() or c == "_":
            m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", src[i:])
            assert m is not None
            word = m.group(0)
            kind = "kw" if word in _KEYWORDS else ("func" if word in _BUILTINS else "name")
            toks.append(Tok(kind, word, line))
            i += m.end()
        else:
            for p in _PUNCT:
                if src.startswith(p, i):
                    toks.append(Tok("punct", p, line))
                    i += len(p)
                    break
            else:
                raise AwkError(f"line {line}: syntax error at or near {c}")
    toks.append(Tok("eof", None, line))
    return toks


def _regex_allowed(toks: list[Tok]) -> bool:
    if not toks:
        return True
    last = toks[-1]
    if last.kind in ("num", "str", "ere", "name"):
        return False
    if last.kind == "func" and last.value == "length":
        return False
    return not (last.kind == "punct" and last.value in (")", "]", "$", "++", "--"))


# ===================================================================== parser
@dataclass
class Rule:
    kind: str  # "begin" "end" "main" "range"
    pattern: object = None
    pattern2: object = None
    action: list | None = None
    in_range: bool = False


@dataclass
class Program:
    begin: list[Rule] = field(default_factory=list)
    main: list[Rule] = field(default_factory=list)
    end: list[Rule] = field(default_factory=list)
    functions: dict[str, tuple[list[str], list]] = field(default_factory=dict)


class Parser:
    def __init__(self, toks: list[Tok]) -> None:
        self.t, self.i = toks, 0

    def peek(self, k: int = 0) -> Tok:
        return self.t[min(self.i + k, len(self.t) - 1)]

    def at(self, kind: str, value: object = None) -> bool:
        tok = self.peek()
        return tok.kind == kind and (value is None or tok.value == value)

    def at_p(self, *values: str) -> bool:
        return self.peek().kind == "punct" and self.peek().value in values

    def take(self) -> Tok:
        tok = self.peek()
        self.i += 1
        return tok

    def expect_p(self, value: str) -> None:
        if not self.at_p(value):
            self.error()
        self.i += 1

    def error(self) -> AwkError:
        tok = self.peek()
        if tok.kind == "eof":
            raise AwkError(f"line {tok.line}: syntax error at or near end of file")
        shown = {"nl": "end of line", "str": f'"{tok.value}"'}.get(tok.kind, str(tok.value))
        if tok.kind == "num":
            shown = _num_to_str(float(tok.value), "%.6g")  # type: ignore[arg-type]
        raise AwkError(f"line {tok.line}: syntax error at or near {shown}")

    def nls(self) -> None:
        while self.at("nl") or self.at_p(";"):
            self.i += 1

    def opt_nl(self) -> None:
        while self.at("nl"):
            self.i += 1

    # --------------------------------------------------------------- program
    def program(self) -> Program:
        prog = Program()
        self.nls()
        while not self.at("eof"):
            self.item(prog)
            self.nls()
        return prog

    def item(self, prog: Program) -> None:
        if self.at("kw", "BEGIN") or self.at("kw", "END"):
            which = self.take().value
            self.opt_nl()
            if not self.at_p("{"):
                self.error()
            rule = Rule("begin" if which == "BEGIN" else "end", action=self.block())
            (prog.begin if which == "BEGIN" else prog.end).append(rule)
            return
        if self.at("kw", "function") or self.at("kw", "func"):
            self.take()
            name = self.take()
            if name.kind not in ("name",):
                self.error()
            self.expect_p("(")
            params: list[str] = []
            while not self.at_p(")"):
                p = self.take()
                if p.kind != "name":
                    self.error()
                params.append(str(p.value))
                if self.at_p(","):
                    self.take()
                    self.opt_nl()
            self.expect_p(")")
            self.opt_nl()
            prog.functions[str(name.value)] = (params, self.block())
            return
        pattern = pattern2 = None
        if not self.at_p("{"):
            pattern = self.expr()
            if self.at_p(","):
                self.take()
                self.opt_nl()
                pattern2 = self.expr()
        action = self.block() if self.at_p("{") else None
        prog.main.append(Rule("range" if pattern2 is not None else "main", pattern, pattern2, action))

    def block(self) -> list:
        self.expect_p("{")
        stmts = []
        self.nls()
        while not self.at_p("}"):
            if self.at("eof"):
                raise AwkError(f"line {self.peek().line}: missing }} near end of file")
            stmts.append(self.stmt())
            self.nls()
        self.take()
        return stmts

    def simple_end(self) -> None:
        if self.at_p(";") or self.at("nl"):
            self.take()
        elif not (self.at_p("}") or self.at("eof")):
            self.error()

    def stmt(self) -> tuple:
        tok = self.peek()
        if tok.kind == "punct" and tok.value == "{":
            return ("block", self.block())
        if tok.kind == "kw":
            kw = tok.value
            if kw == "if":
                self.take()
                self.expect_p("(")
                cond = self.expr()
                self.expect_p(")")
                self.nls()
                then = self.stmt()
                save = self.i
                self.nls()
                if self.at("kw", "else"):
                    self.take()
                    self.nls()
                    return ("if", cond, then, self.stmt())
                self.i = save
                return ("if", cond, then, None)
            if kw == "while":
                self.take()
                self.expect_p("(")
                cond = self.expr()
                self.expect_p(")")
                if self.at_p(";"):
                    self.take()
                    return ("while", cond, ("block", []))
                self.nls()
                return ("while", cond, self.stmt())
            if kw == "do":
                self.take()
                self.nls()
                body = self.stmt()
                self.nls()
                if not self.at("kw", "while"):
                    self.error()
                self.take()
                self.expect_p("(")
                cond = self.expr()
                self.expect_p(")")
                self.simple_end()
                return ("do", body, cond)
            if kw == "for":
                return self.for_stmt()
            if kw in ("break", "continue", "next", "nextfile"):
                self.take()
                self.simple_end()
                return (kw,)
            if kw in ("exit", "return"):
                self.take()
                value = None
                if not (self.at_p(";", "}") or self.at("nl") or self.at("eof")):
                    value = self.expr()
                self.simple_end()
                return (kw, value)
            if kw == "delete":
                self.take()
                name = self.take()
                if name.kind != "name":
                    self.error()
                subs = None
                if self.at_p("["):
                    self.take()
                    subs = self.expr_list()
                    self.expect_p("]")
                self.simple_end()
                return ("delete", name.value, subs)
            if kw in ("print", "printf"):
                return self.print_stmt()
            if kw == "getline":
                raise AwkError("sim-shell: getline is not supported", 2)
        if tok.kind == "punct" and tok.value == ";":
            self.take()
            return ("block", [])
        e = self.expr()
        self.simple_end()
        return ("expr", e)

    def for_stmt(self) -> tuple:
        self.take()
        self.expect_p("(")
        if (self.peek().kind == "name" and self.peek(1).kind == "kw" and self.peek(1).value == "in"
                and self.peek(2).kind == "name" and self.peek(3).kind == "punct" and self.peek(3).value == ")"):
            var = self.take().value
            self.take()
            arr = self.take().value
            self.expect_p(")")
            self.nls()
            return ("forin", var, arr, self.stmt())
        init = None if self.at_p(";") else self.expr()
        self.expect_p(";")
        self.opt_nl()
        cond = None if self.at_p(";") else self.expr()
        self.expect_p(";")
        self.opt_nl()
        step = None if self.at_p(")") else self.expr()
        self.expect_p(")")
        if self.at_p(";"):
            self.take()
            return ("for", init, cond, step, ("block", []))
        self.nls()
        return ("for", init, cond, step, self.stmt())

    def print_stmt(self) -> tuple:
        kw = self.take().value
        args: list = []
        if not (self.at_p(";", "}", ">", ">>", "|") or self.at("nl") or self.at("eof")):
            if self.at_p("("):
                save = self.i
                self.take()
                try:
                    inner = self.expr_list(no_gt=False)
                    self.expect_p(")")
                    if self.at_p(";", "}", ">", ">>", "|") or self.at("nl") or self.at("eof"):
                        args = inner
                    else:
                        raise AwkError("retry")
                except AwkError:
                    self.i = save
                    args = self.expr_list(no_gt=True)
            else:
                args = self.expr_list(no_gt=True)
        dest = None
        if self.at_p(">", ">>"):
            mode = self.take().value
            dest = (mode, self.concat(no_gt=True))
        elif self.at_p("|"):
            raise AwkError("sim-shell: output pipes are not supported", 2)
        self.simple_end()
        if kw == "printf" and not args:
            self.error()
        return (kw, args, dest)

    def expr_list(self, no_gt: bool = False) -> list:
        out = [self.expr(no_gt)]
        while self.at_p(","):
            self.take()
            self.opt_nl()
            out.append(self.expr(no_gt))
        return out

    # --------------------------------------------------------------- expressions
    def expr(self, no_gt: bool = False) -> tuple:
        return self.ternary(no_gt)

    def ternary(self, no_gt: bool) -> tuple:
        cond = self.or_(no_gt)
        if self.at_p("?"):
            self.take()
            self.opt_nl()
            a = self.ternary(no_gt)
            self.opt_nl()
            self.expect_p(":")
            self.opt_nl()
            b = self.ternary(no_gt)
            return ("cond", cond, a, b)
        if self.at_p("=", "+=", "-=", "*=", "/=", "%=", "^=") and cond[0] in ("var", "index", "field"):
            op = self.take().value
            self.opt_nl()
            return ("assign", op, cond, self.ternary(no_gt))
        return cond

    def or_(self, no_gt: bool) -> tuple:
        left = self.and_(no_gt)
        while self.at_p("||"):
            self.take()
            self.opt_nl()
            left = ("or", left, self.and_(no_gt))
        return left

    def and_(self, no_gt: bool) -> tuple:
        left = self.in_(no_gt)
        while self.at_p("&&"):
            self.take()
            self.opt_nl()
            left = ("and", left, self.in_(no_gt))
        return left

    def in_(self, no_gt: bool) -> tuple:
        left = self.match(no_gt)
        while self.at("kw", "in"):
            self.take()
            name = self.take()
            if name.kind != "name":
                self.error()
            left = ("in", [left], name.value)
        return left

    def match(self, no_gt: bool) -> tuple:
        left = self.compare(no_gt)
        while self.at_p("~", "!~"):
            neg = self.take().value == "!~"
            left = ("match", neg, left, self.compare(no_gt))
        return left

    def compare(self, no_gt: bool) -> tuple:
        left = self.concat(no_gt)
        ops = ("<", "<=", "!=", "==", ">=") if no_gt else ("<", "<=", "!=", "==", ">", ">=")
        if self.at_p(*ops):
            op = self.take().value
            return ("cmp", op, left, self.concat(no_gt))
        return left

    def concat(self, no_gt: bool) -> tuple:
        left = self.additive()
        while self._starts_operand():
            left = ("concat", left, self.additive())
        return left

    def _starts_operand(self) -> bool:
        tok = self.peek()
        if tok.kind in ("num", "str", "ere", "name", "func"):
            return True
        if tok.kind == "kw" and tok.value == "in":
            return False
        return tok.kind == "punct" and tok.value in ("$", "!", "(", "-", "+", "++", "--") and tok.value not in (
            "-", "+", "!")

    def additive(self) -> tuple:
        left = self.mul()
        while self.at_p("+", "-"):
            op = self.take().value
            left = ("bin", op, left, self.mul())
        return left

    def mul(self) -> tuple:
        left = self.unary()
        while self.at_p("*", "/", "%"):
            op = self.take().value
            left = ("bin", op, left, self.unary())
        return left

    def unary(self) -> tuple:
        if self.at_p("!"):
            self.take()
            return ("not", self.unary())
        if self.at_p("-", "+"):
            op = self.take().value
            return ("neg" if op == "-" else "pos", self.unary())
        return self.power()

    def power(self) -> tuple:
        base = self.postfix()
        if self.at_p("^"):
            self.take()
            return ("bin", "^", base, self.power_rhs())
        return base

    def power_rhs(self) -> tuple:
        if self.at_p("-", "+", "!"):
            op = self.take().value
            inner = self.power_rhs()
            return ("neg", inner) if op == "-" else (("not", inner) if op == "!" else ("pos", inner))
        return self.power()

    def postfix(self) -> tuple:
        if self.at_p("++", "--"):
            op = self.take().value
            target = self.postfix()
            if target[0] not in ("var", "index", "field"):
                self.error()
            return ("preinc", 1 if op == "++" else -1, target)
        e = self.primary()
        if self.at_p("++", "--") and e[0] in ("var", "index", "field"):
            op = self.take().value
            return ("postinc", 1 if op == "++" else -1, e)
        return e

    def primary(self) -> tuple:
        tok = self.take()
        if tok.kind == "num":
            return ("num", tok.value)
        if tok.kind == "str":
            return ("str", tok.value)
        if tok.kind == "ere":
            return ("ere", tok.value)
        if tok.kind == "punct" and tok.value == "$":
            return ("field", self.postfix_no_inc())
        if tok.kind == "punct" and tok.value == "(":
            items = self.expr_list()
            self.expect_p(")")
            if len(items) > 1:
                if not self.at("kw", "in"):
                    self.error()
                self.take()
                name = self.take()
                return ("in", items, name.value)
            return ("group", items[0])
        if tok.kind == "func":
            return self.builtin_call(str(tok.value))
        if tok.kind == "name":
            if self.at_p("["):
                self.take()
                subs = self.expr_list()
                self.expect_p("]")
                return ("index", tok.value, subs)
            if self.at_p("("):  # a call if the function exists at run time, else concatenation
                self.take()
                args = [] if self.at_p(")") else self.expr_list()
                self.expect_p(")")
                return ("call", tok.value, args)
            return ("var", tok.value)
        self.i -= 1
        self.error()
        raise AssertionError

    def postfix_no_inc(self) -> tuple:
        if self.at_p("++", "--", "-", "+", "!"):
            op = self.take().value
            inner = self.postfix_no_inc()
            return {"++": ("preinc", 1, inner), "--": ("preinc", -1, inner), "-": ("neg", inner),
                    "+": ("pos", inner), "!": ("not", inner)}[op]
        return self.primary()

    def builtin_call(self, name: str) -> tuple:
        if name == "length" and not self.at_p("("):
            return ("builtin", "length", [])
        self.expect_p("(")
        args = [] if self.at_p(")") else self.expr_list()
        self.expect_p(")")
        return ("builtin", name, args)


# ===================================================================== interpreter
class _Next(Exception):
    pass


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Return(Exception):
    def __init__(self, value: object) -> None:
        super().__init__()
        self.value = value


def _to_bytes_str(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("latin-1")


def _from_bytes_str(text: str) -> str:
    return text.encode("latin-1").decode("utf-8", "surrogateescape")


class Interp:
    def __init__(self, sh: Shell, io: IO, prog: Program, assigns: list[tuple[str, str]]) -> None:
        self.sh, self.io, self.prog = sh, io, prog
        self.vars: dict[str, object] = {"FS": " ", "OFS": " ", "ORS": "\n", "NR": 0.0, "NF": 0.0, "FNR": 0.0,
                                        "SUBSEP": "\x1c", "CONVFMT": "%.6g", "OFMT": "%.6g", "RS": "\n",
                                        "FILENAME": "", "RSTART": 0.0, "RLENGTH": -1.0}
        for name, value in assigns:
            self.vars[name] = StrNum(_unescape(value))
        self.record = ""
        self.fields: list[str] | None = []
        self.nf = 0
        self.locals: list[dict[str, object]] = []
        self.files: dict[str, str] = {}
        self.regex_cache: dict[str, re.Pattern] = {}
        self.depth = 0

    # --------------------------------------------------------------- values
    def to_str(self, v: object, fmt: str | None = None) -> str:
        if isinstance(v, str):
            return v
        if v is UNINIT:
            return ""
        if isinstance(v, float):
            return _num_to_str(v, fmt or str(self.vars["CONVFMT"]))
        raise AwkError("can't use array in scalar context")

    def to_num(self, v: object) -> float:
        if isinstance(v, float):
            return v
        if v is UNINIT:
            return 0.0
        if isinstance(v, StrNum) and v.num is not None:
            return v.num
        if isinstance(v, str):
            return _strtod(v)
        raise AwkError("can't use array in scalar context")

    def truthy(self, v: object) -> bool:
        if isinstance(v, float):
            return v != 0
        if isinstance(v, StrNum) and v.num is not None:
            return v.num != 0
        if isinstance(v, str):
            return v != ""
        return False

    @staticmethod
    def numeric(v: object) -> bool:
        return isinstance(v, float) or v is UNINIT or (isinstance(v, StrNum) and v.num is not None)

    # --------------------------------------------------------------- records and fields
    def set_record(self, text: str) -> None:
        self.record = text
        self.fields = None

    def split_record(self) -> list[str]:
        if self.fields is None:
            self.fields = self.split_fs(self.record, self.to_str(self.vars["FS"]))
            self.nf = len(self.fields)
        return self.fields

    def split_fs(self, text: str, fs: str) -> list[str]:
        if fs == " ":  # blanks and newlines only: str.split() would also cut at \xa0, \x85 ...
            return [f for f in re.split(r"[ \t\n]+", text) if f]
        if text == "":
            return []
        if len(fs) == 1 and fs != "\\":
            return text.split(fs)
        if fs == "\t" or fs == "\\t":
            return text.split("\t")
        return self.regex(fs).split(text)

    def get_field(self, i: int) -> object:
        if i < 0:
            raise AwkError(f"negative field index ${i}")
        if i == 0:
            return StrNum(self.record)
        fields = self.split_record()
        return StrNum(fields[i - 1]) if i <= len(fields) else UNINIT

    def set_field(self, i: int, value: str) -> None:
        if i == 0:
            self.set_record(value)
            return
        fields = self.split_record()
        while len(fields) < i:
            fields.append("")
        fields[i - 1] = value
        self.nf = len(fields)
        self.rebuild()

    def rebuild(self) -> None:
        fields = self.split_record()
        self.record = self.to_str(self.vars["OFS"]).join(fields)

    def set_nf(self, n: int) -> None:
        fields = self.split_record()
        if n < len(fields):
            del fields[n:]
        while len(fields) < n:
            fields.append("")
        self.nf = n
        self.rebuild()

    def regex(self, pattern: str) -> re.Pattern:
        rx = self.regex_cache.get(pattern)
        if rx is None:
            try:
                rx = re.compile(posix_to_python(pattern, extended=True, sed_escapes=True), re.DOTALL)
            except (RegexError, re.error) as exc:
                raise AwkError(f"regular expression compile failed ({exc})\n{pattern}") from exc
            self.regex_cache[pattern] = rx
        return rx

    def regex_of(self, e: tuple) -> re.Pattern:
        if e[0] == "ere":
            return self.regex(_unescape_regex(e[1]))
        return self.regex(self.to_str(self.eval(e)))

    # --------------------------------------------------------------- variables
    def lookup(self, name: str) -> object:
        if self.locals and name in self.locals[-1]:
            return self.locals[-1][name]
        if name == "NF":
            self.split_record()
            return float(self.nf)
        return self.vars.get(name, UNINIT)

    def store(self, name: str, value: object) -> None:
        if self.locals and name in self.locals[-1]:
            self.locals[-1][name] = value
        elif name == "NF":
            self.set_nf(int(self.to_num(value)))
        else:
            self.vars[name] = value

    def array(self, name: str) -> dict:
        scope = self.locals[-1] if self.locals and name in self.locals[-1] else self.vars
        arr = scope.get(name, UNINIT)
        if arr is UNINIT:
            arr = {}
            scope[name] = arr
        if not isinstance(arr, dict):
            raise AwkError(f"can't use scalar {name} as array")
        return arr

    def subscript(self, subs: list) -> str:
        sep = self.to_str(self.vars["SUBSEP"])
        return sep.join(self.to_str(self.eval(s)) for s in subs)

    def assign_to(self, target: tuple, value: object) -> object:
        if isinstance(value, dict):
            raise AwkError("can't assign array")
        if target[0] == "var":
            self.store(target[1], value)
        elif target[0] == "index":
            self.array(target[1])[self.subscript(target[2])] = value
        else:
            idx = int(self.to_num(self.eval(target[1])))
            self.set_field(idx, self.to_str(value))
        return value

    # --------------------------------------------------------------- evaluation
    def eval(self, e: tuple) -> object:  # noqa: C901 - one dispatch over the node kinds
        k = e[0]
        if k == "num":
            return e[1]
        if k == "str":
            return e[1]
        if k == "ere":
            return 1.0 if self.regex(_unescape_regex(e[1])).search(self.record) else 0.0
        if k == "group":
            return self.eval(e[1])
        if k == "var":
            v = self.lookup(e[1])
            if isinstance(v, dict):
                raise AwkError(f"can't use array {e[1]} in scalar context")
            return v
        if k == "index":
            arr = self.array(e[1])
            key = self.subscript(e[2])
            if key not in arr:
                arr[key] = UNINIT
            return arr[key]
        if k == "field":
            return self.get_field(int(self.to_num(self.eval(e[1]))))
        if k == "assign":
            return self.eval_assign(e)
        if k == "cond":
            return self.eval(e[2]) if self.truthy(self.eval(e[1])) else self.eval(e[3])
        if k == "or":
            return 1.0 if self.truthy(self.eval(e[1])) or self.truthy(self.eval(e[2])) else 0.0
        if k == "and":
            return 1.0 if self.truthy(self.eval(e[1])) and self.truthy(self.eval(e[2])) else 0.0
        if k == "in":
            key = self.subscript(e[1])
            return 1.0 if key in self.array(e[2]) else 0.0
        if k == "match":
            text = self.to_str(self.eval(e[2]))
            found = self.regex_of(e[3]).search(text) is not None
            return 1.0 if found != e[1] else 0.0
        if k == "cmp":
            return self.eval_cmp(e)
        if k == "concat":
            return self.to_str(self.eval(e[1])) + self.to_str(self.eval(e[2]))
        if k == "bin":
            return self.eval_bin(e[1], self.to_num(self.eval(e[2])), self.to_num(self.eval(e[3])))
        if k == "neg":
            return -self.to_num(self.eval(e[1]))
        if k == "pos":
            return self.to_num(self.eval(e[1]))
        if k == "not":
            return 0.0 if self.truthy(self.eval(e[1])) else 1.0
        if k in ("preinc", "postinc"):
            old = self.to_num(self.eval(e[2]))
            self.assign_to(e[2], old + e[1])
            return old + e[1] if k == "preinc" else old
        if k == "builtin":
            return self.call_builtin(e[1], e[2])
        if k == "call":
            return self.call_user(e[1], e[2])
        raise AwkError(f"internal: unknown node {k}")

    def eval_assign(self, e: tuple) -> object:
        op, target, rhs = e[1], e[2], e[3]
        value = self.eval(rhs)
        if op != "=":
            cur = self.to_num(self.eval(target))
            value = self.eval_bin(op[0], cur, self.to_num(value))
        elif isinstance(value, StrNum):
            value = StrNum(str(value))
        return self.assign_to(target, value)

    def eval_cmp(self, e: tuple) -> float:
        a, b = self.eval(e[2]), self.eval(e[3])
        if self.numeric(a) and self.numeric(b):
            x, y = self.to_num(a), self.to_num(b)
        else:
            x, y = self.to_str(a), self.to_str(b)  # type: ignore[assignment]
        op = e[1]
        result = {"<": x < y, "<=": x <= y, "==": x == y, "!=": x != y, ">": x > y, ">=": x >= y}[op]
        return 1.0 if result else 0.0

    @staticmethod
    def eval_bin(op: str, x: float, y: float) -> float:
        try:
            if op == "+":
                return x + y
            if op == "-":
                return x - y
            if op == "*":
                return x * y
            if op == "/":
                if y == 0:
                    return -math.nan if x == 0 or math.isnan(x) else math.copysign(math.inf, x) * math.copysign(1, y)
                return x / y
            if op == "%":
                if y == 0 or math.isinf(x):
                    return -math.nan
                return math.fmod(x, y)
            if op == "^":
                return _power(x, y)
        except OverflowError:
            return math.inf
        raise AwkError(f"internal: operator {op}")

    # --------------------------------------------------------------- built-ins
    def call_builtin(self, name: str, args: list) -> object:  # noqa: C901
        ev = [lambda a=a: self.eval(a) for a in args]
        if name == "length":
            if not args:
                return float(len(self.record))
            if args[0][0] == "var" and isinstance(self.lookup(args[0][1]), dict):
                return float(len(self.lookup(args[0][1])))  # type: ignore[arg-type]
            return float(len(self.to_str(ev[0]())))
        if name == "substr":
            return self.substr(args)
        if name == "index":
            return float(self.to_str(ev[0]()).find(self.to_str(ev[1]())) + 1)
        if name == "split":
            return self.split_builtin(args)
        if name in ("sub", "gsub"):
            return self.substitute(name == "gsub", args)
        if name == "match":
            text = self.to_str(ev[0]())
            m = self.regex_of(args[1]).search(text)
            self.vars["RSTART"] = float(m.start() + 1) if m else 0.0
            self.vars["RLENGTH"] = float(m.end() - m.start()) if m else -1.0
            return self.vars["RSTART"]
        if name == "sprintf":
            if not args:
                raise AwkError("sprintf: not enough arguments")
            return self.format(self.to_str(ev[0]()), [f() for f in ev[1:]])
        if name in ("tolower", "toupper"):
            s = self.to_str(ev[0]())
            table = str.maketrans(*(("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
                                    if name == "tolower" else
                                    ("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")))
            return s.translate(table)
        if name == "int":
            x = self.to_num(ev[0]())
            return float(math.trunc(x)) if math.isfinite(x) else x
        if name in ("sin", "cos", "exp", "log", "sqrt"):
            return _math(name, self.to_num(ev[0]()))
        if name == "atan2":
            return math.atan2(self.to_num(ev[0]()), self.to_num(ev[1]()))
        if name in ("close", "fflush"):
            return 0.0
        raise AwkError(f"sim-shell: {name}() is not supported")

    def substr(self, args: list) -> str:
        s = self.to_str(self.eval(args[0]))
        start = self.to_num(self.eval(args[1]))
        length = self.to_num(self.eval(args[2])) if len(args) > 2 else math.inf
        if math.isnan(start) or math.isnan(length):
            return ""
        # mawk: positions trunc(m) up to trunc(m + n), exclusive, clipped to 1..len
        lo = math.trunc(start) if math.isfinite(start) else (1 if start < 0 else len(s) + 1)
        end = start + length
        hi = len(s) + 1 if math.isinf(end) and end > 0 else (math.trunc(end) if math.isfinite(end) else lo)
        first, last = max(lo, 1), min(hi, len(s) + 1)
        if last <= first:
            return ""
        return s[first - 1:last - 1]

    def split_builtin(self, args: list) -> float:
        s = self.to_str(self.eval(args[0]))
        if args[1][0] != "var":
            raise AwkError("split: second argument must be an array")
        arr = self.array(args[1][1])
        arr.clear()
        if len(args) > 2:
            sep = self.regex_of(args[2]) if args[2][0] == "ere" else self.to_str(self.eval(args[2]))
        else:
            sep = self.to_str(self.vars["FS"])
        parts = sep.split(s) if isinstance(sep, re.Pattern) else self.split_fs(s, sep)
        if s == "":
            parts = []
        for i, p in enumerate(parts, 1):
            arr[self.to_str(float(i))] = StrNum(p)
        return float(len(parts))

    def substitute(self, global_: bool, args: list) -> float:
        rx = self.regex_of(args[0])
        repl = self.to_str(self.eval(args[1]))
        target = args[2] if len(args) > 2 else ("field", ("num", 0.0))
        text = self.to_str(self.eval(target))
        count = 0

        def expand(m: re.Match) -> str:
            nonlocal count
            count += 1
            out, i = [], 0
            while i < len(repl):
                c = repl[i]
                if c == "\\" and i + 1 < len(repl) and repl[i + 1] in "&\\":
                    out.append(repl[i + 1])
                    i += 2
                elif c == "&":
                    out.append(m.group(0))
                    i += 1
                else:
                    out.append(c)
                    i += 1
            return "".join(out)

        new = rx.sub(expand, text, count=0 if global_ else 1)
        if count:
            self.assign_to(target, new)
        return float(count)

    def format(self, fmt: str, values: list) -> str:
        out: list[str] = []
        i, k = 0, 0
        for m in re.finditer(r"%([-+ #0]*)(\*|\d+)?(?:\.(\*|\d*))?([a-zA-Z%])|%$", fmt):
            out.append(fmt[i:m.start()])
            i = m.end()
            conv = m.group(4)
            if conv == "%":
                out.append("%")
                continue
            if conv is None or conv not in "cdiouxXeEfFgGs":
                out.append(m.group(0))
                continue
            flags, width, prec = m.group(1), m.group(2), m.group(3)
            if width == "*":
                if k >= len(values):
                    raise AwkError(f'not enough arguments passed to sprintf("{fmt}")')
                width = str(int(self.to_num(values[k])))
                k += 1
            if prec == "*":
                if k >= len(values):
                    raise AwkError(f'not enough arguments passed to sprintf("{fmt}")')
                prec = str(int(self.to_num(values[k])))
                k += 1
            if k >= len(values):
                raise AwkError(f'not enough arguments passed to printf("{fmt}")')
            v = values[k]
            k += 1
            spec = "%" + flags + (width or "") + ("." + prec if prec is not None else "")
            out.append(self.format_one(spec, conv, v))
        out.append(fmt[i:])
        return "".join(out)

    def format_one(self, spec: str, conv: str, v: object) -> str:
        if conv == "s":
            return (spec + "s") % self.to_str(v)
        if conv == "c":
            if self.numeric(v) and not isinstance(v, StrNum):
                ch = chr(int(self.to_num(v)) & 0xFF)
            else:
                ch = self.to_str(v)[:1]
            return (spec + "s") % ch
        x = self.to_num(v)
        if conv in "diouxX":
            if not math.isfinite(x):
                return _c_format(spec + "f", [x]).replace(".000000", "")
            n = int(x)
            if conv in "ouxX" and n < 0:
                n &= (1 << 64) - 1
            return (spec + ("d" if conv in "iu" else conv)) % n
        return _c_format(spec + conv, [x])

    # --------------------------------------------------------------- statements
    def run_block(self, stmts: list) -> None:
        for s in stmts:
            self.exec(s)

    def exec(self, s: tuple) -> None:  # noqa: C901
        k = s[0]
        if k == "expr":
            self.eval(s[1])
        elif k == "block":
            self.run_block(s[1])
        elif k in ("print", "printf"):
            self.exec_print(s)
        elif k == "if":
            if self.truthy(self.eval(s[1])):
                self.exec(s[2])
            elif s[3] is not None:
                self.exec(s[3])
        elif k == "while":
            while self.truthy(self.eval(s[1])):
                if self._loop_body(s[2]):
                    break
        elif k == "do":
            while True:
                if self._loop_body(s[1]) or not self.truthy(self.eval(s[2])):
                    break
        elif k == "for":
            if s[1] is not None:
                self.eval(s[1])
            while s[2] is None or self.truthy(self.eval(s[2])):
                if self._loop_body(s[4]):
                    break
                if s[3] is not None:
                    self.eval(s[3])
        elif k == "forin":
            for key in list(self.array(s[2])):
                self.store(s[1], StrNum(key))
                if self._loop_body(s[3]):
                    break
        elif k == "break":
            raise _Break()
        elif k == "continue":
            raise _Continue()
        elif k in ("next", "nextfile"):
            raise _Next()
        elif k == "exit":
            raise _Exit(int(self.to_num(self.eval(s[1]))) & 255 if s[1] is not None else 0)
        elif k == "return":
            raise _Return(self.eval(s[1]) if s[1] is not None else UNINIT)
        elif k == "delete":
            arr = self.array(s[1])
            if s[2] is None:
                arr.clear()
            else:
                arr.pop(self.subscript(s[2]), None)

    def _loop_body(self, body: tuple) -> bool:
        """Run one iteration; True when the loop must stop (``break``)."""
        try:
            self.exec(body)
        except _Break:
            return True
        except _Continue:
            pass
        return False

    def exec_print(self, s: tuple) -> None:
        kind, args, dest = s
        if kind == "print":
            values = [self.eval(a) for a in args] if args else [StrNum(self.record)]
            ofmt = self.to_str(self.vars["OFMT"])
            parts = [self.to_str(v, ofmt) if isinstance(v, float) else self.to_str(v) for v in values]
            text = self.to_str(self.vars["OFS"]).join(parts) + self.to_str(self.vars["ORS"])
        else:
            values = [self.eval(a) for a in args]
            text = self.format(self.to_str(values[0]), values[1:])
        if dest is None:
            self.io.out.write(_from_bytes_str(text))
            return
        mode, target = dest
        name = self.to_str(self.eval(target))
        if name == "/dev/stdout" or name == "-":
            self.io.out.write(_from_bytes_str(text))
        elif name == "/dev/stderr":
            self.io.err.write(_from_bytes_str(text))
        else:
            path = _from_bytes_str(name)
            r = self.sh.resolve(path)
            append = mode == ">>" or path in self.files
            self.files[path] = ""
            try:
                self.sh.fs.write(r, _from_bytes_str(text), append=append)
            except FsError as exc:
                raise AwkError(f'cannot open "{path}" for output ({exc.strerror})') from exc

    def call_user(self, name: str, args: list) -> object:
        if name not in self.prog.functions:
            if len(args) == 1:  # "x (y)" with no function x: concatenation
                return self.to_str(self.eval(("var", name))) + self.to_str(self.eval(args[0]))
            raise AwkError(f"function {name} never defined")
        params, body = self.prog.functions[name]
        if len(args) > len(params):
            raise AwkError(f"too many arguments in call to {name}")
        frame: dict[str, object] = {}
        for p, a in zip(params, args):
            if a[0] == "var" and isinstance(self.lookup(a[1]), dict):
                frame[p] = self.lookup(a[1])
            else:
                frame[p] = self.eval(a)
        for p in params[len(args):]:
            frame[p] = UNINIT
        self.depth += 1
        if self.depth > 200:
            raise AwkError("function call nesting too deep")
        self.locals.append(frame)
        try:
            self.run_block(body)
            return UNINIT
        except _Return as r:
            return r.value
        finally:
            self.locals.pop()
            self.depth -= 1

    # --------------------------------------------------------------- main loop
    def run(self, inputs: list[tuple[str, str]]) -> int:
        code = 0
        try:
            try:
                for rule in self.prog.begin:
                    self.run_block(rule.action or [])
                if self.prog.main or self.prog.end:
                    self.main_loop(inputs)
            except _Exit as exc:
                code = exc.code
            try:
                for rule in self.prog.end:
                    self.run_block(rule.action or [])
            except _Exit as exc:
                code = exc.code
        except _Next as exc:
            raise AwkError("improper use of next") from exc
        return code

    def main_loop(self, inputs: list[tuple[str, str]]) -> None:
        for name, text in inputs:
            self.vars["FILENAME"] = name
            self.vars["FNR"] = 0.0
            pieces = text.split("\n")
            if pieces and pieces[-1] == "":
                pieces.pop()
            for line in pieces:
                self.vars["NR"] = self.to_num(self.vars["NR"]) + 1
                self.vars["FNR"] = self.to_num(self.vars["FNR"]) + 1
                self.set_record(line)
                try:
                    self.run_rules()
                except _Next:
                    continue

    def run_rules(self) -> None:
        for rule in self.prog.main:
            if rule.kind == "range":
                if not rule.in_range:
                    if not self.truthy(self.eval(rule.pattern)):  # type: ignore[arg-type]
                        continue
                    rule.in_range = True
                if self.truthy(self.eval(rule.pattern2)):  # type: ignore[arg-type]
                    rule.in_range = False
            elif rule.pattern is not None and not self.truthy(self.eval(rule.pattern)):  # type: ignore[arg-type]
                continue
            if rule.action is None:
                self.io.out.write(_from_bytes_str(self.record + self.to_str(self.vars["ORS"])))
            else:
                self.run_block(rule.action)


def _unescape_regex(text: str) -> str:
    return text.replace("\\/", "/")


def _power(x: float, y: float) -> float:
    try:
        return math.pow(x, y)
    except ValueError:
        return -math.nan
    except OverflowError:
        return math.inf


def _math(name: str, x: float) -> float:
    try:
        return float(getattr(math, name)(x))
    except ValueError:
        if name == "log" and x == 0:
            return -math.inf
        return -math.nan
    except OverflowError:
        return math.inf


def cmd_awk(sh: Shell, args: list[str], io: IO) -> int:
    fs: str | None = None
    assigns: list[tuple[str, str]] = []
    i = 0
    program_text: str | None = None
    while i < len(args):
        a = args[i]
        if a == "--":
            i += 1
            break
        if a.startswith("-F"):
            fs = a[2:] if len(a) > 2 else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if len(a) > 2 else 2
        elif a.startswith("-v"):
            spec = a[2:] if len(a) > 2 else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if len(a) > 2 else 2
            name, eq, value = spec.partition("=")
            if not eq or not name.isidentifier():
                io.err.write(f"awk: improper assignment: -v {spec}\n")
                return 2
            assigns.append((name, _to_bytes_str(value)))
        elif a.startswith("-f"):
            path = a[2:] if len(a) > 2 else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if len(a) > 2 else 2
            try:
                program_text = (program_text or "") + sh.fs.read(sh.resolve(path)) + "\n"
            except FsError:
                io.err.write(f"awk: couldn't open file {path}\n")
                return 2
        elif a.startswith("-") and len(a) > 1:
            io.err.write(f"awk: not an option: {a}\n")
            return 2
        else:
            break
    rest = args[i:]
    if program_text is None:
        if not rest:
            io.err.write("usage: awk [-F value] [-v var=value] [--] 'program text' [file ...]\n")
            return 2
        program_text, rest = rest[0], rest[1:]
    try:
        prog = Parser(tokenize(_to_bytes_str(program_text))).program()
    except AwkError as exc:
        io.err.write(f"awk: {exc}\n")
        return exc.code
    interp = Interp(sh, io, prog, assigns)
    if fs is not None:
        interp.vars["FS"] = _unescape(_to_bytes_str(fs))
    return _run_interp(sh, io, interp, rest)


def _run_interp(sh: Shell, io: IO, interp: Interp, operands: list[str]) -> int:
    inputs: list[tuple[str, str]] = []
    files = [op for op in operands if not re.match(r"[A-Za-z_][A-Za-z0-9_]*=", op)] or ["-"]
    for op in files:
        try:
            text = io.stdin if op in ("-", "/dev/stdin") else sh.fs.read(sh.resolve(op))
        except FsError:
            io.err.write(f"awk: cannot open {op} (No such file or directory)\n")
            return 2
        inputs.append((op if op != "-" else "", _to_bytes_str(text)))
    try:
        return interp.run(inputs)
    except AwkError as exc:
        io.err.write(f"awk: run time error: {exc}\n")
        io.err.write(f"\tFILENAME=\"{interp.to_str(interp.vars['FILENAME'])}\" "
                     f"FNR={interp.to_str(interp.vars['FNR'])} NR={interp.to_str(interp.vars['NR'])}\n")
        return 2
    except RecursionError:
        io.err.write("awk: sim-shell: expression nesting too deep\n")
        return 2


AWK = {"awk": cmd_awk, "mawk": cmd_awk}
