"""Utilities agents reach for beyond the core set: xargs, bash -c, paste, nl, rev, tac, column,
comm, join, realpath, env, date, sleep, timeout, md5sum/sha256sum, and the interpreters the sim
refuses to run (``python``: the sim never executes agent-written code)."""

from __future__ import annotations

import datetime
import hashlib
import posixpath
import re

from compactrl.shell_sim.common import getopt, join_lines, missing, read_input, split_lines
from compactrl.shell_sim.fs import FsError, quote_locale
from compactrl.shell_sim.parser import parse
from compactrl.shell_sim.shell import IO, ExitShell, InStream, NullSink, Shell

SIM_DATE = datetime.datetime(2026, 1, 1, 0, 0, 0, tzinfo=datetime.UTC)
"""What ``date`` reports in the sim: a fixed instant, so episodes stay reproducible."""


_OPEN_ERRORS = {"rev": "rev: cannot open {path}: {err}\n", "tac": "tac: failed to open '{path}' for reading: {err}\n"}


def _read_all(sh: Shell, io: IO, name: str, paths: list[str]) -> list[str] | None:
    texts = []
    for path in paths:
        try:
            texts.append(read_input(sh, io, path))
        except FsError as exc:
            if name in _OPEN_ERRORS:
                io.err.write(_OPEN_ERRORS[name].format(path=path, err=exc.strerror))
            else:
                missing(name, path, exc, io)
            return None
    return texts


# ===================================================================== xargs
_XARGS_QUOTE = re.compile(r"""'([^'\n]*)'|"([^"\n]*)"|\\(.)|([^\s'"\\]+)|(\s+)""", re.DOTALL)


def _xargs_items(text: str, io: IO) -> tuple[list[str], bool]:
    """Blank-separated items with xargs' own quoting and backslashes, and whether all of the input
    could be read (an unmatched quote stops it: the items before it still run, as in GNU)."""
    items, cur, live = [], [], False
    pos = 0
    while pos < len(text):
        m = _XARGS_QUOTE.match(text, pos)
        if not m:
            quote = "single" if text[pos] == "'" else "double"
            io.err.write(f"xargs: unmatched {quote} quote; by default quotes are special to xargs unless you "
                         "use the -0 option\n")
            return items, False
        pos = m.end()
        if m.group(5) is not None:
            if live:
                items.append("".join(cur))
            cur, live = [], False
            continue
        cur.append(next(g for g in m.groups()[:4] if g is not None))
        live = True
    if live:
        items.append("".join(cur))
    return items, True


def _xargs_line(line: str, io: IO) -> str | None:
    """An ``-I``/``-L`` item: the whole line, blanks kept, xargs' quotes and backslashes removed."""
    out, i, quote = [], 0, ""
    while i < len(line):
        c = line[i]
        if quote:
            if c == quote:
                quote = ""
            else:
                out.append(c)
        elif c in "'\"":
            quote = c
        elif c == "\\" and i + 1 < len(line):
            i += 1
            out.append(line[i])
        else:
            out.append(c)
        i += 1
    if quote:
        io.err.write(f"xargs: unmatched {'single' if quote == chr(39) else 'double'} quote; by default quotes are "
                     "special to xargs unless you use the -0 option\n")
        return None
    return "".join(out)


def cmd_xargs(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("xargs", args, "0d:n:I:L:P:rtx", io, permute=False,
               long={"null": "0", "delimiter=": "d", "max-args=": "n", "no-run-if-empty": "r", "replace=": "I",
                     "max-procs=": "P", "verbose": "t"})
    data = io.stdin
    if o.has("0") or o.has("d"):
        delim = "\0" if o.has("0") else o.last("d") or "\n"
        delim = {"\\n": "\n", "\\t": "\t", "\\0": "\0"}.get(delim, delim)
        items = data.split(delim)
        if items and items[-1] == "":
            items.pop()
    elif o.has("I") or o.has("L"):
        items, bad = [], False
        for line in split_lines(data):  # one item per line, quotes still processed
            parsed = _xargs_line(line.lstrip(" \t"), io)
            if parsed is None:
                bad = True
                break
            if parsed:
                items.append(parsed)
        if bad:
            return _xargs_run(sh, io, _xargs_batches(o, command_of(o), items), o.has("t")) or 1
    else:
        items, complete = _xargs_items(data, io)
        if not complete:  # what was read before the bad quote still runs; nothing runs for nothing
            return (_xargs_run(sh, io, _xargs_batches(o, command_of(o), items), o.has("t")) if items else 0) or 1
    return _xargs_run(sh, io, _xargs_batches(o, command_of(o), items), o.has("t"))


def command_of(o) -> list[str]:
    return o.operands or ["echo"]


def _xargs_batches(o, command: list[str], items: list[str]) -> list[list[str]]:
    if o.has("I"):
        token = o.last("I") or "{}"
        return [[a.replace(token, item) for a in command] for item in items]
    size = int(o.last("n") or o.last("L") or 0) or max(len(items), 1)
    return [command + items[k:k + size] for k in range(0, len(items), size)] or (
        [] if o.has("r") else [list(command)])


def _xargs_run(sh: Shell, io: IO, batches: list[list[str]], verbose: bool) -> int:
    status = 0
    for argv in batches:
        if verbose:
            io.err.write(" ".join(argv) + "\n")
        name = argv[0]
        if name not in sh.commands or name in ("cd", "exit", "export", "read", "local", "set", "return",
                                               "break", "continue", "shift", "eval", "source", "."):
            io.err.write(f"xargs: {name}: No such file or directory\n")
            return 127
        code = sh.subshell().call(name, argv[1:], IO(InStream(), io.out, io.err), functions=False)
        if code == 255:
            io.err.write(f"xargs: {name}: exited with status 255; aborting\n")
            return 124
        if 1 <= code <= 125:
            status = 123
        elif code in (126, 127):
            return code
    return status


# ===================================================================== bash -c / sh -c
def cmd_bash(sh: Shell, args: list[str], io: IO) -> int:
    """``bash -c 'cmd' [name args...]`` or ``bash script [args]``: a child shell (a subshell
    that forgets functions and unexported variables)."""
    opts = []
    while args and args[0].startswith("-") and args[0] not in ("-", "--") and args[0] != "-c":
        opts.append(args.pop(0))
    if any(o not in ("-e", "-u", "-eu", "-ue", "-l", "--norc", "--noprofile") for o in opts):
        io.err.write(f"bash: sim-shell: unsupported options {' '.join(opts)}\n")
        return 2
    if args[:1] == ["-c"]:
        if len(args) < 2:
            io.err.write("bash: -c: option requires an argument\n")
            return 2
        src, name, rest = args[1], (args[2] if len(args) > 2 else "bash"), args[3:]
    elif args:
        try:
            src = sh.fs.read(sh.resolve(args[0]))
        except FsError as exc:
            io.err.write(f"bash: {args[0]}: {exc.strerror}\n")
            return 127
        name, rest = args[0], args[1:]
    else:
        src, name, rest = io.stdin, "bash", []
    return _child_shell(sh, src, name, rest, io, opts)


def _child_shell(sh: Shell, src: str, name: str, args: list[str], io: IO, opts: list[str]) -> int:
    child = sh.subshell()
    child.vars = {k: v for k, v in sh.vars.items() if k in sh.exported}
    child.functions, child.positional, child.options, child.arg0 = {}, list(args), set(), name
    if any("e" in o for o in opts):
        child.options.add("errexit")
    if any("u" in o for o in opts):
        child.options.add("nounset")
    result, _ = parse(src)
    child.status = 0
    try:
        for group in result.groups:
            child.run_group(group, io.out, io.err, io.stream)
        if result.error is not None:
            child.report_parse_error(result.error, io.err, prefix=f"{name}: -c: line {getattr(result.error, 'line', 1)}: ")
    except ExitShell as exc:
        return exc.code
    return child.status


# ===================================================================== line tools
def cmd_paste(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("paste", args, "d:sz", io, long={"delimiters=": "d", "serial": "s"})
    delims = _paste_delims(o.last("d", "\t") or "")
    texts = _read_all(sh, io, "paste", o.operands or ["-"])
    if texts is None:
        return 1
    files = [split_lines(t) for t in texts]
    if o.has("s"):
        io.out.write(join_lines(_paste_join(lines, delims) for lines in files))
        return 0
    rows = max((len(f) for f in files), default=0)
    out = []
    for r in range(rows):
        out.append(_paste_join([f[r] if r < len(f) else "" for f in files], delims))
    io.out.write(join_lines(out))
    return 0


def _paste_delims(spec: str) -> list[str]:
    out, i = [], 0
    while i < len(spec):
        if spec[i] == "\\" and i + 1 < len(spec):
            out.append({"n": "\n", "t": "\t", "\\": "\\", "0": ""}.get(spec[i + 1], spec[i + 1]))
            i += 2
        else:
            out.append(spec[i])
            i += 1
    return out or [""]


def _paste_join(cells: list[str], delims: list[str]) -> str:
    out = cells[:1]
    for k, cell in enumerate(cells[1:]):
        out.append(delims[k % len(delims)] + cell)
    return "".join(out)


def cmd_nl(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("nl", args, "b:w:s:n:v:i:", io, long={"body-numbering=": "b", "number-width=": "w",
                                                      "number-separator=": "s", "number-format=": "n",
                                                      "starting-line-number=": "v", "line-increment=": "i"})
    style, width, sep = o.last("b", "t"), int(o.last("w", "6") or 6), o.last("s", "\t") or ""
    fmt, number, step = o.last("n", "rn"), int(o.last("v", "1") or 1), int(o.last("i", "1") or 1)
    if style not in ("a", "t", "n"):
        io.err.write(f"nl: invalid body numbering style: {quote_locale(style or '')}\n")
        return 1
    texts = _read_all(sh, io, "nl", o.operands or ["-"])
    if texts is None:
        return 1
    out = []
    for piece in re.findall(r"[^\n]*\n|[^\n]+", "".join(texts)):
        line = piece.rstrip("\n")
        if style == "a" or style == "t" and line != "":
            num = {"ln": f"{number:<{width}d}", "rz": f"{number:0{width}d}"}.get(fmt or "rn", f"{number:>{width}d}")
            out.append(num + sep + piece)
            number += step
        else:
            out.append(" " * (width + len(sep)) + piece)
    if out and not out[-1].endswith("\n"):  # nl ends its last line even when the input does not
        out[-1] += "\n"
    io.out.write("".join(out))
    return 0


def cmd_rev(sh: Shell, args: list[str], io: IO) -> int:
    texts = _read_all(sh, io, "rev", args or ["-"])
    if texts is None:
        return 1
    for text in texts:
        io.out.write("".join(p.rstrip("\n")[::-1] + ("\n" if p.endswith("\n") else "")
                             for p in re.findall(r"[^\n]*\n|[^\n]+", text)))
    return 0


def cmd_tac(sh: Shell, args: list[str], io: IO) -> int:
    texts = _read_all(sh, io, "tac", getopt("tac", args, "", io).operands or ["-"])
    if texts is None:
        return 1
    for text in texts:
        pieces = re.findall(r"[^\n]*\n|[^\n]+", text)
        io.out.write("".join(reversed(pieces)))
    return 0


def cmd_column(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("column", args, "ts:o:", io, long={"table": "t", "separator=": "s", "output-separator=": "o"})
    if not o.has("t"):
        io.err.write("column: sim-shell: only column -t is supported\n")
        return 2
    texts = _read_all(sh, io, "column", o.operands or ["-"])
    if texts is None:
        return 1
    seps, out_sep = o.last("s"), o.last("o", "  ") or ""
    rows = []
    for line in split_lines("".join(texts)):
        cells = [c for c in (re.split(f"[{re.escape(seps)}]", line) if seps else line.split())]
        if seps is None and not cells:
            continue
        rows.append(cells)
    width = max((len(row) for row in rows), default=0)
    widths = [max((len(row[k]) for row in rows if k < len(row)), default=0) for k in range(width)]
    for row in rows:  # util-linux pads every column but the table's last, even a row's missing cells
        cells = [(row[k] if k < len(row) else "").ljust(widths[k]) for k in range(width - 1)]
        io.out.write(out_sep.join([*cells, row[width - 1] if len(row) == width else ""]) + "\n")
    return 0


def cmd_comm(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("comm", args, "123", io, long={"check-order": "c", "nocheck-order": "C", "output-delimiter=": "d"})
    if len(o.operands) != 2:
        what = "missing operand" if len(o.operands) < 2 else f"extra operand {quote_locale(o.operands[2])}"
        io.err.write(f"comm: {what}\nTry 'comm --help' for more information.\n")
        return 1
    texts = _read_all(sh, io, "comm", o.operands)
    if texts is None:
        return 1
    a, b = split_lines(texts[0]), split_lines(texts[1])
    hide = {c for c in "123" if o.has(c)}
    delim = o.last("d", "\t") or ""
    prefix = {c: delim * len([d for d in "123"[: int(c) - 1] if d not in hide]) for c in "123"}
    i = j = 0
    unsorted = [False, False]
    out = []

    def emit(col: str, line: str) -> None:
        if col not in hide:
            out.append(prefix[col] + line)

    while i < len(a) or j < len(b):
        if j >= len(b) or i < len(a) and _bytes(a[i]) < _bytes(b[j]):
            unsorted[0] |= i + 1 < len(a) and _bytes(a[i + 1]) < _bytes(a[i])
            emit("1", a[i])
            i += 1
        elif i >= len(a) or _bytes(b[j]) < _bytes(a[i]):
            unsorted[1] |= j + 1 < len(b) and _bytes(b[j + 1]) < _bytes(b[j])
            emit("2", b[j])
            j += 1
        else:
            emit("3", a[i])
            i, j = i + 1, j + 1
    io.out.write(join_lines(out))
    return _order_warnings("comm", unsorted, io)


def _order_warnings(name: str, unsorted: list[bool], io: IO) -> int:
    for k, bad in enumerate(unsorted):
        if bad:
            io.err.write(f"{name}: file {k + 1} is not in sorted order\n")
    if any(unsorted):
        io.err.write(f"{name}: input is not in sorted order\n")
        return 1
    return 0


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def cmd_join(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("join", args, "t:1:2:a:v:i", io, long={"ignore-case": "i"})
    if len(o.operands) != 2:
        io.err.write("join: missing operand\nTry 'join --help' for more information.\n")
        return 1
    texts = _read_all(sh, io, "join", o.operands)
    if texts is None:
        return 1
    sep = o.last("t")
    k1, k2 = int(o.last("1", "1") or 1) - 1, int(o.last("2", "1") or 1) - 1
    unpaired = {int(v) for v in o.all("a") + o.all("v") if v in ("1", "2")}
    only = bool(o.has("v"))

    def fields(line: str) -> list[str]:
        return line.split(sep) if sep is not None else line.split()

    left = [fields(x) for x in split_lines(texts[0])]
    right = [fields(x) for x in split_lines(texts[1])]
    out_sep = sep if sep is not None else " "
    out = _join_rows(left, right, k1, k2, unpaired, only, out_sep)
    io.out.write(join_lines(out))
    return 0


def _join_rows(left, right, k1, k2, unpaired, only, out_sep) -> list[str]:
    def key(row, k):
        return row[k] if k < len(row) else ""

    def line(row, k, other=None, ko=0):
        rest = row[:k] + row[k + 1:]
        extra = (other[:ko] + other[ko + 1:]) if other is not None else []
        return out_sep.join([key(row, k), *rest, *extra])

    out, i, j = [], 0, 0
    while i < len(left) or j < len(right):
        a = key(left[i], k1) if i < len(left) else None
        b = key(right[j], k2) if j < len(right) else None
        if b is None or a is not None and _bytes(a) < _bytes(b):
            if 1 in unpaired:
                out.append(line(left[i], k1))
            i += 1
        elif a is None or _bytes(b) < _bytes(a):
            if 2 in unpaired:
                out.append(line(right[j], k2))
            j += 1
        else:
            j_end = j
            while j_end < len(right) and key(right[j_end], k2) == a:
                j_end += 1
            while i < len(left) and key(left[i], k1) == a:
                if not only:
                    out.extend(line(left[i], k1, right[r], k2) for r in range(j, j_end))
                i += 1
            j = j_end
    return out


# ===================================================================== files, env, time
def cmd_realpath(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("realpath", args, "emsqz", io, long={"relative-to=": "R", "canonicalize-existing": "e",
                                                     "canonicalize-missing": "m", "no-symlinks": "s", "quiet": "q"})
    status = 0
    for path in o.operands:
        r = sh.resolve(path)
        parent_ok = sh.fs.is_dir(sh.fs.parent(r)) or r.rel == ""
        ok = sh.fs.exists(r) or (not o.has("e") and parent_ok) or o.has("m")
        if not ok:
            if not o.has("q"):
                io.err.write(f"realpath: {path}: No such file or directory\n")
            status = 1
            continue
        full = posixpath.normpath(posixpath.join(sh.cwd, path))
        base = o.last("R")
        io.out.write((posixpath.relpath(full, posixpath.join(sh.cwd, base)) if base else full) + "\n")
    if not o.operands:
        io.err.write("realpath: missing operand\nTry 'realpath --help' for more information.\n")
        return 1
    return status


def cmd_env(sh: Shell, args: list[str], io: IO) -> int:
    extra: dict[str, str] = {}
    while args and "=" in args[0] and not args[0].startswith("="):
        name, _, value = args.pop(0).partition("=")
        extra[name] = value
    if args:
        child = sh.subshell()
        child.vars.update(extra)
        child.exported.update(extra)
        return child.call(args[0], args[1:], io, functions=False)
    env = {k: v for k, v in sh.vars.items() if k in sh.exported}
    env.update(extra)
    io.out.write("".join(f"{k}={v}\n" for k, v in env.items()))
    return 0


def cmd_date(sh: Shell, args: list[str], io: IO) -> int:
    fmt = next((a[1:] for a in args if a.startswith("+")), None)
    if fmt is None:
        io.out.write(SIM_DATE.strftime("%a %b %e %H:%M:%S UTC %Y") + "\n")
    else:
        io.out.write(SIM_DATE.strftime(fmt.replace("%N", "000000000").replace("%s", str(int(SIM_DATE.timestamp()))))
                     + "\n")
    return 0


def cmd_sleep(sh: Shell, args: list[str], io: IO) -> int:
    if not args:
        io.err.write("sleep: missing operand\nTry 'sleep --help' for more information.\n")
        return 1
    for a in args:
        if not re.fullmatch(r"\d+(\.\d*)?[smhd]?|\.\d+[smhd]?", a):
            io.err.write(f"sleep: invalid time interval {quote_locale(a)}\nTry 'sleep --help' for more information.\n")
            return 1
    return 0  # simulated time: nothing waits


def cmd_timeout(sh: Shell, args: list[str], io: IO) -> int:
    while args and args[0].startswith("-"):
        args = args[2:] if args[0] in ("-s", "-k") else args[1:]
    if len(args) < 2:
        io.err.write("timeout: missing operand\nTry 'timeout --help' for more information.\n")
        return 125
    return sh.call(args[1], args[2:], io, functions=False)


def _hashsum(algo: str):
    def cmd(sh: Shell, args: list[str], io: IO) -> int:
        name = f"{algo}sum"
        o = getopt(name, args, "bct", io)
        status = 0
        for path in o.operands or ["-"]:
            try:
                data = read_input(sh, io, path)
            except FsError as exc:
                missing(name, path, exc, io)
                status = 1
                continue
            digest = hashlib.new(algo, data.encode("utf-8", "surrogateescape")).hexdigest()
            io.out.write(f"{digest}  {path}\n")
        return status
    return cmd


def cmd_python(sh: Shell, args: list[str], io: IO) -> int:
    """The sim never runs agent-written code in the host process: interpreters are refused."""
    io.err.write("sim-shell: unsupported: running programs (python) on the sim backend: it never executes "
                 "code; use backend='local' or 'docker' (see docs/terminal.md)\n")
    io.out = NullSink()
    return 2


MOREUTILS = {
    "xargs": cmd_xargs, "bash": cmd_bash, "sh": cmd_bash, "paste": cmd_paste, "nl": cmd_nl, "rev": cmd_rev,
    "tac": cmd_tac, "column": cmd_column, "comm": cmd_comm, "join": cmd_join, "realpath": cmd_realpath,
    "env": cmd_env, "date": cmd_date, "sleep": cmd_sleep, "timeout": cmd_timeout, "md5sum": _hashsum("md5"),
    "sha1sum": _hashsum("sha1"), "sha256sum": _hashsum("sha256"), "python": cmd_python, "python3": cmd_python,
}
