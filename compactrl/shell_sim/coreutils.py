"""GNU coreutils 9.x subset: cat head tail wc cut tr uniq seq basename dirname tee and file ops."""

from __future__ import annotations

import posixpath
import re
from dataclasses import replace

from compactrl.shell_sim.common import getopt, join_lines, missing, parse_int, read_input, split_lines
from compactrl.shell_sim.fs import EEXIST, EISDIR, ENOTDIR, FsError, Resolved, quote_locale, quote_shell
from compactrl.shell_sim.shell import IO, Shell, UsageError


def _inputs(operands: list[str]) -> list[str]:
    return operands or ["-"]


# ===================================================================== cat
def cmd_cat(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("cat", args, "bnsETA", io, long={"number": "n", "number-nonblank": "b", "squeeze-blank": "s",
                                                 "show-ends": "E", "show-tabs": "T"})
    number_all, number_nonblank = o.has("n"), o.has("b")
    squeeze, ends, tabs = o.has("s"), o.has("E") or o.has("A"), o.has("T") or o.has("A")
    plain = not (number_all or number_nonblank or squeeze or ends or tabs)
    state = {"line": 0, "at_start": True, "blank_run": 0}
    status = 0
    for path in _inputs(o.operands):
        try:
            text = read_input(sh, io, path)
        except FsError as exc:
            missing("cat", path, exc, io)
            status = 1
            continue
        io.out.write(text if plain else _cat_format(text, state, number_all, number_nonblank, squeeze,
                                                     ends, tabs))
    return status


def _cat_format(text: str, st: dict, number_all: bool, nonblank: bool, squeeze: bool, ends: bool,
                tabs: bool) -> str:
    out: list[str] = []
    for piece in re.findall(r"[^\n]*\n|[^\n]+", text):
        body = piece.rstrip("\n")
        has_nl = piece.endswith("\n")
        blank = st["at_start"] and body == "" and has_nl
        if blank and squeeze:
            st["blank_run"] += 1
            if st["blank_run"] > 1:
                continue
        elif st["at_start"]:
            st["blank_run"] = 0
        if st["at_start"] and (number_all and not nonblank or nonblank and not blank):
            st["line"] += 1
            out.append(f"{st['line']:6d}\t")
        if tabs:
            body = body.replace("\t", "^I")
        out.append(body + ("$" if ends and has_nl else "") + ("\n" if has_nl else ""))
        st["at_start"] = has_nl
    return "".join(out)


# ===================================================================== head / tail
def _count_arg(name: str, flag: str, value: str, io: IO) -> tuple[int, str]:
    """Parse ``-n``/``-c`` values: returns (count, sign) where sign is '', '-' or '+'."""
    sign = value[:1] if value[:1] in "+-" else ""
    num = value[len(sign):]
    mult = {"b": 512, "K": 1024, "k": 1024, "KB": 1000, "M": 1 << 20, "MB": 10**6, "G": 1 << 30}
    m = re.fullmatch(r"(\d+)([A-Za-z]*)", num)
    if not m or (m.group(2) and m.group(2) not in mult):
        what = "lines" if flag == "n" else "bytes"
        io.err.write(f"{name}: invalid number of {what}: {quote_locale(value)}\n")
        raise UsageError(1)
    return int(m.group(1)) * mult.get(m.group(2), 1), sign


def _legacy_count(args: list[str]) -> list[str]:
    """``head -5`` / ``tail -5`` as the first argument means ``-n 5``."""
    if args and re.fullmatch(r"-\d+", args[0]):
        return ["-n", args[0][1:], *args[1:]]
    return args


def _headed(sh: Shell, io: IO, name: str, o, fn) -> int:
    files = _inputs(o.operands)
    headers = (len(files) > 1 or o.has("v")) and not o.has("q")
    status, first = 0, True
    for path in files:
        try:
            text = read_input(sh, io, path)
        except FsError as exc:
            status = 1
            if exc.strerror == EISDIR:
                if headers:
                    io.out.write(f"{'' if first else chr(10)}==> {path} <==\n")
                    first = False
                io.err.write(f"{name}: error reading {quote_shell(path)}: {EISDIR}\n")
            else:
                io.err.write(f"{name}: cannot open {quote_shell(path)} for reading: {exc.strerror}\n")
            continue
        if headers:
            label = "standard input" if path == "-" else path
            io.out.write(f"{'' if first else chr(10)}==> {label} <==\n")
        first = False
        io.out.write(fn(text))
    return status


def _pieces(text: str) -> list[str]:
    return re.findall(r"[^\n]*\n|[^\n]+", text)


def cmd_head(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("head", _legacy_count(args), "n:c:qv", io,
               long={"lines=": "n", "bytes=": "c", "quiet": "q", "silent": "q", "verbose": "v"})
    mode = next((f for f, _ in reversed(o.flags) if f in "nc"), "n")
    count, sign = _count_arg("head", mode, o.last(mode, "10") or "10", io)

    def take(text: str) -> str:
        if mode == "c":
            data = text.encode("utf-8", "surrogateescape")
            part = data[:max(len(data) - count, 0)] if sign == "-" else data[:count]
            return part.decode(errors="surrogateescape")
        pieces = _pieces(text)
        return "".join(pieces[:max(len(pieces) - count, 0)] if sign == "-" else pieces[:count])

    return _headed(sh, io, "head", o, take)


def cmd_tail(sh: Shell, args: list[str], io: IO) -> int:
    if args and re.fullmatch(r"-\d+", args[0]) and len([a for a in args[1:] if not a.startswith("-")]) > 1:
        io.err.write(f"tail: option used in invalid context -- {args[0][1:]}\n")
        return 1
    o = getopt("tail", _legacy_count(args), "n:c:qvf", io,
               long={"lines=": "n", "bytes=": "c", "quiet": "q", "silent": "q", "verbose": "v"})
    if o.has("f"):
        io.err.write("tail: sim-shell: -f (follow) is not supported\n")
        return 1
    mode = next((f for f, _ in reversed(o.flags) if f in "nc"), "n")
    count, sign = _count_arg("tail", mode, o.last(mode, "10") or "10", io)
    if count == 0 and sign != "+":
        return 0  # GNU tail does not even open the files (no headers, no errors)

    def take(text: str) -> str:
        if mode == "c":
            data = text.encode("utf-8", "surrogateescape")
            part = data[max(count - 1, 0):] if sign == "+" else (data[-count:] if count else b"")
            return part.decode(errors="surrogateescape")
        pieces = _pieces(text)
        if sign == "+":
            return "".join(pieces[max(count - 1, 0):])
        return "".join(pieces[-count:] if count else [])

    return _headed(sh, io, "tail", o, take)


# ===================================================================== wc
_WS = re.compile(r"[ \t\n\v\f\r\u1680\u2000-\u2006\u2008-\u200a\u2028\u2029\u205f\u3000]+")


def _wc_counts(text: str) -> dict[str, int]:
    lines = text.split("\n")
    raw = text.encode("utf-8", "surrogateescape")  # invalid bytes from earlier stages count as bytes
    return {
        "l": text.count("\n"),
        "w": len([w for w in _WS.split(text) if w]),
        "m": sum(1 for c in text if not "\udc80" <= c <= "\udcff"),  # ... but not as characters
        "c": len(raw),
        "L": max((len(line.expandtabs(8)) for line in lines), default=0),
    }


def cmd_wc(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("wc", args, "clwmL", io, long={"bytes": "c", "lines": "l", "words": "w", "chars": "m",
                                              "max-line-length": "L"})
    chosen = [f for f in "lwmcL" if o.has(f)] or ["l", "w", "c"]
    files = o.operands or ["-"]
    results: list[tuple[str, dict[str, int] | None]] = []
    status, minimum, regular_total = 0, 1, 0
    for path in files:
        try:
            text = read_input(sh, io, path)
            r = sh.resolve(path)
            if (path == "-" and not io.stdin_regular) or r.devnull:
                minimum = 7
            else:
                regular_total += len(text.encode())
            results.append((path, _wc_counts(text)))
        except FsError as exc:
            if exc.strerror == EISDIR:
                io.err.write(f"wc: {quote_shell(path, always=False)}: {EISDIR}\n")
                results.append((path, dict.fromkeys("lwmcL", 0)))
            else:
                missing("wc", path, exc, io)
                results.append((path, None))
            status = 1
    # coreutils' compute_number_width: digits of the regular files' total size, 7 if any input
    # is not a regular file, and no padding at all for one count of one input
    width = max(len(str(regular_total)), minimum)
    if len(chosen) == 1 and len(files) == 1:
        width = 1
    totals = dict.fromkeys("lwmcL", 0)
    for path, counts in results:
        if counts is None:
            continue
        for key in totals:
            totals[key] = max(totals[key], counts[key]) if key == "L" else totals[key] + counts[key]
        io.out.write(_wc_line(counts, chosen, width, None if path == "-" and not o.operands else path))
    if len(files) > 1:
        io.out.write(_wc_line(totals, chosen, width, "total"))
    return status


def _wc_line(counts: dict[str, int], chosen: list[str], width: int, name: str | None) -> str:
    cells = [f"{counts[k]:>{width}}" for k in chosen]
    return " ".join(cells) + (f" {name}" if name is not None else "") + "\n"


# ===================================================================== cut
def _parse_list(name: str, spec: str, io: IO, kind: str) -> list[tuple[int, int]]:
    ranges = []
    for item in spec.split(","):
        m = re.fullmatch(r"(\d*)(-?)(\d*)", item)
        if not m or item in ("", "-"):
            io.err.write(f"{name}: invalid {'field' if kind == 'f' else 'byte/character'} range\n" if item == "-"
                         else f"{name}: invalid {'field' if kind == 'f' else 'byte/character position'} "
                              f"value {quote_locale(item)}\n")
            io.err.write(f"Try '{name} --help' for more information.\n")
            raise UsageError(1)
        lo, dash, hi = m.groups()
        a = int(lo) if lo else 1
        b = (int(hi) if hi else 1 << 62) if dash else a
        if (lo and int(lo) == 0) or (hi and int(hi) == 0):
            what = "fields" if kind == "f" else "byte/character positions"
            io.err.write(f"{name}: {what} are numbered from 1\n")
            io.err.write(f"Try '{name} --help' for more information.\n")
            raise UsageError(1)
        if b < a:
            io.err.write(f"{name}: invalid decreasing range\n")
            io.err.write(f"Try '{name} --help' for more information.\n")
            raise UsageError(1)
        ranges.append((a, b))
    return ranges


def _selected(i: int, ranges: list[tuple[int, int]]) -> bool:
    return any(a <= i <= b for a, b in ranges)


def cmd_cut(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("cut", args, "b:c:f:d:sn", io, long={"bytes=": "b", "characters=": "c", "fields=": "f",
                                                   "delimiter=": "d", "only-delimited": "s",
                                                   "complement": "C", "output-delimiter=": "O"})
    kinds = [f for f, _ in o.flags if f in "bcf"]
    if not kinds:
        io.err.write("cut: you must specify a list of bytes, characters, or fields\n")
        io.err.write("Try 'cut --help' for more information.\n")
        return 1
    if len(set(kinds)) > 1:
        io.err.write("cut: only one list may be specified\nTry 'cut --help' for more information.\n")
        return 1
    kind = kinds[0]
    delim = o.last("d")
    if delim is not None and kind != "f":
        io.err.write("cut: an input delimiter may be specified only when operating on fields\n"
                     "Try 'cut --help' for more information.\n")
        return 1
    if delim is not None and len(delim) != 1:
        io.err.write("cut: the delimiter must be a single character\nTry 'cut --help' for more information.\n")
        return 1
    ranges = _parse_list("cut", o.last(kind) or "", io, kind)
    delim = "\t" if delim is None else delim
    out_delim = o.last("O", delim if kind == "f" else "") or ""
    complement, only = o.has("C"), o.has("s")
    status = 0
    for path in _inputs(o.operands):
        try:
            text = read_input(sh, io, path)
        except FsError as exc:
            missing("cut", path, exc, io)
            status = 1
            continue
        out = []
        for line in split_lines(text):
            if kind == "f":
                if delim not in line:
                    if not only:
                        out.append(line)
                    continue
                parts = line.split(delim)
                keep = [p for i, p in enumerate(parts, 1) if _selected(i, ranges) != complement]
                out.append(out_delim.join(keep))
            else:
                data = line.encode("utf-8", "surrogateescape")
                keep_b = bytes(b for i, b in enumerate(data, 1) if _selected(i, ranges) != complement)
                out.append(keep_b.decode(errors="surrogateescape"))
        io.out.write(join_lines(out))
    return status


# ===================================================================== tr
_TR_CLASSES = {
    "alpha": "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
    "digit": "0123456789", "lower": "abcdefghijklmnopqrstuvwxyz", "upper": "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "space": "\t\n\v\f\r ", "blank": "\t ", "xdigit": "0123456789ABCDEFabcdef",
    "punct": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "cntrl": "".join(chr(i) for i in range(32)) + "\x7f",
    "print": "".join(chr(i) for i in range(32, 127)),
    "graph": "".join(chr(i) for i in range(33, 127)),
}
_TR_CLASSES["alnum"] = _TR_CLASSES["digit"] + _TR_CLASSES["upper"] + _TR_CLASSES["lower"]


def _tr_unescape(s: str, i: int) -> tuple[str, int]:
    esc = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "\\": "\\"}
    if s[i] != "\\" or i + 1 >= len(s):
        return s[i], i + 1
    e = s[i + 1]
    if e in esc:
        return esc[e], i + 2
    if e in "01234567":
        j = i + 1
        while j < len(s) and j - i <= 3 and s[j] in "01234567":
            j += 1
        return chr(int(s[i + 1:j], 8) & 0xFF), j
    return e, i + 2


def _tr_set(spec: str, io: IO) -> list[str] | None:
    """Expand a tr SET to a list of single bytes (as latin-1 chars); None for [c*n] repeats."""
    data = spec.encode().decode("latin-1")
    out: list[str] = []
    i = 0
    while i < len(data):
        m = re.match(r"\[:([a-z]+):\]", data[i:])
        if m:
            if m.group(1) not in _TR_CLASSES:
                io.err.write(f"tr: invalid character class {quote_locale(m.group(1))}\n")
                raise UsageError(1)
            out.extend(_TR_CLASSES[m.group(1)])
            i += m.end()
            continue
        if re.match(r"\[.\*\d*\]", data[i:]):
            return None
        c, j = _tr_unescape(data, i)
        if j + 1 < len(data) and data[j] == "-":
            hi, k = _tr_unescape(data, j + 1)
            if ord(hi) < ord(c):
                io.err.write(f"tr: range-endpoints of '{c}-{hi}' are in reverse collating sequence order\n")
                raise UsageError(1)
            out.extend(chr(x) for x in range(ord(c), ord(hi) + 1))
            i = k
            continue
        out.append(c)
        i = j
    return out


def cmd_tr(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("tr", args, "cCdst", io, long={"complement": "c", "delete": "d", "squeeze-repeats": "s",
                                              "truncate-set1": "t"})
    delete, squeeze, comp = o.has("d"), o.has("s"), o.has("c") or o.has("C")
    need = 1 if delete and not squeeze else (2 if not squeeze or delete else 1)
    ops = o.operands
    if len(ops) < need or len(ops) > (2 if (squeeze and not delete) or (delete and squeeze) or not delete
                                       else 1):
        if not ops:
            io.err.write("tr: missing operand\n")
        elif len(ops) < need:
            io.err.write(f"tr: missing operand after {quote_locale(ops[-1])}\n")
            io.err.write("Two strings must be given when translating.\n" if not delete
                         else "Two strings must be given when both deleting and squeezing repeats.\n")
        else:
            io.err.write(f"tr: extra operand {quote_locale(ops[need])}\n")
        io.err.write("Try 'tr --help' for more information.\n")
        return 1
    sets = [_tr_set(s, io) for s in ops]
    if any(s is None for s in sets):
        io.err.write("tr: sim-shell: [c*n] repeats are not supported\n")
        return 1
    set1 = sets[0] or []
    if comp:
        set1 = [chr(b) for b in range(256) if chr(b) not in set(set1)]
    data = io.stdin.encode("utf-8", "surrogateescape").decode("latin-1")
    if delete:
        drop = set(set1)
        data = "".join(ch for ch in data if ch not in drop)
        if squeeze and len(sets) > 1:
            data = _squeeze(data, set(sets[1] or []))
    elif len(sets) > 1:
        set2 = sets[1] or []
        if not set2:
            io.err.write("tr: when not truncating set1, string2 must be non-empty\n")
            return 1
        table: dict[str, str] = {}
        for k, ch in enumerate(set1):
            table[ch] = set2[min(k, len(set2) - 1)] if not o.has("t") else (set2[k] if k < len(set2) else ch)
        data = "".join(table.get(ch, ch) for ch in data)
        if squeeze:
            data = _squeeze(data, set(set2))
    else:
        data = _squeeze(data, set(set1))
    io.out.write(data.encode("latin-1").decode(errors="surrogateescape"))
    return 0


def _squeeze(data: str, chars: set[str]) -> str:
    out: list[str] = []
    for ch in data:
        if out and ch == out[-1] and ch in chars:
            continue
        out.append(ch)
    return "".join(out)


# ===================================================================== uniq
def cmd_uniq(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("uniq", args, "cdDuif:s:w:z", io, long={"count": "c", "repeated": "d", "unique": "u",
                                                        "ignore-case": "i", "skip-fields=": "f",
                                                        "skip-chars=": "s", "check-chars=": "w"})
    if len(o.operands) > 2:
        io.err.write(f"uniq: extra operand {quote_locale(o.operands[2])}\nTry 'uniq --help' for more information.\n")
        return 1
    src = o.operands[0] if o.operands else "-"
    try:
        text = read_input(sh, io, src)
    except FsError as exc:
        if exc.strerror == EISDIR:
            io.err.write(f"uniq: error reading {quote_shell(src)}\n")
        else:
            missing("uniq", src, exc, io)
        return 1
    skip_f, skip_c = int(o.last("f", "0") or 0), int(o.last("s", "0") or 0)
    width = o.last("w")

    def key(line: str) -> str:
        k = line
        for _ in range(skip_f):
            k = re.sub(r"^[ \t]*[^ \t]*", "", k, count=1)
        k = k[skip_c:]
        if width is not None:
            k = k[:int(width)]
        return k.lower() if o.has("i") else k

    groups: list[tuple[str, int]] = []
    for line in split_lines(text):
        if groups and key(groups[-1][0]) == key(line):
            groups[-1] = (groups[-1][0], groups[-1][1] + 1)
        else:
            groups.append((line, 1))
    out = []
    for line, n in groups:
        if (o.has("d") and n < 2) or (o.has("u") and n > 1):
            continue
        out.append(f"{n:7d} {line}" if o.has("c") else line)
    result = join_lines(out)
    if len(o.operands) == 2:
        sh.fs.write(sh.resolve(o.operands[1]), result)
    else:
        io.out.write(result)
    return 0


# ===================================================================== seq, basename, dirname, tee
def cmd_seq(sh: Shell, args: list[str], io: IO) -> int:
    # negative numbers are operands, not options
    o = getopt("seq", args, "s:w", io, long={"separator=": "s", "equal-width": "w"}, permute=False)
    nums = o.operands
    if not nums or len(nums) > 3:
        io.err.write("seq: missing operand\n" if not nums else f"seq: extra operand {quote_locale(nums[3])}\n")
        io.err.write("Try 'seq --help' for more information.\n")
        return 1
    for n in nums:
        if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)", n):
            io.err.write(f"seq: invalid floating point argument: {quote_locale(n)}\n")
            io.err.write("Try 'seq --help' for more information.\n")
            return 1
    first, step, last = ("1", "1", nums[0]) if len(nums) == 1 else (
        (nums[0], "1", nums[1]) if len(nums) == 2 else tuple(nums))
    if float(step) == 0:
        io.err.write(f"seq: invalid Zero increment value: {quote_locale(step)}\n"
                     "Try 'seq --help' for more information.\n")
        return 1
    prec = max(len(x.split(".")[1]) if "." in x else 0 for x in (first, step))
    values = _seq_values(float(first), float(step), float(last), prec)
    if values is None:
        io.err.write("seq: sim-shell: more than 1,000,000 numbers\n")
        return 1
    texts = [f"{v:.{prec}f}" for v in values]
    if o.has("w") and texts:
        width = max(len(t) for t in texts)
        texts = [("-" + t[1:].rjust(width - 1, "0")) if t.startswith("-") else t.rjust(width, "0") for t in texts]
    sep = o.last("s", "\n")
    io.out.write(sep.join(texts) + "\n" if texts else "")
    return 0


def _seq_values(first: float, step: float, last: float, prec: int) -> list[float] | None:
    out: list[float] = []
    k = 0
    while True:
        v = round(first + k * step, prec + 6)
        if (step > 0 and v > last + 1e-12) or (step < 0 and v < last - 1e-12):
            return out
        out.append(v)
        k += 1
        if k > 1_000_000:
            return None


def cmd_basename(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("basename", args, "as:z", io, long={"multiple": "a", "suffix=": "s"})
    if not o.operands:
        io.err.write("basename: missing operand\nTry 'basename --help' for more information.\n")
        return 1
    multiple = o.has("a") or o.has("s")
    suffix = o.last("s")
    names = o.operands if multiple else o.operands[:1]
    if not multiple and len(o.operands) == 2:
        suffix = o.operands[1]
    elif not multiple and len(o.operands) > 2:
        io.err.write(f"basename: extra operand {quote_locale(o.operands[2])}\n"
                     "Try 'basename --help' for more information.\n")
        return 1
    for name in names:
        stripped = name.rstrip("/")
        base = "/" if name and not stripped else stripped.rsplit("/", 1)[-1]
        if suffix and base != suffix and base.endswith(suffix):
            base = base[: -len(suffix)]
        io.out.write(base + "\n")
    return 0


def cmd_dirname(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("dirname", args, "z", io)
    if not o.operands:
        io.err.write("dirname: missing operand\nTry 'dirname --help' for more information.\n")
        return 1
    for name in o.operands:
        stripped = name.rstrip("/") or ("/" if name.startswith("/") else "")
        if "/" not in stripped:
            io.out.write(("/" if stripped == "/" else ".") + "\n")
            continue
        head = stripped.rsplit("/", 1)[0].rstrip("/")
        io.out.write((head or "/") + "\n")
    return 0


def cmd_tee(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("tee", args, "ai", io, long={"append": "a"})
    status = 0
    for path in o.operands:
        try:
            sh.fs.write(sh.resolve(path), io.stdin, append=o.has("a"))
        except FsError as exc:
            missing("tee", path, exc, io)
            status = 1
    io.out.write(io.stdin)
    return status


# ===================================================================== file operations
def cmd_mkdir(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("mkdir", args, "pvm:", io, long={"parents": "p", "verbose": "v", "mode=": "m"})
    if not o.operands:
        io.err.write("mkdir: missing operand\nTry 'mkdir --help' for more information.\n")
        return 1
    status = 0
    for path in o.operands:
        r = sh.resolve(path)
        try:
            if o.has("p"):
                _mkdir_parents(sh, r)
            else:
                sh.fs.mkdir(r)
            if o.has("v"):
                io.out.write(f"mkdir: created directory {quote_shell(path)}\n")
        except FsError as exc:
            shown = path
            if isinstance(exc, _MkdirError) and exc.rel != r.rel:
                shown = _ancestor_spelling(path, r.rel, exc.rel)
            io.err.write(f"mkdir: cannot create directory {quote_locale(shown)}: {exc.strerror}\n")
            status = 1
    return status


def _mkdir_parents(sh: Shell, r: Resolved) -> None:
    if r.outside:
        if sh.fs.is_dir(r):
            return
        raise FsError("Permission denied")
    parts = r.rel.split("/") if r.rel else []
    for k in range(1, len(parts) + 1):
        sub = replace(r, rel="/".join(parts[:k]))
        if sh.fs.is_file(sub):
            raise _MkdirError(sub.rel, EEXIST if k == len(parts) else ENOTDIR)
        if not sh.fs.is_dir(sub):
            sh.fs.mkdir(sub)


class _MkdirError(FsError):
    """``mkdir -p`` failed at an ancestor: GNU names that ancestor, relative to the work dir."""

    def __init__(self, rel: str, strerror: str) -> None:
        super().__init__(strerror)
        self.rel = rel


def _ancestor_spelling(path: str, rel: str, ancestor: str) -> str:
    """The prefix of ``path`` (as the user typed it) that names ``ancestor``."""
    drop = rel.count("/") - ancestor.count("/")
    parts = path.rstrip("/").split("/")
    return "/".join(parts[: len(parts) - drop]) if drop < len(parts) else ancestor


def cmd_rmdir(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("rmdir", args, "pv", io, long={"parents": "p", "verbose": "v"})
    if not o.operands:
        io.err.write("rmdir: missing operand\nTry 'rmdir --help' for more information.\n")
        return 1
    status = 0
    for path in o.operands:
        r = sh.resolve(path)
        try:
            if sh.fs.is_file(r):
                raise FsError(ENOTDIR)
            if not sh.fs.is_dir(r):
                raise FsError(sh.fs.lookup_error(r))
            sh.fs.remove_empty_dir(r)
        except FsError as exc:
            io.err.write(f"rmdir: failed to remove {quote_shell(path)}: {exc.strerror}\n")
            status = 1
    return status


def cmd_rm(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("rm", args, "rRfidv", io, long={"recursive": "r", "force": "f", "dir": "d", "verbose": "v"})
    force, recursive = o.has("f"), o.has("r") or o.has("R")
    if not o.operands:
        if force:
            return 0
        io.err.write("rm: missing operand\nTry 'rm --help' for more information.\n")
        return 1
    status = 0
    for path in o.operands:
        base = path.rstrip("/").rsplit("/", 1)[-1]
        if base in (".", ".."):
            io.err.write(f"rm: refusing to remove '.' or '..' directory: skipping {quote_shell(path)}\n")
            status = 1
            continue
        r = sh.resolve(path)
        if sh.fs.is_file(r):
            sh.fs.remove_file(r)
        elif sh.fs.is_dir(r) and r.rel and not r.outside:
            if recursive:
                sh.fs.remove_tree(r)
            elif o.has("d") and not sh.fs.listdir(r):
                sh.fs.remove_empty_dir(r)
            else:
                io.err.write(f"rm: cannot remove {quote_shell(path)}: {EISDIR}\n")
                status = 1
        elif not force or r.outside:
            reason = sh.fs.lookup_error(r) if not r.outside or not sh.fs.is_dir(r) else "Permission denied"
            io.err.write(f"rm: cannot remove {quote_shell(path)}: {reason}\n")
            status = 1
    return status


def cmd_touch(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("touch", args, "acmd:r:t:", io, long={"no-create": "c"})
    if not o.operands:
        io.err.write("touch: missing file operand\nTry 'touch --help' for more information.\n")
        return 1
    status = 0
    for path in o.operands:
        r = sh.resolve(path)
        if sh.fs.exists(r) or o.has("c"):
            continue
        try:
            sh.fs.write(r, "")
        except FsError as exc:
            io.err.write(f"touch: cannot touch {quote_shell(path)}: {exc.strerror}\n")
            status = 1
    return status


def _copy_targets(name: str, sh: Shell, io: IO, ops: list[str]) -> list[tuple[str, str]] | None:
    if not ops:
        io.err.write(f"{name}: missing file operand\nTry '{name} --help' for more information.\n")
        return None
    if len(ops) == 1:
        io.err.write(f"{name}: missing destination file operand after {quote_shell(ops[0])}\n"
                     f"Try '{name} --help' for more information.\n")
        return None
    *sources, dest = ops
    dr = sh.resolve(dest)
    if sh.fs.is_dir(dr):
        return [(s, posixpath.join(dest, posixpath.basename(s.rstrip("/")) or s)) for s in sources]
    if len(sources) > 1:
        io.err.write(f"{name}: target {quote_shell(dest)} is not a directory\n")
        return None
    return [(sources[0], dest)]


def cmd_cp(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("cp", args, "rRafnpv", io, long={"recursive": "r", "archive": "a", "force": "f",
                                                "no-clobber": "n"})
    pairs = _copy_targets("cp", sh, io, o.operands)
    if pairs is None:
        return 1
    recursive = o.has("r") or o.has("R") or o.has("a")
    status = 0
    for src, dst in pairs:
        sr, dr = sh.resolve(src), sh.resolve(dst)
        if not sh.fs.exists(sr) or sr.outside:
            io.err.write(f"cp: cannot stat {quote_shell(src)}: {sh.fs.lookup_error(sr)}\n")
            status = 1
        elif sh.fs.is_dir(sr):
            if not recursive:
                io.err.write(f"cp: -r not specified; omitting directory {quote_shell(src)}\n")
                status = 1
            elif dr.area == sr.area and (dr.rel == sr.rel or dr.rel.startswith(sr.rel + "/")):
                io.err.write(f"cp: cannot copy a directory, {quote_shell(src)}, into itself, "
                             f"{quote_shell(dst)}\n")
                status = 1
            elif sh.fs.is_file(dr):
                io.err.write(f"cp: cannot overwrite non-directory {quote_shell(dst)} with directory "
                             f"{quote_shell(src)}\n")
                status = 1
            else:
                status |= _copy_dir(sh, io, sr, dr, dst)
        elif sr == dr:
            io.err.write(f"cp: {quote_shell(src)} and {quote_shell(dst)} are the same file\n")
            status = 1
        elif o.has("n") and sh.fs.exists(dr):
            continue
        else:
            try:
                sh.fs.write(dr, sh.fs.read(sr))
            except FsError as exc:
                io.err.write(f"cp: cannot create regular file {quote_shell(dst)}: {exc.strerror}\n")
                status = 1
    return status


def _copy_dir(sh: Shell, io: IO, sr: Resolved, dr: Resolved, dst: str) -> int:
    parent = sh.fs.parent(dr)
    if not sh.fs.is_dir(dr) and not sh.fs.is_dir(parent):
        io.err.write(f"cp: cannot create directory {quote_shell(dst)}: {sh.fs.lookup_error(dr)}\n")
        return 1
    sh.fs.copy_tree(sr, dr)
    return 0


def cmd_mv(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("mv", args, "fnvi", io, long={"force": "f", "no-clobber": "n"})
    pairs = _copy_targets("mv", sh, io, o.operands)
    if pairs is None:
        return 1
    status = 0
    for src, dst in pairs:
        sr, dr = sh.resolve(src), sh.resolve(dst)
        if not sh.fs.exists(sr) or sr.outside:
            io.err.write(f"mv: cannot stat {quote_shell(src)}: {sh.fs.lookup_error(sr)}\n")
            status = 1
        elif sr == dr:
            io.err.write(f"mv: {quote_shell(src)} and {quote_shell(dst)} are the same file\n")
            status = 1
        elif sh.fs.is_dir(sr):
            status |= _move_dir(sh, io, src, dst, sr, dr)
        elif sh.fs.is_dir(dr):
            io.err.write(f"mv: cannot overwrite directory {quote_shell(dst)} with non-directory\n")
            status = 1
        elif o.has("n") and sh.fs.exists(dr):
            continue
        else:
            try:
                sh.fs.write(dr, sh.fs.read(sr))
                sh.fs.remove_file(sr)
            except FsError as exc:
                io.err.write(f"mv: cannot move {quote_shell(src)} to {quote_shell(dst)}: {exc.strerror}\n")
                status = 1
    return status


def _move_dir(sh: Shell, io: IO, src: str, dst: str, sr: Resolved, dr: Resolved) -> int:
    if (dr.area == sr.area and dr.rel.startswith(sr.rel + "/")) or not sr.rel:
        io.err.write(f"mv: cannot move {quote_shell(src)} to a subdirectory of itself, {quote_shell(dst)}\n")
        return 1
    if sh.fs.is_file(dr):
        io.err.write(f"mv: cannot overwrite non-directory {quote_shell(dst)} with directory {quote_shell(src)}\n")
        return 1
    if sh.fs.is_dir(dr) and sh.fs.listdir(dr):
        io.err.write(f"mv: cannot move {quote_shell(src)} to {quote_shell(dst)}: Directory not empty\n")
        return 1
    parent = sh.fs.parent(dr)
    if not sh.fs.is_dir(parent) or dr.outside:
        io.err.write(f"mv: cannot move {quote_shell(src)} to {quote_shell(dst)}: {sh.fs.lookup_error(dr)}\n")
        return 1
    sh.fs.copy_tree(sr, dr)
    sh.fs.remove_tree(sr)
    return 0


def _number_or_fail(name: str, value: str, io: IO) -> int:
    n = parse_int(value)
    if n is None:
        io.err.write(f"{name}: invalid number: {quote_locale(value)}\n")
        raise UsageError(1)
    return n


COREUTILS = {
    "cat": cmd_cat, "head": cmd_head, "tail": cmd_tail, "wc": cmd_wc, "cut": cmd_cut, "tr": cmd_tr,
    "uniq": cmd_uniq, "seq": cmd_seq, "basename": cmd_basename, "dirname": cmd_dirname, "tee": cmd_tee,
    "mkdir": cmd_mkdir, "rmdir": cmd_rmdir, "rm": cmd_rm, "touch": cmd_touch, "cp": cmd_cp, "mv": cmd_mv,
}
