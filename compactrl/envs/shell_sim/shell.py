"""The executor: expansions, globbing, redirections, pipelines and and-or lists.

Pipeline stages run one after another (stage i's output is stage i+1's input), each in a copy of
the shell state as bash's subshells are, so ``cd`` inside a pipeline does not leak. Streams are
:class:`Sink` objects; writes keep their order so ``cmd > f 2>&1`` interleaves like bash.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from compactrl.envs.shell_sim.fs import EACCES, FsError, Resolved, VirtualFS
from compactrl.envs.shell_sim.parser import AndOr, Command, Pipeline, Redirect, Word, parse
from compactrl.envs.shell_sim.regex import fnmatch_to_regex

log = logging.getLogger(__name__)

_IFS_WS = " \t\n"


_LONE_BYTES = re.compile("[\udc80-\udcff]+")


def clean_text(text: str) -> str:
    """Text as the model and the files see it: bytes that were not valid UTF-8 (kept between
    pipeline stages as lone surrogates, so ``wc -c`` and friends count them right) become U+FFFD,
    as decoding the real bytes with replacement does."""
    if not _LONE_BYTES.search(text):
        return text
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class OutputLimit(Exception):
    """The command produced more output than the emulator keeps."""


class UsageError(Exception):
    """Bad options; the command has already printed GNU's message. ``code`` is its exit status."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class ExitShell(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


# ===================================================================== streams
class Sink:
    def write(self, text: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class BufferSink(Sink):
    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.limit = limit

    def write(self, text: str) -> None:
        self.size += len(text)
        if self.size > self.limit:
            raise OutputLimit()
        self.parts.append(text)

    def value(self) -> str:
        return "".join(self.parts)


class NullSink(Sink):
    def write(self, text: str) -> None:
        pass


@dataclass
class Terminal:
    """The shell's own stdout/stderr: ordered chunks tagged with their stream."""

    limit: int
    chunks: list[tuple[int, str]] = field(default_factory=list)
    size: int = 0
    truncated: bool = False

    def write(self, fd: int, text: str) -> None:
        if self.truncated or not text:
            return
        text = clean_text(text)
        room = self.limit - self.size
        if len(text) > room:
            text = text[:room]
            self.truncated = True
        self.size += len(text)
        self.chunks.append((fd, text))
        if self.truncated:
            raise OutputLimit()


class TerminalSink(Sink):
    def __init__(self, term: Terminal, fd: int) -> None:
        self.term, self.fd = term, fd

    def write(self, text: str) -> None:
        self.term.write(self.fd, text)


class FileSink(Sink):
    def __init__(self, fs: VirtualFS, r: Resolved, limit: int) -> None:
        self.fs, self.r, self.limit = fs, r, limit

    def write(self, text: str) -> None:
        if self.r.devnull or not text:
            return
        text = clean_text(text)
        if self.fs.size(self.r) + len(text) > self.limit:
            raise OutputLimit()
        self.fs.write(self.r, text, append=True)


@dataclass
class IO:
    """What a command sees: its input text and its two output streams.

    ``stdin_regular`` says standard input is a regular file (``< file``), which ``wc`` looks at.
    """

    stdin: str
    out: Sink
    err: Sink
    stdin_regular: bool = False


CommandFn = Callable[["Shell", list[str], IO], int]


# ===================================================================== the shell
class Shell:
    """State of one shell session (files, cwd, variables) and the executor."""

    def __init__(self, fs: VirtualFS, commands: dict[str, CommandFn], env: dict[str, str],
                 line_numbers: bool = True, output_limit: int = 1 << 20,
                 file_limit: int = 1 << 24) -> None:
        self.fs = fs
        self.commands = commands
        self.vars: dict[str, str] = dict(env)
        self.exported: set[str] = set(env)
        self.cwd = fs.root  # absolute
        self.status = 0
        self.line = 1
        self.line_numbers = line_numbers
        self.output_limit = output_limit
        self.file_limit = file_limit
        self.term = Terminal(output_limit)

    # ----------------------------------------------------------------- helpers for commands
    def resolve(self, path: str) -> Resolved:
        return self.fs.resolve(self.cwd, path)

    def shell_error(self, err: Sink, msg: str) -> None:
        prefix = f"bash: line {self.line}: " if self.line_numbers else "bash: "
        err.write(prefix + msg + "\n")

    def pwd(self) -> str:
        return self.cwd

    # ----------------------------------------------------------------- entry point
    def run(self, src: str) -> int:
        self.term = Terminal(self.output_limit)
        # each command line is a fresh `bash -c`: only exported variables carry over
        self.vars = {k: v for k, v in self.vars.items() if k in self.exported}
        self.status = 0
        out, err = TerminalSink(self.term, 1), TerminalSink(self.term, 2)
        result, warnings = parse(src)
        try:
            for i, group in enumerate(result.groups):
                if i == len(result.groups) - 1 and result.error is None:
                    for line, text in warnings:
                        self.line = line
                        self.shell_error(err, text)
                for node in group:
                    self.status = self.run_and_or(node, out, err)
            if result.error is not None:
                self._report_parse_error(result.error, err)
        except ExitShell as exc:
            self.status = exc.code
        except OutputLimit:
            pass
        return self.status

    def _report_parse_error(self, error: Exception, err: Sink) -> None:
        from compactrl.envs.shell_sim.parser import ShellSyntaxError

        if isinstance(error, ShellSyntaxError):
            prefix = f"bash: -c: line {error.line}: " if self.line_numbers else "bash: "
            for msg in error.messages:
                err.write(prefix + msg + "\n")
        else:
            err.write(f"sim-shell: unsupported: {error} (see docs/terminal.md for the supported subset)\n")
        self.status = 2

    def run_and_or(self, node: AndOr, out: Sink, err: Sink) -> int:
        status = self.run_pipeline(node.first, out, err)
        for op, pipe in node.rest:
            if (op == "&&") == (status == 0):
                status = self.run_pipeline(pipe, out, err)
        return status

    def run_pipeline(self, pipe: Pipeline, out: Sink, err: Sink) -> int:
        if len(pipe.commands) == 1:
            status = self.run_command(pipe.commands[0], "", out, err)
        else:
            data = ""
            status = 0
            for i, cmd in enumerate(pipe.commands):
                last = i == len(pipe.commands) - 1
                sink: Sink = out if last else BufferSink(self.file_limit)
                sub = self.subshell()
                try:
                    status = sub.run_command(cmd, data, sink, err)
                except ExitShell as exc:
                    status = exc.code
                data = "" if last else sink.value()  # type: ignore[attr-defined]
        self.status = (1 if status == 0 else 0) if pipe.negate else status
        return self.status

    def subshell(self) -> Shell:
        sub = copy.copy(self)
        sub.vars = dict(self.vars)
        return sub

    # ----------------------------------------------------------------- simple commands
    def run_command(self, cmd: Command, stdin: str, out: Sink, err: Sink) -> int:
        self.line = cmd.line
        argv: list[str] = []
        for w in cmd.words:
            for part in brace_expand(w):
                argv.extend(self.expand_word(part))
        io = IO(stdin, out, err)
        if not self.apply_redirects(cmd.redirects, io):
            return 1
        values = {name: self.expand_word(w, split=False)[0] for name, w in cmd.assigns}
        if not argv:
            self.vars.update(values)
            return 0
        name, args = argv[0], argv[1:]
        fn = self.commands.get(name)
        if fn is None:
            return self._not_found(name, io)
        try:
            return fn(self, args, io)
        except (ExitShell, OutputLimit):
            raise
        except UsageError as exc:
            return exc.code
        except FsError as exc:
            io.err.write(f"{name}: {exc.strerror}\n")
            return 1
        except RecursionError:
            io.err.write(f"{name}: sim-shell: input too deeply nested\n")
            return 2
        except Exception:  # a bug in the emulator must not crash an episode
            log.exception("sim shell: internal error in %s", name)
            io.err.write(f"{name}: sim-shell internal error\n")
            return 2

    def _not_found(self, name: str, io: IO) -> int:
        if "/" in name:
            r = self.resolve(name)
            if self.fs.is_dir(r):
                self.shell_error(io.err, f"{name}: Is a directory")
                return 126
            if self.fs.exists(r):
                self.shell_error(io.err, f"{name}: {EACCES}")
                return 126
            self.shell_error(io.err, f"{name}: {self.fs.lookup_error(r)}")
            return 127
        self.shell_error(io.err, f"{name}: command not found")
        return 127

    # ----------------------------------------------------------------- redirections
    def apply_redirects(self, redirects: list[Redirect], io: IO) -> bool:
        for r in redirects:
            if r.heredoc is not None:
                body = self.expand_heredoc(r.heredoc) if r.heredoc_expand else r.heredoc
                if r.fd == 0:
                    io.stdin, io.stdin_regular = body, False
                continue
            assert r.target is not None
            words = self.expand_word(r.target, glob_single=True)
            if r.op in (">&", "<&") and len(words) == 1 and words[0].isdigit():
                if not self._dup(r, int(words[0]), io):
                    return False
                continue
            if len(words) != 1:
                self.shell_error(io.err, f"{r.target.raw}: ambiguous redirect")
                return False
            if not self._open(r, words[0], io):
                return False
        return True

    def _dup(self, r: Redirect, src: int, io: IO) -> bool:
        if src not in (0, 1, 2):
            self.shell_error(io.err, f"{src}: Bad file descriptor")
            return False
        if r.op == ">&" and src in (1, 2):
            sink = io.out if src == 1 else io.err
            if r.fd == 1:
                io.out = sink
            elif r.fd == 2:
                io.err = sink
        return True

    def _open(self, r: Redirect, path: str, io: IO) -> bool:
        target = self.resolve(path)
        try:
            if r.op == "<":
                text = self.fs.read(target)
                if r.fd == 0:
                    io.stdin, io.stdin_regular = text, not target.devnull
                return True
            if r.op == "<<<":
                if r.fd == 0:
                    io.stdin, io.stdin_regular = path + "\n", False
                return True
            append = r.op in (">>", "&>>")
            if append and self.fs.is_file(target):
                pass
            else:
                self.fs.write(target, "")
            sink = FileSink(self.fs, target, self.file_limit)
        except FsError as exc:
            self.shell_error(io.err, f"{path}: {exc.strerror}")
            return False
        if r.op in ("&>", "&>>", ">&"):
            io.out = io.err = sink
        elif r.fd == 1:
            io.out = sink
        elif r.fd == 2:
            io.err = sink
        return True

    # ----------------------------------------------------------------- expansions
    def param(self, name: str) -> str:
        if name == "?":
            return str(self.status)
        if name == "#":
            return "0"
        if name == "$":
            return "4242"
        if name == "0":
            return "bash"
        if name in "@*-!123456789":
            return ""
        return self.vars.get(name, "")

    def param_op(self, p) -> str:
        value = self.param(p.text)
        if p.op == "#":
            return str(len(value))
        if p.op == ":-" and value == "" or p.op == "-" and not self.is_set(p.text):
            return p.arg
        return value

    def is_set(self, name: str) -> bool:
        return name in self.vars or name in "?#$0"

    def expand_heredoc(self, body: str) -> str:
        def repl(m: re.Match) -> str:
            if m.group(0).startswith("\\"):
                return m.group(0)[1:]
            return self.param(m.group(1) or m.group(2) or m.group(3))

        pat = r"\\[\\$`]|\$\{([A-Za-z_][A-Za-z0-9_]*|[?#$0-9@*!-])\}|\$([A-Za-z_][A-Za-z0-9_]*)|\$([?#$0-9@*!-])"
        return re.sub(pat, repl, body.replace("\\\n", ""))

    def expand_word(self, word: Word, split: bool = True, glob_single: bool = False) -> list[str]:
        """Expand one word into fields: parameters, field splitting, then pathname expansion."""
        fields: list[list[tuple[str, bool]]] = []
        cur: list[tuple[str, bool]] = []
        cur_live = False  # the current field exists even if empty (quoted text seen)
        parts = self._tilde(word)
        for p in parts:
            if not p.var:
                cur.append((p.text, p.quoted))
                cur_live = cur_live or p.quoted or bool(p.text)
                continue
            value = self.param_op(p)
            if p.quoted or not split:
                cur.append((value, True))
                cur_live = True
                continue
            pieces = re.split(f"[{_IFS_WS}]+", value)
            for k, piece in enumerate(pieces):
                if k > 0 and (cur_live or cur):
                    fields.append(cur)
                    cur, cur_live = [], False
                if piece:
                    cur.append((piece, False))
                    cur_live = True
        if cur_live or cur and any(t for t, _ in cur):
            fields.append(cur)
        out: list[str] = []
        for f in fields:
            text = "".join(t for t, _ in f)
            if not split:
                out.append(text)
                continue
            matches = self.glob(f)
            if glob_single and matches is not None and len(matches) != 1:
                matches = None if not matches else matches
            out.extend(matches if matches else [text])
        return out if out or split else [""]

    def _tilde(self, word: Word) -> list:
        parts = word.parts
        if parts and not parts[0].quoted and not parts[0].var and parts[0].text.startswith("~"):
            head = parts[0].text
            rest = head[1:]
            if rest == "" or rest.startswith("/"):
                from compactrl.envs.shell_sim.parser import Part

                return [Part(self.vars.get("HOME", self.fs.root) + rest, True), *parts[1:]]
        return parts

    # ----------------------------------------------------------------- globbing
    def glob(self, field: list[tuple[str, bool]]) -> list[str] | None:
        text = "".join(t for t, _ in field)
        mask = [q for t, q in field for _ in t]
        if not any(c in "*?[" and not q for c, q in zip(text, mask)):
            return None
        comps, masks, pos = [], [], 0
        for comp in text.split("/"):
            comps.append(comp)
            masks.append(mask[pos:pos + len(comp)])
            pos += len(comp) + 1
        absolute = text.startswith("/")
        cands = ["/"] if absolute else [""]
        if absolute:
            comps, masks = comps[1:], masks[1:]
        for k, (comp, m) in enumerate(zip(comps, masks)):
            last = k == len(comps) - 1
            nxt: list[str] = []
            active = any(c in "*?[" and not q for c, q in zip(comp, m))
            for cand in cands:
                nxt.extend(self._glob_step(cand, comp, m, active, last))
            cands = nxt
            if not cands:
                return []
        return sorted(cands)

    def _glob_step(self, cand: str, comp: str, mask: list[bool], active: bool, last: bool) -> list[str]:
        base = cand if cand else "."
        joined = (cand if cand.endswith("/") or not cand else cand + "/")
        r = self.resolve(base)
        if not active:
            path = joined + comp
            rp = self.resolve(path) if comp else r
            if comp == "":
                return [path] if self.fs.is_dir(r) else []
            ok = self.fs.exists(rp) if last else self.fs.is_dir(rp)
            return [path] if ok else []
        if not self.fs.is_dir(r):
            return []
        regex = re.compile(fnmatch_to_regex(comp, mask), re.DOTALL)
        names = self.fs.listdir(r)  # bash 5.2's globskipdots: never "." or ".."
        out = []
        for name in names:
            if name.startswith(".") and not comp.startswith("."):
                continue
            if regex.fullmatch(name):
                path = joined + name
                if last or self.fs.is_dir(self.resolve(path)):
                    out.append(path)
        return out


# ===================================================================== brace expansion
_Atom = tuple  # (text, quoted, var): one character of literal text, or a whole parameter part


def _atoms(word: Word) -> list[_Atom]:
    out: list[_Atom] = []
    for p in word.parts:
        if p.var:
            out.append((p.text, p.quoted, True))
        else:
            out.extend((c, p.quoted, False) for c in p.text)
    return out


def _to_word(atoms: list[_Atom], raw: str) -> Word:
    from compactrl.envs.shell_sim.parser import Part

    parts: list[Part] = []
    for text, quoted, var in atoms:
        if var:
            parts.append(Part(text, quoted, var=True))
        elif parts and not parts[-1].var and parts[-1].quoted == quoted:
            parts[-1] = Part(parts[-1].text + text, quoted)
        else:
            parts.append(Part(text, quoted))
    return Word(parts, raw)


def _is_brace(a: _Atom, ch: str) -> bool:
    return a[0] == ch and not a[1] and not a[2]


def _sequence(body: list[_Atom]) -> list[str] | None:
    if any(q or v for _, q, v in body):
        return None
    text = "".join(t for t, _, _ in body)
    m = re.fullmatch(r"(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?", text)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        step = abs(int(m.group(3))) if m.group(3) else 1
        step = step or 1
        width = max(len(m.group(1)), len(m.group(2))) if re.match(r"-?0\d", m.group(1)) or re.match(r"-?0\d", m.group(2)) else 0
        values = range(a, b + 1, step) if a <= b else range(a, b - 1, -step)
        if len(values) > 100_000:
            return None
        return [f"{v:0{width}d}" if width else str(v) for v in values]
    m = re.fullmatch(r"([^\\])\.\.([^\\])(?:\.\.(-?\d+))?", text)
    if m:
        a, b = ord(m.group(1)), ord(m.group(2))
        step = abs(int(m.group(3))) if m.group(3) else 1
        step = step or 1
        values = range(a, b + 1, step) if a <= b else range(a, b - 1, -step)
        return [chr(v) for v in values]
    return None


def _expand_atoms(atoms: list[_Atom], depth: int = 0) -> list[list[_Atom]]:
    if depth > 20:
        return [atoms]
    for i, a in enumerate(atoms):
        if not _is_brace(a, "{") or (i > 0 and atoms[i - 1][0] == "$" and not atoms[i - 1][1]):
            continue
        level, commas, end = 0, [], None
        for j in range(i + 1, len(atoms)):
            if _is_brace(atoms[j], "{"):
                level += 1
            elif _is_brace(atoms[j], "}"):
                if level == 0:
                    end = j
                    break
                level -= 1
            elif _is_brace(atoms[j], ",") and level == 0:
                commas.append(j)
        if end is None:
            continue
        pre, body, post = atoms[:i], atoms[i + 1:end], atoms[end + 1:]
        if commas:
            bounds = [i, *commas, end]
            alts = [atoms[bounds[k] + 1:bounds[k + 1]] for k in range(len(bounds) - 1)]
        else:
            seq = _sequence(body)
            if seq is None:
                continue
            alts = [[(c, False, False) for c in item] for item in seq]
        out: list[list[_Atom]] = []
        for alt in alts:
            out.extend(_expand_atoms(pre + alt + post, depth + 1))
        return out
    return [atoms]


def brace_expand(word: Word) -> list[Word]:
    """Bash brace expansion (``a{b,c}``, ``{1..5}``, ``{a..e..2}``) of an unquoted word."""
    if "{" not in word.raw:
        return [word]
    results = _expand_atoms(_atoms(word))
    if len(results) == 1:
        return [word]
    words = [_to_word(r, word.raw) for r in results]
    # an alternative that leaves an empty unquoted word disappears, as in bash ("{a,}" -> "a")
    return [w for w in words if any(p.text or p.quoted or p.var for p in w.parts)]
