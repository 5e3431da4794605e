"""``ls`` and ``find`` over the virtual file system.

Directory listings are in code point order (``ls`` in ``LC_ALL=C.UTF-8``). ``find`` visits
children in that order too; real ``find`` uses the file system's directory order, so outputs
agree as sets (compare through ``| sort``). ``ls -l`` shows fixed owner, mode and date columns.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable

from compactrl.shell_sim.common import getopt
from compactrl.shell_sim.fs import Resolved, quote_shell
from compactrl.shell_sim.regex import fnmatch_to_regex
from compactrl.shell_sim.shell import IO, BufferSink, InStream, Shell, UsageError


# ===================================================================== ls
def cmd_ls(sh: Shell, args: list[str], io: IO) -> int:
    o = getopt("ls", args, "1aAdFplrRhtS", io, code=2,
               long={"all": "a", "almost-all": "A", "directory": "d", "classify": "F", "recursive": "R",
                     "reverse": "r", "human-readable": "h"})
    if o.has("t") or o.has("S"):
        io.err.write("ls: sim-shell: sorting by time or size is not supported\n")
        return 2
    ops = o.operands or ["."]
    status = 0
    files, dirs = [], []
    for path in ops:
        r = sh.resolve(path)
        if not sh.fs.exists(r):
            io.err.write(f"ls: cannot access {quote_shell(path)}: {sh.fs.lookup_error(r)}\n")
            status = 2
        elif sh.fs.is_dir(r) and not o.has("d"):
            dirs.append(path)
        else:
            files.append(path)
    rev = o.has("r")
    files.sort(reverse=rev)
    dirs.sort(reverse=rev)
    chunks: list[str] = []
    if files:
        chunks.append(_ls_entries(sh, o, [(f, sh.resolve(f)) for f in files]))
    show_header = len(ops) > 1 or o.has("R")
    for d in dirs:
        chunks.extend(_ls_dir(sh, o, d, show_header))
    io.out.write("\n".join(chunks))
    return status


def _ls_dir(sh: Shell, o, path: str, header: bool) -> list[str]:
    r = sh.resolve(path)
    names = sh.fs.listdir(r)
    if o.has("a"):
        names = [".", "..", *names]
    elif not o.has("A"):
        names = [n for n in names if not n.startswith(".")]
    names.sort(reverse=o.has("r"))
    entries = [(n, sh.resolve(posixpath.join(path, n))) for n in names]
    body = _ls_entries(sh, o, entries, total=True)
    out = [(f"{path}:\n" if header else "") + body]
    if o.has("R"):
        for n, er in entries:
            if n not in (".", "..") and sh.fs.is_dir(er):
                out.extend(_ls_dir(sh, o, posixpath.join(path, n), True))
    return out


def _ls_entries(sh: Shell, o, entries: list[tuple[str, Resolved]], total: bool = False) -> str:
    lines = []
    blocks = 0
    for name, r in entries:
        is_dir = sh.fs.is_dir(r)
        suffix = "/" if is_dir and (o.has("F") or o.has("p")) else ""
        if o.has("l"):
            size = 4096 if is_dir else sh.fs.size(r)
            blocks += 4 if is_dir else -(-size // 4096) * 4
            mode = "drwxr-xr-x 2" if is_dir else "-rw-r--r-- 1"
            shown = _human(size) if o.has("h") else str(size)
            lines.append(f"{mode} root root {shown:>5} Jan  1 00:00 {name}{suffix}")
        else:
            lines.append(name + suffix)
    head = [f"total {blocks}"] if o.has("l") and total else []
    return "".join(line + "\n" for line in head + lines)


def _human(size: int) -> str:
    for unit in ("", "K", "M", "G"):
        if size < 1024 or unit == "G":
            return f"{size}{unit}" if unit == "" else f"{size:.1f}{unit}" if size < 10 else f"{size:.0f}{unit}"
        size = -(-size // 1024) if size >= 10 * 1024 else size / 1024  # type: ignore[assignment]
    return str(size)


# ===================================================================== find
Pred = Callable[[str, str, Resolved, int], bool]  # (printed path, name, resolved, depth)


class _FindParser:
    def __init__(self, sh: Shell, io: IO, toks: list[str]) -> None:
        self.sh, self.io, self.toks, self.i = sh, io, toks, 0
        self.maxdepth: int | None = None
        self.mindepth = 0
        self.has_action = False
        self.printed: list[str] = []
        self.pruned = False
        self.batches: list[tuple[list[str], list[str]]] = []

    def fail(self, msg: str) -> None:
        self.io.err.write(f"find: {msg}\n")
        raise UsageError(1)

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def parse(self) -> Pred:
        if self.peek() is None:
            return lambda *a: True
        pred = self._or()
        if self.peek() is not None:
            self.fail(f"paths must precede expression: `{self.peek()}'" if self.peek() != ")"
                      else "invalid expression; you have too many ')'")
        return pred

    def _or(self) -> Pred:
        left = self._and()
        while self.peek() in ("-o", "-or"):
            self.i += 1
            right = self._and()
            left = (lambda a, b: lambda *x: a(*x) or b(*x))(left, right)
        return left

    def _and(self) -> Pred:
        left = self._not()
        while self.peek() is not None and self.peek() not in ("-o", "-or", ")"):
            if self.peek() in ("-a", "-and"):
                self.i += 1
            right = self._not()
            left = (lambda a, b: lambda *x: a(*x) and b(*x))(left, right)
        return left

    def _not(self) -> Pred:
        if self.peek() in ("!", "-not"):
            self.i += 1
            inner = self._not()
            return lambda *x: not inner(*x)
        if self.peek() == "(":
            self.i += 1
            inner = self._or()
            if self.peek() != ")":
                self.fail("invalid expression; I was expecting to find a ')' somewhere but did not see one.")
            self.i += 1
            return inner
        return self._primary()

    def _arg(self, name: str) -> str:
        if self.i >= len(self.toks):
            self.fail(f"missing argument to `{name}'")
        self.i += 1
        return self.toks[self.i - 1]

    def _primary(self) -> Pred:
        tok = self.toks[self.i]
        self.i += 1
        if tok in ("-name", "-iname", "-path", "-ipath", "-wholename"):
            pat = self._arg(tok)
            flags = re.IGNORECASE | re.DOTALL if tok.startswith("-i") else re.DOTALL
            rx = re.compile(fnmatch_to_regex(pat, pathname=False), flags)
            if "name" in tok and "whole" not in tok:
                return lambda p, n, r, d: rx.fullmatch(n) is not None
            return lambda p, n, r, d: rx.fullmatch(p) is not None
        if tok == "-type":
            kind = self._arg(tok)
            if kind not in ("f", "d", "l", "b", "c", "p", "s"):
                self.fail(f"Unknown argument to -type: {kind}")
            return lambda p, n, r, d: (kind == "f" and self.sh.fs.is_file(r)) or (kind == "d" and self.sh.fs.is_dir(r))
        if tok in ("-maxdepth", "-mindepth"):
            value = self._arg(tok)
            if not value.isdigit():
                self.fail(f"Expected a positive decimal integer argument to {tok}, but got ‘{value}’")
            if tok == "-maxdepth":
                self.maxdepth = int(value)
            else:
                self.mindepth = int(value)
            return lambda *x: True
        if tok == "-empty":
            return lambda p, n, r, d: (self.sh.fs.is_file(r) and self.sh.fs.read(r) == "") or (
                self.sh.fs.is_dir(r) and not self.sh.fs.listdir(r))
        if tok in ("-print", "-print0"):
            self.has_action = True
            end = "\n" if tok == "-print" else "\0"
            return lambda p, n, r, d: self.printed.append(p + end) is None
        if tok in ("-true", "-false"):
            return lambda *x: tok == "-true"
        if tok in ("-mmin", "-mtime", "-amin", "-atime", "-cmin", "-ctime"):
            # every file in the sim was written when the episode began: "-N" (newer than N
            # units) holds, "+N" and "N" do not
            value = self._arg(tok)
            if not re.fullmatch(r"[+-]?\d+", value):
                self.fail(f"invalid argument `{value}' to `{tok}'")
            return lambda *x: value.startswith("-")
        if tok == "-newer":
            self._arg(tok)
            return lambda *x: False
        if tok == "-prune":
            return lambda p, n, r, d: self.prune() or True
        if tok == "-exec":
            return self._exec()
        if tok in ("-execdir", "-ok", "-delete", "-size", "-perm", "-regex"):
            self.fail(f"sim-shell: {tok} is not supported")
        self.fail(f"unknown predicate `{tok}'")
        raise AssertionError  # unreachable


    def prune(self) -> None:
        self.pruned = True

    def _exec(self) -> Pred:
        """``-exec CMD ... ;`` (once per path, true when it exits 0) or ``-exec CMD ... {} +``
        (paths collected and run in one batch after the walk, always true)."""
        start = self.i
        while self.i < len(self.toks) and self.toks[self.i] != ";" and not (
                self.toks[self.i] == "+" and self.toks[self.i - 1] == "{}"):
            self.i += 1
        if self.i >= len(self.toks) or self.i == start:
            self.fail("missing argument to `-exec'")
        argv, batch = self.toks[start:self.i], self.toks[self.i] == "+"
        self.i += 1
        self.has_action = True
        if batch:
            self.batches.append((argv[:-1], []))
            paths = self.batches[-1][1]
            return lambda p, n, r, d: paths.append(p) is None
        return lambda p, n, r, d: self.run_exec([a.replace("{}", p) for a in argv]) == 0

    def run_exec(self, argv: list[str]) -> int:
        sink = BufferSink(self.sh.file_limit)
        code = self.sh.subshell().call(argv[0], argv[1:], IO(InStream(), sink, self.io.err), functions=False)
        self.printed.append(sink.value())
        return code


def cmd_find(sh: Shell, args: list[str], io: IO) -> int:
    k = 0
    while k < len(args) and args[k] in ("-H", "-L", "-P"):
        k += 1
    starts = []
    while k < len(args) and not (args[k].startswith("-") and len(args[k]) > 1) and args[k] not in ("(", "!"):
        starts.append(args[k])
        k += 1
    parser = _FindParser(sh, io, args[k:])
    pred = parser.parse()
    status = 0
    for start in starts or ["."]:
        r = sh.resolve(start)
        if not sh.fs.exists(r):
            io.err.write(f"find: \u2018{start}\u2019: {sh.fs.lookup_error(r)}\n")
            status = 1
            continue
        _visit(sh, parser, pred, start, r, 0, io)
    for argv, paths in parser.batches:
        if paths:
            parser.printed.clear()
            status = 1 if parser.run_exec(argv + paths) else status
            io.out.write("".join(parser.printed))
    return status


def _visit(sh: Shell, fp: _FindParser, pred: Pred, path: str, r: Resolved, depth: int, io: IO) -> None:
    name = posixpath.basename(path.rstrip("/")) or path
    fp.pruned = False
    if depth >= fp.mindepth:
        fp.printed.clear()
        if pred(path, name, r, depth) and not fp.has_action:
            io.out.write(path + "\n")
        elif fp.printed:
            io.out.write("".join(fp.printed))
    if sh.fs.is_dir(r) and not fp.pruned and (fp.maxdepth is None or depth < fp.maxdepth):
        for child in sh.fs.listdir(r):
            cpath = path + child if path.endswith("/") else f"{path}/{child}"
            _visit(sh, fp, pred, cpath, sh.resolve(cpath), depth + 1, io)


LISTING = {"ls": cmd_ls, "find": cmd_find}
