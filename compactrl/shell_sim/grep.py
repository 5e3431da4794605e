"""GNU grep 3.x: BRE/ERE/fixed patterns, the common output modes, context and recursion.

``-r`` visits files in code point order; real grep uses directory order, so recursive outputs
agree as sets of lines (compare through ``| sort``).
"""

from __future__ import annotations

import posixpath
import re

from compactrl.shell_sim.common import getopt, read_input, split_lines
from compactrl.shell_sim.fs import FsError
from compactrl.shell_sim.regex import RegexError, fnmatch_to_regex, posix_to_python
from compactrl.shell_sim.shell import IO, Shell

_USAGE = "Usage: grep [OPTION]... PATTERNS [FILE]..."
_LONG = {
    "extended-regexp": "E", "fixed-strings": "F", "basic-regexp": "G", "ignore-case": "i", "invert-match": "v",
    "count": "c", "files-with-matches": "l", "files-without-match": "L", "line-number": "n",
    "no-filename": "h", "with-filename": "H", "only-matching": "o", "quiet": "q", "silent": "q",
    "no-messages": "s", "recursive": "r", "dereference-recursive": "R", "word-regexp": "w",
    "line-regexp": "x", "regexp=": "e", "file=": "f", "max-count=": "m", "after-context=": "A",
    "before-context=": "B", "context=": "C", "include=": "I", "exclude=": "X", "color=": "K",
    "colour=": "K", "color": "K",
}


def _compile(o, patterns: list[str]) -> re.Pattern:
    fixed, extended = o.has("F"), o.has("E")
    pieces = []
    for p in patterns:
        pieces.append(re.escape(p) if fixed else _translate(p, extended))
    body = "|".join(f"(?:{p})" for p in pieces) if len(pieces) > 1 else pieces[0]
    if o.has("x"):
        body = f"^(?:{body})$"
    elif o.has("w"):
        body = rf"(?<!\w)(?:{body})(?!\w)"
    return re.compile(body, re.IGNORECASE if (o.has("i") or o.has("y")) else 0)


def _translate(p: str, extended: bool) -> str:
    return posix_to_python(p, extended)


def cmd_grep(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("grep", args, "EFGiyvclLnhHoqsrRwxe:f:m:A:B:C:0123456789", io, long=_LONG, code=2,
               usage=_USAGE)
    digits = "".join(f for f, _ in o.flags if f.isdigit())  # -NUM means --context=NUM
    if digits:
        o.flags.append(("C", digits))
    if len({f for f, _ in o.flags if f in "EFG"}) > 1:
        io.err.write("grep: conflicting matchers specified\n")
        return 2
    patterns = o.all("e")
    for pf in o.all("f"):
        try:
            patterns.extend(split_lines(read_input(sh, io, pf)))
        except FsError as exc:
            io.err.write(f"grep: {pf}: {exc.strerror}\n")
            return 2
    operands = o.operands
    if not patterns and not o.has("f"):
        if not operands:
            io.err.write(_USAGE + "\nTry 'grep --help' for more information.\n")
            return 2
        patterns, operands = [operands[0]], operands[1:]
    patterns = [line for p in patterns for line in p.split("\n")]
    try:
        rx = _compile(o, patterns) if patterns else re.compile(r"(?!)")
    except (RegexError, re.error) as exc:
        io.err.write(f"grep: {exc}\n")
        return 2
    recursive = o.has("r") or o.has("R")
    files = _expand_operands(sh, operands, recursive)
    # GNU grep names files when it has several operands or actually recursed into a directory
    recursed = recursive and (not operands or any(sh.fs.is_dir(sh.resolve(op)) for op in operands if op != "-"))
    multi = len(files) > 1 or len(operands) > 1 or recursed
    with_name = (multi or o.has("H")) and not o.has("h")
    state = {"selected": False, "error": False}
    for path, display in files:
        if not _include(o, path) and (path == "-" or sh.fs.exists(sh.resolve(path))):
            continue  # a missing file is reported even when the globs would skip it
        _grep_one(sh, io, o, rx, path, display, with_name, state)
        if state["selected"] and o.has("q"):
            return 0
    if state["error"] and not (o.has("q") and state["selected"]):
        return 2
    return 0 if state["selected"] else 1


def _include(o, path: str) -> bool:
    name = posixpath.basename(path)
    inc, exc = o.all("I"), o.all("X")
    if inc and not any(re.fullmatch(fnmatch_to_regex(g, pathname=False), name, re.DOTALL) for g in inc):
        return False
    return not any(re.fullmatch(fnmatch_to_regex(g, pathname=False), name, re.DOTALL) for g in exc)


def _expand_operands(sh: Shell, operands: list[str], recursive: bool) -> list[tuple[str, str]]:
    """(path to read, name to print) for every input; directories expanded under ``-r``."""
    if not operands:
        if not recursive:
            return [("-", "(standard input)")]
        return [(p, p) for p in sh.fs.walk(sh.resolve(".")) if sh.fs.is_file(sh.resolve(p))]
    out = []
    for op in operands:
        r = sh.resolve(op)
        if recursive and sh.fs.is_dir(r) and op != "-":
            base = op if op.endswith("/") else op + "/"
            out.extend((base + p, base + p) for p in sh.fs.walk(r) if sh.fs.is_file(sh.resolve(base + p)))
        else:
            out.append((op, "(standard input)" if op == "-" else op))
    return out


def _grep_one(sh: Shell, io: IO, o, rx: re.Pattern, path: str, display: str, with_name: bool,
              state: dict) -> None:
    try:
        text = read_input(sh, io, path)
    except FsError as exc:
        if not o.has("s"):
            io.err.write(f"grep: {path}: {exc.strerror}\n")  # grep prints names as they are
        state["error"] = True
        if o.has("c") and exc.strerror == "Is a directory":  # GNU still counts it: no lines
            io.out.write(f"{display}:0\n" if with_name else "0\n")
        return
    lines = split_lines(text)
    invert = o.has("v")
    limit = int(o.last("m")) if o.last("m") is not None else None
    hits = []
    for i, line in enumerate(lines):
        if limit is not None and len(hits) >= limit:
            break
        if (rx.search(line) is not None) != invert:
            hits.append(i)
    if hits:
        state["selected"] = True
    if o.has("q"):
        return
    prefix = f"{display}:" if with_name else ""
    if o.has("l") or o.has("L"):
        if bool(hits) == o.has("l"):
            io.out.write(display + "\n")
        return
    if o.has("c"):
        io.out.write(f"{prefix}{len(hits)}\n")
        return
    _print_hits(io, o, rx, lines, hits, display if with_name else None, state)


def _print_hits(io: IO, o, rx: re.Pattern, lines: list[str], hits: list[int], name: str | None,
                state: dict) -> None:
    after = int(o.last("A") or o.last("C") or 0)
    before = int(o.last("B") or o.last("C") or 0)
    number = o.has("n")
    out: list[str] = []

    def emit(i: int, sep: str) -> None:
        head = (f"{name}{sep}" if name is not None else "") + (f"{i + 1}{sep}" if number else "")
        if o.has("o"):
            if sep == ":" and not o.has("v"):
                for m in rx.finditer(lines[i]):
                    if m.group(0):
                        out.append(f"{head}{m.group(0)}\n")
            return
        out.append(f"{head}{lines[i]}\n")

    if not (after or before):
        for i in hits:
            emit(i, ":")
        io.out.write("".join(out))
        return
    hit_set, last_printed = set(hits), -1
    for i in hits:
        start = max(i - before, last_printed + 1)
        # "--" separates context groups, also across files
        if (last_printed >= 0 and start > last_printed + 1) or (last_printed < 0 and state.get("context")):
            out.append("--\n")
        state["context"] = True
        for j in range(start, i):
            emit(j, ":" if j in hit_set else "-")
        emit(i, ":")
        last_printed = i
        j = i + 1
        while j < len(lines) and j <= i + after and j not in hit_set:
            emit(j, "-")
            last_printed = j
            j += 1
    io.out.write("".join(out))


GREP = {"grep": cmd_grep, "egrep": lambda sh, a, io: cmd_grep(sh, ["-E", *a], io),
        "fgrep": lambda sh, a, io: cmd_grep(sh, ["-F", *a], io)}
