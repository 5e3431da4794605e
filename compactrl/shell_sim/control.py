"""Compound commands (``if``, loops, ``case``, groups, subshells, ``((...))``, ``[[ ... ]]``),
shell functions and the parameter operators that transform a value (``${v%.*}``, ``${v/a/b}``...).

The top layer of the interpreter: it builds on ``shell`` (the executor), ``builtins`` and ``cond``
and hands itself to the executor as :data:`GRAMMAR`.

Every loop iteration and function call ticks the command line's :class:`Limits`, so a runaway loop
or recursion ends like a timeout on the real backends instead of hanging the episode.
"""

from __future__ import annotations

import re

from compactrl.shell_sim.cond import CondError, evaluate_cond
from compactrl.shell_sim.parser import AndOr, Compound, Part
from compactrl.shell_sim.regex import fnmatch_to_regex
from compactrl.shell_sim.shell import (
    IO,
    AbortCommand,
    Grammar,
    InStream,
    LoopControl,
    ReturnFromFunction,
    Shell,
    Sink,
    TerminalSink,
    brace_expand,
    pattern_regex,
)


def run_compound(sh: Shell, node: Compound, inp: InStream, out: Sink, err: Sink) -> int:
    if node.kind == "func":
        sh.functions[node.name] = node.func_body  # type: ignore[assignment]
        return 0
    sh.line = node.line
    io = IO(inp, out, err)
    if node.redirects and not sh.apply_redirects(node.redirects, io):
        return 1
    return _RUNNERS[node.kind](sh, node, io.stream, io.out, io.err)


def _condition(sh: Shell, nodes: list[AndOr], inp: InStream, out: Sink, err: Sink) -> int:
    sh.errexit_off += 1
    try:
        return sh.run_list(nodes, inp, out, err)
    finally:
        sh.errexit_off -= 1


def _run_if(sh: Shell, node: Compound, inp: InStream, out: Sink, err: Sink) -> int:
    for cond, body in node.clauses:
        if _condition(sh, cond, inp, out, err) == 0:
            return sh.run_list(body, inp, out, err)
    return sh.run_list(node.body, inp, out, err) if node.body else 0


class _Loop:
    """Runs a loop body, turning ``break``/``continue`` into a verdict for the loop."""

    def __init__(self, sh: Shell) -> None:
        self.sh = sh
        self.status = 0

    def body(self, nodes: list[AndOr], inp: InStream, out: Sink, err: Sink) -> bool:
        """Run one iteration; False when the loop must stop."""
        self.sh.limits.tick()
        self.sh.loop_depth += 1
        try:
            self.status = self.sh.run_list(nodes, inp, out, err)
        except LoopControl as exc:
            if exc.levels > 1:
                exc.levels -= 1
                raise
            return exc.kind == "continue"
        finally:
            self.sh.loop_depth -= 1
        return True


def _run_for(sh: Shell, node: Compound, inp: InStream, out: Sink, err: Sink) -> int:
    if node.words is None:
        items = list(sh.positional)
    else:
        items = []
        for w in node.words:
            for part in brace_expand(w):
                items.extend(sh.expand_word(part))
    loop = _Loop(sh)
    for item in items:
        sh.set_var(node.name, item)
        if not loop.body(node.body, inp, out, err):
            break
    return loop.status


def _run_arith_for(sh: Shell, node: Compound, inp: InStream, out: Sink, err: Sink) -> int:
    init, test, step = node.exprs
    if init:
        sh.arith(init, err, "((: ")
    loop = _Loop(sh)
    while not test or sh.arith(test, err, "((: "):
        if not loop.body(node.body, inp, out, err):
            break
        if step:
            sh.arith(step, err, "((: ")
    return loop.status


def _run_while(sh: Shell, node: Compound, inp: InStream, out: Sink, err: Sink) -> int:
    cond, body = node.clauses[0]
    until = node.kind == "until"
    loop = _Loop(sh)
    while True:
        if (_condition(sh, cond, inp, out, err) == 0) == until:
            break
        if not loop.body(body, inp, out, err):
            break
    return loop.status


def _run_case(sh: Shell, node: Compound, inp: InStream, out: Sink, err: Sink) -> int:
    assert node.subject is not None
    subject = sh.expand_word(node.subject, split=False)[0]
    for patterns, body, _ in node.items:
        for pat in patterns:
            if pattern_regex(sh, pat).fullmatch(subject):
                return sh.run_list(body, inp, out, err) if body else 0
    return 0


def _run_group(sh: Shell, node: Compound, inp: InStream, out: Sink, err: Sink) -> int:
    return sh.run_list(node.body, inp, out, err)


def _run_subshell(sh: Shell, node: Compound, inp: InStream, out: Sink, err: Sink) -> int:
    sub = sh.subshell()
    return sub.run_in_subshell(Compound("group", node.line, body=node.body), inp, out, err)


def _run_arith(sh: Shell, node: Compound, inp: InStream, out: Sink, err: Sink) -> int:
    try:
        return 0 if sh.arith(node.exprs[0], err, "((: ") else 1
    except AbortCommand:
        return 1


def _run_cond(sh: Shell, node: Compound, inp: InStream, out: Sink, err: Sink) -> int:
    try:
        return 0 if evaluate_cond(sh, node.cond) else 1
    except CondError as exc:
        sh.shell_error(err, str(exc))
        return 2


_RUNNERS = {"if": _run_if, "for": _run_for, "arith_for": _run_arith_for, "while": _run_while,
            "until": _run_while, "case": _run_case, "group": _run_group, "subshell": _run_subshell,
            "arith": _run_arith, "cond": _run_cond}


# ===================================================================== functions
def call_function(sh: Shell, name: str, args: list[str], io: IO) -> int:
    sh.limits.tick()  # depth bounds recursion; this bounds its breadth (f() { f; f; })
    body = sh.functions[name]
    if len(sh.scopes) >= sh.limits.max_depth:
        sh.shell_error(io.err, f"{name}: maximum function nesting level exceeded ({sh.limits.max_depth})")
        raise AbortCommand(1)
    saved_positional, saved_loop = sh.positional, sh.loop_depth
    sh.positional, sh.loop_depth = list(args), 0
    sh.scopes.append({})
    try:
        return sh.run_node(body, io.stream, io.out, io.err)
    except ReturnFromFunction as exc:
        return exc.code
    finally:
        for var, value in sh.scopes.pop().items():
            if value is None:
                sh.vars.pop(var, None)
            else:
                sh.vars[var] = value
        sh.positional, sh.loop_depth = saved_positional, saved_loop


# ===================================================================== ${NAME<op>ARG}
def _pattern(sh: Shell, arg: str) -> tuple[str, list[bool]]:
    """The pattern argument of ``#``, ``%``, ``/``: expanded, with quoted characters literal."""
    chars: list[str] = []
    mask: list[bool] = []
    for p in sh.lex(arg):
        text = sh.param_op(p) if p.var else p.text
        chars.append(text)
        mask.extend([p.quoted] * len(text))
    return "".join(chars), mask


def _strip(value: str, regex: re.Pattern, op: str) -> str:
    spans = range(len(value) + 1)
    if op in ("#", "##"):
        order = reversed(spans) if op == "##" else spans
        for k in order:
            if regex.fullmatch(value, 0, k):
                return value[k:]
        return value
    order = spans if op == "%%" else reversed(spans)
    for k in order:
        if regex.fullmatch(value, k):
            return value[:k]
    return value


def _replace(value: str, regex: re.Pattern, op: str, repl: str) -> str:
    n = len(value)
    if op == "/#":
        for k in range(n, -1, -1):
            if regex.fullmatch(value, 0, k):
                return repl + value[k:]
        return value
    if op == "/%":
        for k in range(n + 1):
            if regex.fullmatch(value, k):
                return value[:k] + repl
        return value
    out, i = [], 0
    while i <= n:
        end = next((k for k in range(n, i, -1) if regex.fullmatch(value, i, k)), None)
        if end is None:
            if i < n:
                out.append(value[i])
            i += 1
            continue
        out.append(repl)
        i = end
        if op == "/":
            out.append(value[i:])
            break
    return "".join(out)


def _substring(sh: Shell, value: str, arg: str) -> str:
    offset_s, _, length_s = arg.partition(":")
    offset = sh.arith(offset_s or "0")
    if offset < 0:
        offset = max(len(value) + offset, 0) if len(value) + offset >= 0 else len(value) + 1
    if offset > len(value):
        return ""
    if not _:
        return value[offset:]
    length = sh.arith(length_s or "0")
    if length < 0:
        end = len(value) + length
        if end < offset:
            sh.shell_error(TerminalSink(sh.term, 2), f"{length_s.strip()}: substring expression < 0")
            raise AbortCommand(1)
        return value[offset:end]
    return value[offset:offset + length]


def param_transform(sh: Shell, p: Part, value: str) -> str:
    op = p.op
    if op == ":":
        return _substring(sh, value, p.arg)
    if op in ("^^", ",,", "^", ","):
        upper = op[0] == "^"
        if len(op) == 2:
            return value.upper() if upper else value.lower()
        return (value[:1].upper() if upper else value[:1].lower()) + value[1:]
    if op in ("#", "##", "%", "%%"):
        text, mask = _pattern(sh, p.arg)
        return _strip(value, re.compile(fnmatch_to_regex(text, mask, pathname=False), re.DOTALL), op)
    pat_src, _, repl_src = _split_replacement(p.arg)
    text, mask = _pattern(sh, pat_src)
    if not text:
        return value
    repl = sh.expand_text(repl_src)
    return _replace(value, re.compile(fnmatch_to_regex(text, mask, pathname=False), re.DOTALL), op, repl)


def _split_replacement(arg: str) -> tuple[str, str, str]:
    """``pattern/replacement`` split at the first unescaped, unquoted ``/``."""
    i, quote = 0, ""
    while i < len(arg):
        c = arg[i]
        if c == "\\" and not quote:
            i += 2
            continue
        if c in "'\"" and (not quote or quote == c):
            quote = "" if quote else c
        elif c == "/" and not quote:
            return arg[:i], "/", arg[i + 1:]
        i += 1
    return arg, "", ""


GRAMMAR = Grammar(run_compound=run_compound, call_function=call_function, param_transform=param_transform)
"""This layer as the executor calls it (``Shell(..., grammar=GRAMMAR)``)."""
