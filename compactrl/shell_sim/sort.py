"""GNU ``sort`` (coreutils 9.x) in ``LC_ALL=C.UTF-8``: keys, field separators, numeric order.

Follows sort.c: each ``-k`` key is located with ``begfield``/``limfield``; a key without its own
ordering options inherits the global ones; lines equal on every key are ordered by the whole line
(the "last resort") unless ``-s`` or ``-u``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from compactrl.shell_sim.common import getopt, join_lines, read_input, split_lines
from compactrl.shell_sim.fs import EISDIR, FsError, quote_locale, quote_shell
from compactrl.shell_sim.shell import IO, Shell, UsageError

_BLANK = " \t"
_ORDER_FLAGS = "bdfginrM"
_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass
class Key:
    sword: int | None  # 0-based start field; None = line start
    schar: int
    eword: int | None  # 0-based end field; None = line end
    echar: int
    flags: set[str]
    skip_start_blanks: bool = False
    skip_end_blanks: bool = False


def _badspec(spec: str, why: str, io: IO) -> None:
    io.err.write(f"sort: {why}: invalid field specification {quote_locale(spec)}\n")
    raise UsageError(2)


def _parse_pos(text: str, spec: str, io: IO, start: bool) -> tuple[int, int, str, str]:
    m = re.match(r"(\d*)(?:\.(\d*))?([a-zA-Z]*)", text)
    assert m is not None
    field, char, opts = m.group(1), m.group(2), m.group(3)
    if not field:
        where = "field start" if start else "after ','"
        io.err.write(f"sort: invalid number {'at' if start else ''} {where}: invalid count at start of "
                     f"{quote_locale(text)}\n".replace("  ", " "))
        raise UsageError(2)
    if int(field) == 0:
        _badspec(spec, "field number is zero", io)
    if char is not None and char != "" and int(char) == 0 and start:
        _badspec(spec, "character offset is zero", io)
    bad = [c for c in opts if c not in _ORDER_FLAGS]
    if bad:
        io.err.write(f"sort: stray character in field spec: invalid field specification {quote_locale(spec)}\n")
        raise UsageError(2)
    return int(field), int(char or 0), opts, text[m.end():]


def parse_key(spec: str, io: IO) -> Key:
    sf, sc, sopts, rest = _parse_pos(spec, spec, io, True)
    key = Key(sf - 1, max(sc - 1, 0), None, 0, set(sopts.replace("b", "")))
    key.skip_start_blanks = "b" in sopts
    if sf == 1 and sc <= 1:
        key.sword = None if sc == 0 else 0
    if rest.startswith(","):
        ef, ec, eopts, rest = _parse_pos(rest[1:], spec, io, False)
        key.eword, key.echar = ef - 1, ec
        key.flags |= set(eopts.replace("b", ""))
        key.skip_end_blanks = "b" in eopts
    if rest:
        _badspec(spec, "stray character in field spec", io)
    return key


def _begfield(line: str, key: Key, tab: str | None) -> int:
    ptr, lim = 0, len(line)
    if key.sword is None:
        return 0
    sword = key.sword
    if tab is not None:
        while ptr < lim and sword:
            sword -= 1
            while ptr < lim and line[ptr] != tab:
                ptr += 1
            if ptr < lim:
                ptr += 1
    else:
        while ptr < lim and sword:
            sword -= 1
            while ptr < lim and line[ptr] in _BLANK:
                ptr += 1
            while ptr < lim and line[ptr] not in _BLANK:
                ptr += 1
    if key.skip_start_blanks:
        while ptr < lim and line[ptr] in _BLANK:
            ptr += 1
    return min(ptr + key.schar, lim)


def _limfield(line: str, key: Key, tab: str | None) -> int:
    lim = len(line)
    if key.eword is None:
        return lim
    eword, echar, ptr = key.eword, key.echar, 0
    if echar == 0:
        eword += 1
    if tab is not None:
        while ptr < lim and eword:
            eword -= 1
            while ptr < lim and line[ptr] != tab:
                ptr += 1
            if ptr < lim and (eword or echar):
                ptr += 1
    else:
        while ptr < lim and eword:
            eword -= 1
            while ptr < lim and line[ptr] in _BLANK:
                ptr += 1
            while ptr < lim and line[ptr] not in _BLANK:
                ptr += 1
    if echar:
        if key.skip_end_blanks:
            while ptr < lim and line[ptr] in _BLANK:
                ptr += 1
        ptr = min(lim, ptr + echar)
    return ptr


def _numeric(text: str) -> Decimal:
    m = re.match(r"[ \t]*(-?)(\d*)(?:\.(\d*))?", text)
    if not m or not (m.group(2) or m.group(3)):
        return Decimal(0)
    return Decimal(f"{m.group(1)}{m.group(2) or '0'}.{m.group(3) or '0'}")


def _general(text: str) -> tuple[int, float]:
    m = re.match(r"[ \t]*([+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?inf(inity)?|[+-]?nan)", text, re.I)
    if not m:
        return (0, 0.0)  # non-numbers sort first
    try:
        value = float(m.group(1))
    except (ValueError, InvalidOperation):
        return (0, 0.0)
    return (1, value) if value == value else (0, 1.0)


def _compare_text(a: str, b: str, flags: set[str]) -> int:
    if "d" in flags:
        a, b = re.sub(r"[^A-Za-z0-9 \t]", "", a), re.sub(r"[^A-Za-z0-9 \t]", "", b)
    if "i" in flags:
        a, b = re.sub(r"[\x00-\x1f\x7f]", "", a), re.sub(r"[\x00-\x1f\x7f]", "", b)
    if "f" in flags:  # sort folds single bytes only: ASCII letters
        a, b = a.translate(_UPPER), b.translate(_UPPER)
    return (a > b) - (a < b)


def _key_compare(a: str, b: str, key: Key, tab: str | None) -> int:
    ta, tb = a[_begfield(a, key, tab):], b[_begfield(b, key, tab):]
    la, lb = _limfield(a, key, tab) - _begfield(a, key, tab), _limfield(b, key, tab) - _begfield(b, key, tab)
    ta, tb = ta[:max(la, 0)], tb[:max(lb, 0)]
    if "n" in key.flags:
        x, y = _numeric(ta), _numeric(tb)
        diff = (x > y) - (x < y)
    elif "g" in key.flags:
        gx, gy = _general(ta), _general(tb)
        diff = (gx > gy) - (gx < gy)
    else:
        if key.skip_start_blanks and key.sword is None:
            ta, tb = ta.lstrip(_BLANK), tb.lstrip(_BLANK)
        diff = _compare_text(ta, tb, key.flags)
    return -diff if "r" in key.flags else diff


def cmd_sort(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("sort", args, "bcdfghik:mMno:rsS:t:uVT:", io, code=2,
               long={"numeric-sort": "n", "reverse": "r", "unique": "u", "key=": "k", "field-separator=": "t",
                     "ignore-case": "f", "stable": "s", "output=": "o", "general-numeric-sort": "g",
                     "ignore-leading-blanks": "b", "check": "c", "dictionary-order": "d"})
    for unsupported in "hMV":
        if o.has(unsupported):
            io.err.write(f"sort: sim-shell: -{unsupported} is not supported\n")
            return 2
    tab = o.last("t")
    if tab is not None and len(tab) != 1:
        io.err.write(f"sort: multi-character tab {quote_locale(tab)}\n" if tab else "sort: empty tab\n")
        return 2
    gflags = {f for f in "dfgin" if o.has(f)}
    reverse = o.has("r")
    keys = [parse_key(spec, io) for spec in o.all("k")]
    for key in keys:
        if not key.flags and not key.skip_start_blanks and not key.skip_end_blanks:
            key.flags = set(gflags) | ({"r"} if reverse else set())
            key.skip_start_blanks = key.skip_end_blanks = o.has("b")
    if not keys and (gflags or o.has("b")):
        keys = [Key(None, 0, None, 0, set(gflags) | ({"r"} if reverse else set()), o.has("b"), o.has("b"))]
    # sort works on bytes: key offsets count bytes, and byte order is code point order in UTF-8
    lines: list[str] = []
    for path in o.operands or ["-"]:
        try:
            lines.extend(split_lines(read_input(sh, io, path).encode("utf-8", "surrogateescape").decode("latin-1")))
        except FsError as exc:
            what = "read failed" if exc.strerror == EISDIR else "cannot read"
            io.err.write(f"sort: {what}: {quote_shell(path, always=False)}: {exc.strerror}\n")
            return 2
    last_resort = not (o.has("s") or o.has("u"))

    def compare(a: str, b: str) -> int:
        for key in keys:
            d = _key_compare(a, b, key, tab)
            if d:
                return d
        if not last_resort and keys:
            return 0
        d = (a > b) - (a < b)
        return -d if reverse else d

    if o.has("c"):
        return _check(lines, compare, o.has("u"), o.operands[0] if o.operands else "-", io)
    ordered = sorted(lines, key=functools.cmp_to_key(compare))
    if o.has("u"):
        ordered = [x for i, x in enumerate(ordered) if i == 0 or compare(ordered[i - 1], x) != 0]
    text = join_lines(ordered).encode("latin-1").decode("utf-8", "surrogateescape")
    out = o.last("o")
    if out is not None:
        try:
            sh.fs.write(sh.resolve(out), text)
        except FsError as exc:
            io.err.write(f"sort: open failed: {quote_shell(out)}: {exc.strerror}\n")
            return 2
        return 0
    io.out.write(text)
    return 0


def _check(lines: list[str], compare, unique: bool, name: str, io: IO) -> int:
    for i in range(1, len(lines)):
        d = compare(lines[i - 1], lines[i])
        if d > 0 or (unique and d == 0):
            shown = lines[i].encode("latin-1").decode("utf-8", "replace")
            io.err.write(f"sort: {name}:{i + 1}: disorder: {shown}\n")
            return 1
    return 0
