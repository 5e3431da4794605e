"""GNU sed 4.x subset.

Commands: ``s y p P d D q Q n N = a i c h H g G x b t T : { } w`` with ``!``; addresses: line numbers,
``$``, ``/re/`` and ``\\cREc`` (flag ``I``), ``first~step``, ranges ``a,b``, ``a,+N``, ``a,~N`` and
``0,/re/``. Options: ``-n -e -f -E -r -i[SUFFIX] -s``. ``s`` flags: ``g p N i I w``; replacement
escapes ``& \\1-\\9 \\n \\t \\L \\U \\l \\u \\E``. A last line without a newline is written back
without one, as GNU does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from compactrl.shell_sim.common import getopt, read_input
from compactrl.shell_sim.fs import EISDIR, FsError
from compactrl.shell_sim.regex import RegexError, compile_posix
from compactrl.shell_sim.shell import IO, Shell, Sink, UsageError

SED_USAGE = "Usage: sed [OPTION]... {script-only-if-no-other-script} [input-file]...\n\n  -n, --quiet, --silent\n                 suppress automatic printing of pattern space\n      --debug\n                 annotate program execution\n  -e script, --expression=script\n                 add the script to the commands to be executed\n  -f script-file, --file=script-file\n                 add the contents of script-file to the commands to be executed\n  --follow-symlinks\n                 follow symlinks when processing in place\n  -i[SUFFIX], --in-place[=SUFFIX]\n                 edit files in place (makes backup if SUFFIX supplied)\n  -l N, --line-length=N\n                 specify the desired line-wrap length for the `l' command\n  --posix\n                 disable all GNU extensions.\n  -E, -r, --regexp-extended\n                 use extended regular expressions in the script\n                 (for portability use POSIX -E).\n  -s, --separate\n                 consider files as separate rather than as a single,\n                 continuous long stream.\n      --sandbox\n                 operate in sandbox mode (disable e/r/w commands).\n  -u, --unbuffered\n                 load minimal amounts of data from the input files and flush\n                 the output buffers more often\n  -z, --null-data\n                 separate lines by NUL characters\n      --help     display this help and exit\n      --version  output version information and exit\n\nIf no -e, --expression, -f, or --file option is given, then the first\nnon-option argument is taken as the sed script to interpret.  All\nremaining arguments are names of input files; if no input files are\nspecified, then the standard input is read.\n\nGNU sed home page: <https://www.gnu.org/software/sed/>.\nGeneral help using GNU software: <https://www.gnu.org/gethelp/>.\n"
"""What GNU sed 4.9 prints after a bad option (its ``--help`` text without the bug-report line)."""


class SedError(Exception):
    pass


@dataclass
class Addr:
    kind: str  # "line", "last", "re", "step", "zero", "plus", "tilde"
    n: int = 0
    step: int = 0
    rx: re.Pattern | None = None


@dataclass
class Cmd:
    name: str
    a1: Addr | None = None
    a2: Addr | None = None
    negate: bool = False
    arg: str = ""
    rx: re.Pattern | None = None
    repl: list = field(default_factory=list)
    gflag: bool = False
    nth: int = 1
    pflag: bool = False
    wfile: str | None = None
    table: dict[str, str] | None = None
    target: int = -1  # for b/t/T/{ : index to jump to
    # range state
    active: bool = False
    end_line: int = 0


class _Parser:
    def __init__(self, script: str, extended: bool) -> None:
        self.s, self.i, self.extended = script, 0, extended
        self.cmds: list[Cmd] = []
        self.blocks: list[int] = []
        self.labels: dict[str, int] = {}
        self.last_rx: re.Pattern | None = None

    def err(self, msg: str) -> SedError:
        return SedError(f"-e expression #1, char {self.i}: {msg}")

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def skip_ws(self, newlines: bool = True) -> None:
        while self.peek() and (self.peek() in " \t" or (newlines and self.peek() in "\n;")):
            self.i += 1

    def parse(self) -> list[Cmd]:
        while True:
            self.skip_ws()
            if not self.peek():
                break
            if self.peek() == "#":
                while self.peek() not in ("", "\n"):
                    self.i += 1
                continue
            self._command()
        if self.blocks:
            raise self.err("unmatched `{'")
        for c in self.cmds:
            if c.name in "btT" and c.target == -2:
                if c.arg not in self.labels:
                    raise SedError(f"can't find label for jump to `{c.arg}'")
                c.target = self.labels[c.arg]
        return self.cmds

    def _number(self) -> int:
        start = self.i
        while self.peek().isdigit():
            self.i += 1
        return int(self.s[start:self.i])

    def _address(self) -> Addr | None:
        c = self.peek()
        if c.isdigit():
            n = self._number()
            if self.peek() == "~":
                self.i += 1
                step = self._number() if self.peek().isdigit() else 0
                return Addr("step", n, step)
            return Addr("zero" if n == 0 else "line", n)
        if c == "$":
            self.i += 1
            return Addr("last")
        if c in ("/", "\\"):
            if c == "\\":
                self.i += 1
            delim = self.peek()
            self.i += 1
            pattern = self._delimited(delim, "unterminated address regex")
            icase = False
            while self.peek() in ("I", "M"):
                icase = icase or self.peek() == "I"
                self.i += 1
            return Addr("re", rx=self._compile(pattern, icase))
        return None

    def _compile(self, pattern: str, icase: bool) -> re.Pattern:
        if pattern == "":
            if self.last_rx is None:
                raise SedError("no previous regular expression")
            return self.last_rx
        try:
            rx = compile_posix(pattern, self.extended, icase, sed_escapes=True)
        except RegexError as exc:
            raise self.err(str(exc)) from exc
        self.last_rx = rx
        return rx

    def _delimited(self, delim: str, unterminated: str) -> str:
        out: list[str] = []
        while True:
            c = self.peek()
            if c == "" or c == "\n" and delim != "\n":
                raise self.err(unterminated)
            self.i += 1
            if c == delim:
                return "".join(out)
            if c == "\\":
                nxt = self.peek()
                self.i += 1
                if nxt == delim:
                    out.append(delim)
                elif nxt == "n":
                    out.append("\\n")
                elif nxt == "":
                    raise self.err(unterminated)
                else:
                    out.append("\\" + nxt)
            else:
                out.append(c)

    def _command(self) -> None:
        cmd = Cmd("")
        cmd.a1 = self._address()
        if cmd.a1 is not None and self.peek() == ",":
            self.i += 1
            self.skip_ws(newlines=False)
            if self.peek() in ("+", "~"):
                kind = "plus" if self.peek() == "+" else "tilde"
                self.i += 1
                cmd.a2 = Addr(kind, self._number() if self.peek().isdigit() else 0)
            else:
                cmd.a2 = self._address()
                if cmd.a2 is None:
                    raise self.err("unexpected `,'")
        if cmd.a1 is not None and cmd.a1.kind == "zero" and (cmd.a2 is None or cmd.a2.kind != "re"):
            raise self.err("invalid usage of line address 0")
        self.skip_ws(newlines=False)
        while self.peek() == "!":
            cmd.negate = True
            self.i += 1
            self.skip_ws(newlines=False)
        name = self.peek()
        if not name:
            raise self.err("missing command")
        self.i += 1
        cmd.name = name
        self._command_body(cmd)

    def _command_body(self, cmd: Cmd) -> None:
        name = cmd.name
        if name == "{":
            self.blocks.append(len(self.cmds))
            self.cmds.append(cmd)
            return
        if name == "}":
            if not self.blocks:
                raise self.err("unexpected `}'")
            self.cmds[self.blocks.pop()].target = len(self.cmds)
            self._end()
            return
        if name == ":":
            label = self._label()
            if not label:
                raise self.err("\":\" lacks a label")
            self.labels[label] = len(self.cmds)
            return
        if name == "s":
            self._substitute(cmd)
        elif name == "y":
            self._transliterate(cmd)
        elif name in "aic":
            cmd.arg = self._text()
        elif name in "btT":
            cmd.arg = self._label()
            cmd.target = -2 if cmd.arg else 10**9
        elif name in "qQ":
            self.skip_ws(newlines=False)
            cmd.arg = str(self._number()) if self.peek().isdigit() else "0"
        elif name in "wr":
            cmd.wfile = self._filename()
        elif name not in "pPdDnN=hHgGxlz":
            raise self.err(f"unknown command: `{name}'")
        self.cmds.append(cmd)
        if name not in "aicwr":
            self._end()

    def _end(self) -> None:
        self.skip_ws(newlines=False)
        if self.peek() == "#":
            return
        if self.peek() not in ("", "\n", ";", "}"):
            raise self.err("extra characters after command")

    def _label(self) -> str:
        self.skip_ws(newlines=False)
        start = self.i
        while self.peek() not in ("", "\n", ";"):
            self.i += 1
        return self.s[start:self.i].strip()

    def _filename(self) -> str:
        self.skip_ws(newlines=False)
        start = self.i
        while self.peek() not in ("", "\n"):
            self.i += 1
        return self.s[start:self.i]

    def _text(self) -> str:
        self.skip_ws(newlines=False)
        if self.peek() == "\\":
            self.i += 1
            if self.peek() == "\n":
                self.i += 1
        else:
            self.skip_ws(newlines=False)
        out: list[str] = []
        while self.peek():
            c = self.peek()
            self.i += 1
            if c == "\\":
                nxt = self.peek()
                self.i += 1
                out.append("\n" if nxt == "\n" else nxt)
            elif c == "\n":
                break
            else:
                out.append(c)
        return "".join(out)

    def _substitute(self, cmd: Cmd) -> None:
        delim = self.peek()
        if delim in ("", "\n", "\\"):
            raise self.err("unterminated `s' command")
        self.i += 1
        pattern = self._delimited(delim, "unterminated `s' command")
        raw_repl = self._raw_until(delim)
        icase = False
        while True:
            c = self.peek()
            if c == "g":
                cmd.gflag = True
            elif c == "p":
                cmd.pflag = True
            elif c in ("i", "I"):
                icase = True
            elif c in ("m", "M", "e"):
                pass
            elif c.isdigit():
                cmd.nth = self._number()
                if cmd.nth == 0:
                    raise self.err("number option to `s' command may not be zero")
                continue
            elif c == "w":
                self.i += 1
                cmd.wfile = self._filename()
                break
            else:
                break
            self.i += 1
        cmd.rx = self._compile(pattern, icase)
        cmd.repl = _parse_replacement(raw_repl)
        if cmd.wfile is None and self.peek() not in ("", "\n", ";", "}", " ", "\t", "#"):
            raise self.err("unknown option to `s'")

    def _raw_until(self, delim: str) -> str:
        out: list[str] = []
        while True:
            c = self.peek()
            if c == "":
                raise self.err("unterminated `s' command")
            self.i += 1
            if c == delim:
                return "".join(out)
            if c == "\\":
                nxt = self.peek()
                self.i += 1
                out.append(delim if nxt == delim and delim not in "&\\" else "\\" + nxt)
            else:
                out.append(c)

    def _transliterate(self, cmd: Cmd) -> None:
        delim = self.peek()
        self.i += 1
        src = _unescape_y(self._delimited(delim, "unterminated `y' command"))
        dst = _unescape_y(self._delimited(delim, "unterminated `y' command"))
        if len(src) != len(dst):
            raise self.err("strings for `y' command are different lengths")
        cmd.table = dict(zip(src, dst))


def _unescape_y(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "\\": "\\"}.get(m.group(1), m.group(1)), text)


def _parse_replacement(raw: str) -> list:
    """Replacement as a list of str / int (group) / ("case", letter) items."""
    out: list = []
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == "&":
            out.append(0)
            i += 1
        elif c == "\\" and i + 1 < len(raw):
            e = raw[i + 1]
            i += 2
            if e.isdigit():
                out.append(int(e))
            elif e in "LUluE":
                out.append(("case", e))
            else:
                out.append({"n": "\n", "t": "\t", "\n": "\n", "&": "&", "\\": "\\"}.get(e, e))
        else:
            out.append(c)
            i += 1
    return out


def _expand_replacement(repl: list, m: re.Match) -> str:
    out: list[str] = []
    mode, one = "", ""
    for item in repl:
        if isinstance(item, tuple):
            letter = item[1]
            if letter in "LU":
                mode, one = letter, ""
            elif letter == "E":
                mode, one = "", ""
            else:
                one = letter
            continue
        text = (m.group(item) or "") if isinstance(item, int) else item
        if mode == "L":
            text = text.lower()
        elif mode == "U":
            text = text.upper()
        if one and text:
            text = (text[0].lower() if one == "l" else text[0].upper()) + text[1:]
            one = ""
        out.append(text)
    return "".join(out)


# ===================================================================== execution
class _Output:
    """An output stream that re-adds a missing newline before the next write (GNU's behaviour)."""

    def __init__(self, sink: Sink | None = None) -> None:
        self.sink = sink
        self.parts: list[str] = []
        self.missing_newline = False

    def write(self, text: str, newline: bool = True) -> None:
        if self.missing_newline:
            self._put("\n")
        self._put(text + ("\n" if newline else ""))
        self.missing_newline = not newline

    def _put(self, text: str) -> None:
        if self.sink is not None:
            self.sink.write(text)
        else:
            self.parts.append(text)


@dataclass
class _Input:
    lines: list[tuple[str, bool]]  # (text, had newline)
    pos: int = 0

    def next(self) -> tuple[str, bool] | None:
        if self.pos >= len(self.lines):
            return None
        self.pos += 1
        return self.lines[self.pos - 1]

    def is_last(self) -> bool:
        return self.pos >= len(self.lines)


def _lines(text: str) -> list[tuple[str, bool]]:
    pieces = re.findall(r"[^\n]*\n|[^\n]+", text)
    return [(p.rstrip("\n"), p.endswith("\n")) for p in pieces]


_EDITS = frozenset("yhHgGx")
"""sed commands that change only the pattern and hold spaces (:meth:`_Machine._edit`)."""

_WRITES = frozenset("pP=airwl")
"""sed commands that only write, now or at the end of the cycle (:meth:`_Machine._write`)."""


class _Machine:
    def __init__(self, sh: Shell, cmds: list[Cmd], quiet: bool, out: _Output, inp: _Input) -> None:
        self.sh, self.cmds, self.quiet, self.out, self.inp = sh, cmds, quiet, out, inp
        self.line_no = 0
        self.hold = ""
        self.hold_nl = True  # GNU: the hold space starts as an empty line *with* its newline
        self.wfiles: dict[str, _Output] = {}
        self.exit_code: int | None = None

    def _match(self, a: Addr, ps: str) -> bool:
        if a.kind == "line":
            return self.line_no == a.n
        if a.kind == "last":
            return self.inp.is_last()
        if a.kind == "step":
            return self.line_no == a.n if a.step <= 0 else (
                self.line_no >= a.n and (self.line_no - a.n) % a.step == 0)
        if a.kind == "re":
            assert a.rx is not None
            return a.rx.search(ps) is not None
        return False

    def _selected(self, c: Cmd, ps: str) -> bool:
        if c.a1 is None:
            return not c.negate
        if c.a2 is None:
            return self._match(c.a1, ps) != c.negate
        return self._in_range(c, ps) != c.negate

    def _in_range(self, c: Cmd, ps: str) -> bool:
        assert c.a1 is not None and c.a2 is not None
        if c.active:
            a2 = c.a2
            if a2.kind in ("line", "plus", "tilde"):
                if self.line_no >= c.end_line:
                    c.active = False
                return self.line_no <= c.end_line
            if self._match(a2, ps):
                c.active = False
            return True
        starts = self._match(c.a1, ps) if c.a1.kind != "zero" else self.line_no == 1
        if not starts:
            return False
        a2 = c.a2
        if c.a1.kind == "zero":
            c.active = not self._match(a2, ps)
            return True
        if a2.kind == "line":
            c.active, c.end_line = a2.n > self.line_no, a2.n
        elif a2.kind == "plus":
            c.active, c.end_line = a2.n > 0, self.line_no + a2.n
        elif a2.kind == "tilde":  # GNU: up to the next multiple of N after this line
            end = self.line_no if a2.n <= 0 else self.line_no + a2.n - self.line_no % a2.n
            c.active, c.end_line = end > self.line_no, end
        elif a2.kind == "last":
            c.active = not self.inp.is_last()
        else:
            c.active = True
        return True

    def run(self) -> None:
        while self.exit_code is None:
            item = self.inp.next()
            if item is None:
                return
            self.line_no += 1
            self._cycle(*item)

    def _cycle(self, ps: str, nl: bool) -> None:
        """Run the script over one input line ``ps`` (``nl``: it ended with a newline), as GNU sed's
        cycle: the commands that change the flow (``c d D n N b t T q Q``) are here, the others in
        :meth:`_edit` and :meth:`_write`; then the pattern space is printed (unless ``-n`` or a command
        suppressed it) and the queued ``a``/``r`` texts follow."""
        append: list[str] = []
        pc, tflag, autoprint = 0, False, not self.quiet
        while pc < len(self.cmds):
            c = self.cmds[pc]
            pc += 1
            if not self._selected(c, ps):
                if c.name == "{":
                    pc = c.target
                continue
            name = c.name
            if name == "{":
                continue
            if name == "s":
                ps, done = self._subst(c, ps, nl)
                tflag = tflag or done
            elif name in _EDITS:
                ps, nl = self._edit(c, ps, nl)
            elif name in _WRITES:
                self._write(c, ps, nl, append)
            elif name == "c":
                if c.a2 is None or not c.active or c.negate:
                    self.out.write(c.arg, True)
                autoprint = False
                break
            elif name == "d":
                autoprint = False
                break
            elif name == "D":
                if "\n" not in ps:
                    autoprint = False
                    break
                ps = ps.split("\n", 1)[1]
                self._flush_append(append)
                append, pc = [], 0
                continue
            elif name in "nN":
                if self.inp.is_last():  # GNU: print the pattern space and stop
                    break
                ps, nl = self._next_line(name, ps, nl, append)
                append = []
            elif name in "btT":
                jump = name == "b" or (name == "t" and tflag) or (name == "T" and not tflag)
                if name in "tT":
                    tflag = False if jump or name == "t" else tflag
                if jump:
                    pc = c.target if c.target < 10**9 else len(self.cmds)
            elif name in "qQ":
                self.exit_code = int(c.arg)
                if name == "Q":
                    autoprint = False
                break
        if autoprint:
            self.out.write(ps, nl)
        self._flush_append(append)

    def _edit(self, c: Cmd, ps: str, nl: bool) -> tuple[str, bool]:
        """A command of :data:`_EDITS`: the new pattern space and its newline flag (the hold space
        changes in place)."""
        name = c.name
        if name == "y":
            ps = "".join((c.table or {}).get(ch, ch) for ch in ps)
        elif name == "h":
            self.hold, self.hold_nl = ps, nl
        elif name == "H":
            self.hold, self.hold_nl = self.hold + "\n" + ps, nl
        elif name == "g":
            ps, nl = self.hold, self.hold_nl
        elif name == "G":
            ps, nl = ps + "\n" + self.hold, self.hold_nl
        elif name == "x":
            ps, self.hold, nl, self.hold_nl = self.hold, ps, self.hold_nl, nl
        return ps, nl

    def _write(self, c: Cmd, ps: str, nl: bool, append: list[str]) -> None:
        """A command of :data:`_WRITES`: write now, to the output or a ``w`` file, or queue a text on
        ``append`` for the end of the cycle (``a``, ``r``)."""
        name = c.name
        if name == "p":
            self.out.write(ps, nl)
        elif name == "P":
            self.out.write(ps.split("\n", 1)[0], True)
        elif name == "=":
            self.out.write(str(self.line_no), True)
        elif name == "a":
            append.append(c.arg)
        elif name == "i":
            self.out.write(c.arg, True)
        elif name == "r":
            try:
                append.append(self.sh.fs.read(self.sh.resolve(c.wfile or "")).rstrip("\n"))
            except FsError:
                pass
        elif name == "w":
            self.wfiles.setdefault(c.wfile or "", _Output()).write(ps, nl)
        elif name == "l":
            self.out.write(ps.replace("\\", "\\\\").replace("\t", "\\t") + "$", True)

    def _next_line(self, name: str, ps: str, nl: bool, append: list[str]) -> tuple[str, bool]:
        """``n`` prints the pattern space (unless ``-n``) and replaces it with the next line, ``N``
        appends the next line to it; the queued ``append`` texts are written first. The caller has
        checked that a next line exists."""
        if name == "n" and not self.quiet:
            self.out.write(ps, nl)
        self._flush_append(append)
        nxt, nl = self.inp.next()  # type: ignore[misc]
        self.line_no += 1
        return (nxt if name == "n" else ps + "\n" + nxt), nl

    def _flush_append(self, append: list[str]) -> None:
        for text in append:
            self.out.write(text, True)

    def _subst(self, c: Cmd, ps: str, nl: bool) -> tuple[str, bool]:
        assert c.rx is not None
        count, pieces, pos, done = 0, [], 0, False
        for m in c.rx.finditer(ps):
            count += 1
            if count < c.nth:
                continue
            pieces.append(ps[pos:m.start()])
            pieces.append(_expand_replacement(c.repl, m))
            pos = m.end()
            done = True
            if not c.gflag:
                break
        if not done:
            return ps, False
        pieces.append(ps[pos:])
        ps = "".join(pieces)
        if c.pflag:
            self.out.write(ps, nl)
        if c.wfile is not None:
            self.wfiles.setdefault(c.wfile, _Output()).write(ps, nl)
        return ps, True


def cmd_sed(sh: Shell, args: list[str], io: IO) -> int:
    # -i takes an optional attached suffix, which getopt cannot express: peel it off first
    suffix, rest = None, []
    for a in args:
        if re.fullmatch(r"-[nEr]*i.*", a) and not a.startswith("--"):
            body = a[1:]
            k = body.index("i")
            suffix = body[k + 1:]
            rest.append("-" + (body[:k] or "") + "I") if body[:k] else rest.append("-I")
        else:
            rest.append(a)
    try:
        o = getopt("sed", rest, "ne:f:ErIsuz", io, long={"quiet": "n", "silent": "n", "expression=": "e",
                                                           "file=": "f", "regexp-extended": "E", "separate": "s"},
                   help_text=SED_USAGE)
    except UsageError:
        return 1
    in_place = o.has("I")
    scripts = o.all("e")
    for f in o.all("f"):
        try:
            scripts.append(read_input(sh, io, f).rstrip("\n"))
        except FsError as exc:
            io.err.write(f"sed: couldn't open file {f}: {exc.strerror}\n")
            return 1
    operands = o.operands
    if not scripts:
        if not operands:
            io.err.write("Usage: sed [OPTION]... {script-only-if-no-other-script} [input-file]...\n\n")
            return 1
        scripts, operands = [operands[0]], operands[1:]
    try:
        cmds = _Parser("\n".join(scripts), o.has("E") or o.has("r")).parse()
    except SedError as exc:
        io.err.write(f"sed: {exc}\n")
        return 1
    for c in cmds:  # GNU opens (truncates) every w file before reading any input
        if c.wfile is not None and c.name in "sw" and c.wfile not in ("/dev/stdout", "/dev/stderr"):
            try:
                sh.fs.write(sh.resolve(c.wfile), "")
            except FsError as exc:
                io.err.write(f"sed: couldn't open file {c.wfile}: {exc.strerror}\n")
                return 4
    if in_place:
        if not operands:
            io.err.write("sed: no input files\n")
            return 1
        return _run_in_place(sh, io, cmds, o.has("n"), operands, suffix)
    return _run_stream(sh, io, cmds, o.has("n"), operands or ["-"], o.has("s"))


def _read_all(sh: Shell, io: IO, paths: list[str]) -> tuple[list[tuple[str, bool]], int]:
    lines, status = [], 0
    for p in paths:
        try:
            lines.extend(_lines(read_input(sh, io, p)))
        except FsError as exc:
            if exc.strerror == EISDIR:
                io.err.write(f"sed: read error on {p}: {EISDIR}\n")
            else:
                io.err.write(f"sed: can't read {p}: {exc.strerror}\n")
            status = 2
    return lines, status


def _run_stream(sh: Shell, io: IO, cmds: list[Cmd], quiet: bool, paths: list[str], separate: bool) -> int:
    out = _Output(io.out)
    status = 0
    groups = [[p] for p in paths] if separate else [paths]
    line_no = 0
    for group in groups:
        lines, st = _read_all(sh, io, group)
        status = max(status, st)
        m = _Machine(sh, cmds, quiet, out, _Input(lines))
        m.line_no = line_no
        m.run()
        line_no = m.line_no
        _write_wfiles(sh, m)
        if m.exit_code is not None:
            return m.exit_code or status
    return status


def _run_in_place(sh: Shell, io: IO, cmds: list[Cmd], quiet: bool, paths: list[str], suffix: str | None) -> int:
    status = 0
    for p in paths:
        r = sh.resolve(p)
        if sh.fs.is_dir(r):
            io.err.write(f"sed: couldn't edit {p}: not a regular file\n")
            status = 4
            continue
        try:
            text = sh.fs.read(r)
        except FsError as exc:
            io.err.write(f"sed: can't read {p}: {exc.strerror}\n")
            status = 2
            continue
        out = _Output()
        m = _Machine(sh, cmds, quiet, out, _Input(_lines(text)))
        m.run()
        if suffix:
            sh.fs.write(sh.resolve(p + suffix if "*" not in suffix else suffix.replace("*", p)), text)
        sh.fs.write(r, "".join(out.parts))
        _write_wfiles(sh, m)
        if m.exit_code is not None:
            return m.exit_code
    return status


def _write_wfiles(sh: Shell, m: _Machine) -> None:
    for name, out in m.wfiles.items():
        if name == "/dev/stdout":
            continue
        sh.fs.write(sh.resolve(name), "".join(out.parts))


SED = {"sed": cmd_sed}
