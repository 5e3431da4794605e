"""The executor: expansions, globbing, redirections, pipelines, lists and the session's state.

Pipeline stages run one after another (stage i's output is stage i+1's input), each in a copy of
the shell state as bash's subshells are, so ``cd`` inside a pipeline does not leak. Streams are
:class:`Sink` objects; writes keep their order so ``cmd > f 2>&1`` interleaves like bash. Input is
an :class:`InStream` that ``read`` consumes line by line and any other command reads to its end.

This module is the interpreter's lowest layer: it imports only the parser, the file system and the
pattern/arithmetic helpers. Compound commands, shell functions and the parameter transforms live
one layer up (:mod:`compactrl.shell_sim.control`, which builds on ``builtins`` and ``cond``)
and reach the executor as a :class:`Grammar` passed to :class:`Shell`, so no module of the shell
imports one above it and each can be read with only the ones below.
"""

from __future__ import annotations

import copy
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from compactrl.shell_sim.arith import ArithError, Evaluator
from compactrl.shell_sim.fs import EACCES, FsError, Resolved, VirtualFS
from compactrl.shell_sim.parser import (
    AndOr,
    Command,
    Compound,
    Part,
    Pipeline,
    Redirect,
    ShellSyntaxError,
    Unsupported,
    Word,
    lex_text,
    parse,
)
from compactrl.shell_sim.regex import fnmatch_to_regex

log = logging.getLogger(__name__)

_IFS_WS = " \t\n"
_DEFAULT_IFS = " \t\n"


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


class AbortCommand(Exception):
    """An expansion error (bad substitution, arithmetic error): bash abandons the rest of the
    current top-level command with status ``code``, then runs the next line."""

    def __init__(self, code: int = 1) -> None:
        super().__init__(code)
        self.code = code


class LoopControl(Exception):
    """``break``/``continue`` unwinding ``levels`` enclosing loops."""

    def __init__(self, kind: str, levels: int) -> None:
        super().__init__(kind)
        self.kind, self.levels = kind, levels


class ReturnFromFunction(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


TIMEOUT_EXIT_CODE = 124
"""What the real backends answer for a command killed at its time limit (``timeout``'s code)."""


class TimeLimit(Exception):
    """The command line used up its time or loop-iteration budget (ends like a real timeout)."""


@dataclass
class Limits:
    """What one command line may use; shared by every subshell of that line.

    ``deadline`` is a ``time.monotonic()`` value; ``iterations`` counts loop iterations and
    shell-function calls against ``max_iterations``; ``max_depth`` bounds function nesting.
    """

    deadline: float = float("inf")
    max_iterations: int = 100_000
    max_depth: int = 100
    iterations: int = 0
    reason: str = ""

    def tick(self) -> None:
        self.iterations += 1
        if self.iterations > self.max_iterations:
            self.reason = f"more than {self.max_iterations} loop iterations and function calls"
            raise TimeLimit()
        if self.iterations & 63 == 0 and time.monotonic() > self.deadline:
            self.reason = "the time budget"
            raise TimeLimit()


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


class InStream:
    """Standard input shared by the commands of a compound command: ``read`` takes a line at a
    time, any other command that reads takes the rest."""

    __slots__ = ("text", "pos")

    def __init__(self, text: str = "") -> None:
        self.text, self.pos = text, 0

    def read_all(self) -> str:
        rest = self.text[self.pos:] if self.pos else self.text
        self.pos = len(self.text)
        return rest

    def read_until(self, delim: str) -> tuple[str, bool]:
        """Up to (not including) ``delim``; whether the delimiter was found."""
        end = self.text.find(delim, self.pos) if delim else -1
        if end < 0:
            chunk, self.pos = self.text[self.pos:], len(self.text)
            return chunk, False
        chunk, self.pos = self.text[self.pos:end], end + len(delim)
        return chunk, True

    def at_end(self) -> bool:
        return self.pos >= len(self.text)


class IO:
    """What a command sees: its input and its two output streams.

    ``stdin`` (the text) is read lazily from ``stream``: a command that never looks at it leaves
    the stream for the next one, as a loop body's ``echo`` leaves the lines to ``read``.
    ``stdin_regular`` says standard input is a regular file (``< file``), which ``wc`` looks at.
    """

    __slots__ = ("stream", "_text", "out", "err", "stdin_regular")

    def __init__(self, stdin: str | InStream, out: Sink, err: Sink, stdin_regular: bool = False) -> None:
        self.stdin = stdin
        self.out, self.err, self.stdin_regular = out, err, stdin_regular

    @property
    def stdin(self) -> str:
        if self._text is None:
            self._text = self.stream.read_all()
        return self._text

    @stdin.setter
    def stdin(self, value: str | InStream) -> None:
        self.stream = value if isinstance(value, InStream) else InStream(value)
        self._text = None


CommandFn = Callable[["Shell", list[str], IO], int]


# ===================================================================== the shell
@dataclass(frozen=True)
class Grammar:
    """The compound layer the executor calls into (``control.GRAMMAR``): what runs a compound
    command node, calls a shell function, and applies a value-transforming parameter operator."""

    run_compound: Callable[[Shell, Compound, InStream, Sink, Sink], int]
    call_function: Callable[[Shell, str, list[str], IO], int]
    param_transform: Callable[[Shell, Part, str], str]


class Shell:
    """State of one shell session (files, cwd, variables, functions, options) and the executor.

    ``grammar`` supplies compound commands, functions and parameter transforms (the layer above);
    ``commands`` the builtins and utilities by name."""

    def __init__(self, fs: VirtualFS, commands: dict[str, CommandFn], env: dict[str, str],
                 grammar: Grammar, line_numbers: bool = True, output_limit: int = 1 << 20,
                 file_limit: int = 1 << 24) -> None:
        self.fs = fs
        self.commands = commands
        self.grammar = grammar
        self.vars: dict[str, str] = dict(env)
        self.exported: set[str] = set(env)
        self.functions: dict[str, Compound] = {}
        self.positional: list[str] = []
        self.arg0 = "bash"
        self.scopes: list[dict[str, str | None]] = []  # per function call: saved outer values
        self.options: set[str] = set()  # "errexit", "nounset", "pipefail"
        self.errexit_off = 0  # > 0 in conditions, where a failure must not exit
        self.loop_depth = 0
        self.subst_status: int | None = None
        self.limits = Limits()
        self.cwd = fs.root  # absolute
        self.status = 0
        self.line = 1
        self.line_numbers = line_numbers
        self.output_limit = output_limit
        self.file_limit = file_limit
        self.term = Terminal(output_limit)
        self.timed_out = False

    # ----------------------------------------------------------------- helpers for commands
    def resolve(self, path: str) -> Resolved:
        return self.fs.resolve(self.cwd, path)

    def shell_error(self, err: Sink, msg: str) -> None:
        prefix = f"bash: line {self.line}: " if self.line_numbers else "bash: "
        err.write(prefix + msg + "\n")

    def pwd(self) -> str:
        return self.cwd

    # ----------------------------------------------------------------- entry point
    def run(self, src: str, limits: Limits | None = None) -> int:
        self.term = Terminal(self.output_limit)
        # each command line is a fresh `bash -c`: only exported variables carry over
        self.vars = {k: v for k, v in self.vars.items() if k in self.exported}
        self.functions, self.positional, self.scopes, self.options = {}, [], [], set()
        self.errexit_off, self.loop_depth, self.status = 0, 0, 0
        self.limits = limits or Limits()
        self.timed_out = False
        self.fs.fds.clear()
        out, err = TerminalSink(self.term, 1), TerminalSink(self.term, 2)
        result, warnings = parse(src)
        try:
            for i, group in enumerate(result.groups):
                if i == len(result.groups) - 1 and result.error is None:
                    for line, text in warnings:
                        self.line = line
                        self.shell_error(err, text)
                self.run_group(group, out, err)
            if result.error is not None:
                self.report_parse_error(result.error, err)
        except ExitShell as exc:
            self.status = exc.code
        except OutputLimit:
            pass
        except TimeLimit:
            self.status = TIMEOUT_EXIT_CODE
            self.timed_out = True
        return self.status

    def run_group(self, group: list[AndOr], out: Sink, err: Sink, inp: InStream | None = None) -> None:
        """One top-level complete command; an expansion error abandons the rest of it."""
        try:
            self.status = self.run_list(group, inp or InStream(), out, err)
        except AbortCommand as exc:
            self.status = exc.code
        except LoopControl:
            pass
        except ReturnFromFunction as exc:
            self.status = exc.code
        except (ExitShell, OutputLimit, TimeLimit):
            raise
        except RecursionError:
            err.write("sim-shell: input too deeply nested\n")
            self.status = 2
        except Exception:  # a bug in the emulator must not crash an episode
            log.exception("sim shell: internal error")
            err.write("sim-shell internal error\n")
            self.status = 2

    def report_parse_error(self, error: Exception, err: Sink, prefix: str | None = None) -> None:
        if isinstance(error, ShellSyntaxError):
            if prefix is None:
                prefix = f"bash: -c: line {error.line}: " if self.line_numbers else "bash: "
            for msg in error.messages:
                err.write(prefix + msg + "\n")
        else:
            err.write(f"sim-shell: unsupported: {error} (see docs/terminal.md for the supported subset)\n")
        self.status = 2

    def run_list(self, nodes: list[AndOr], inp: InStream, out: Sink, err: Sink) -> int:
        for node in nodes:
            self.status = self.run_and_or(node, inp, out, err)
        return self.status

    def run_and_or(self, node: AndOr, inp: InStream, out: Sink, err: Sink) -> int:
        last = len(node.rest)
        self.errexit_off += last > 0
        try:
            status = self.run_pipeline(node.first, inp, out, err)
            ran_last = last == 0
            for k, (op, pipe) in enumerate(node.rest):
                if (op == "&&") == (status == 0):
                    if k == last - 1:
                        self.errexit_off -= 1
                        last = -1  # the final pipeline runs with errexit as the caller has it
                    status = self.run_pipeline(pipe, inp, out, err)
                    ran_last = k == len(node.rest) - 1
        finally:
            self.errexit_off -= last > 0
        final = node.rest[-1][1] if node.rest else node.first
        if status and ran_last and not final.negate:
            self.check_errexit(status)
        return status

    def check_errexit(self, status: int) -> None:
        if "errexit" in self.options and self.errexit_off == 0:
            raise ExitShell(status)

    def run_pipeline(self, pipe: Pipeline, inp: InStream, out: Sink, err: Sink) -> int:
        if pipe.negate:
            self.errexit_off += 1
        try:
            if len(pipe.commands) == 1:
                status = self.run_node(pipe.commands[0], inp, out, err)
            else:
                status = self._run_stages(pipe, inp, out, err)
        finally:
            if pipe.negate:
                self.errexit_off -= 1
        self.status = (1 if status == 0 else 0) if pipe.negate else status
        return self.status

    def _run_stages(self, pipe: Pipeline, inp: InStream, out: Sink, err: Sink) -> int:
        data: InStream = inp
        status, failed = 0, 0
        for i, cmd in enumerate(pipe.commands):
            last = i == len(pipe.commands) - 1
            sink: Sink = out if last else BufferSink(self.file_limit)
            status = self.subshell().run_in_subshell(cmd, data, sink, err)
            failed = status or failed
            data = InStream("" if last else sink.value())  # type: ignore[attr-defined]
        return failed if "pipefail" in self.options else status

    def run_in_subshell(self, node: Command | Compound, inp: InStream, out: Sink, err: Sink) -> int:
        try:
            return self.run_node(node, inp, out, err)
        except ExitShell as exc:
            return exc.code
        except (LoopControl, ReturnFromFunction) as exc:
            return getattr(exc, "code", 0)

    def subshell(self) -> Shell:
        sub = copy.copy(self)
        sub.vars = dict(self.vars)
        sub.exported = set(self.exported)
        sub.functions = dict(self.functions)
        sub.positional = list(self.positional)
        sub.options = set(self.options)
        sub.scopes = []
        return sub

    def run_node(self, node: Command | Compound, inp: InStream, out: Sink, err: Sink) -> int:
        if isinstance(node, Compound):
            return self.grammar.run_compound(self, node, inp, out, err)
        return self.run_command(node, inp, out, err)

    # ----------------------------------------------------------------- simple commands
    def run_command(self, cmd: Command, inp: InStream, out: Sink, err: Sink) -> int:
        self.line = cmd.line
        self.subst_status = None
        argv: list[str] = []
        for w in cmd.words:
            for part in brace_expand(w):
                argv.extend(self.expand_word(part))
        io = IO(inp, out, err)
        if not self.apply_redirects(cmd.redirects, io):
            return 1
        values = {name: self.expand_word(w, split=False, assign=True)[0] for name, w in cmd.assigns}
        if not argv:
            for name, value in values.items():
                self.set_var(name, value)
            return self.subst_status or 0
        saved = {name: self.vars.get(name) for name in values}
        for name, value in values.items():
            self.vars[name] = value
        try:
            return self.call(argv[0], argv[1:], io)
        finally:
            for name, value in saved.items():
                if value is None:
                    self.vars.pop(name, None)
                else:
                    self.vars[name] = value

    def call(self, name: str, args: list[str], io: IO, functions: bool = True) -> int:
        """Run a function, builtin or utility by name (``command`` and ``xargs`` skip functions)."""
        if functions and name in self.functions:
            return self.grammar.call_function(self, name, args, io)
        fn = self.commands.get(name)
        if fn is None:
            return self._not_found(name, io)
        try:
            return fn(self, args, io)
        except (ExitShell, OutputLimit, AbortCommand, LoopControl, ReturnFromFunction, TimeLimit):
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
            if r.op == "<<<":
                if r.fd == 0:
                    io.stdin, io.stdin_regular = self.expand_word(r.target, split=False)[0] + "\n", False
                continue
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

    # ----------------------------------------------------------------- variables
    def set_var(self, name: str, value: str) -> None:
        self.vars[name] = value

    def param(self, name: str) -> str:
        if name == "?":
            return str(self.status)
        if name == "#":
            return str(len(self.positional))
        if name == "$":
            return "4242"
        if name == "0":
            return self.arg0
        if name in ("@", "*"):
            return " ".join(self.positional)
        if name.isdigit():
            k = int(name)
            return self.positional[k - 1] if k <= len(self.positional) else self._unset(name)
        if name in "-!":
            return ""
        value = self.vars.get(name)
        return value if value is not None else self._unset(name)

    def _unset(self, name: str) -> str:
        if "nounset" in self.options:
            self.shell_error(TerminalSink(self.term, 2), f"{name}: unbound variable")
            raise ExitShell(127)
        return ""

    def is_set(self, name: str) -> bool:
        if name.isdigit() and name != "0":
            return int(name) <= len(self.positional)
        return name in self.vars or name in "?#$0@*"

    def arith(self, text: str, err: Sink | None = None, prefix: str = "") -> int:
        """Evaluate an arithmetic expression (after expanding ``$``-parameters and substitutions
        in it); on an error, print bash's message and abandon the command."""
        expanded = self.expand_text(text)
        try:
            return Evaluator(self._arith_get, self.set_var).evaluate(expanded)
        except ArithError as exc:
            self.shell_error(err or TerminalSink(self.term, 2), f"{prefix}{expanded.lstrip()}: {exc}")
            raise AbortCommand(1) from None

    def _arith_get(self, name: str) -> str:
        return self.param(name)

    def expand_text(self, text: str, heredoc: bool = False) -> str:
        """``text`` with its expansions done and quotes removed, as one string (no splitting)."""
        if "$" not in text and "`" not in text and (heredoc or not any(c in text for c in "'\"\\")):
            return text
        return self.expand_word(Word(self.lex(text, heredoc), text), split=False)[0]

    def lex(self, text: str, heredoc: bool = False) -> list[Part]:
        """:func:`lex_text` at expansion time: a malformed piece (an unclosed ``$(`` inside
        ``${x:-...}``) abandons the command as a bad substitution."""
        try:
            return lex_text(text, heredoc=heredoc)
        except (ShellSyntaxError, Unsupported) as exc:
            what = "bad substitution" if isinstance(exc, ShellSyntaxError) else f"sim-shell: unsupported: {exc}"
            self.shell_error(TerminalSink(self.term, 2), f"{text}: {what}")
            raise AbortCommand(1) from None

    def expand_heredoc(self, body: str) -> str:
        return self.expand_text(body.replace("\\\n", ""), heredoc=True)

    # ----------------------------------------------------------------- expansions
    def param_op(self, p: Part) -> str:
        if p.op == "$(":
            return self.command_substitution(p.text)
        if p.op == "$((":
            return str(self.arith(p.text))
        if p.op == "<(":
            return self.process_substitution(p.text)
        if p.op == "bad":
            self.shell_error(TerminalSink(self.term, 2), f"${{{p.text}}}: bad substitution")
            raise AbortCommand(1)
        if p.op == "len":
            return str(len(self.positional) if p.text in "@*" else len(self.param(p.text)))
        if p.op in ("-", "=", "+", "?", ":-", ":=", ":+", ":?"):
            return self._param_default(p)
        value = self.param(p.text)
        if p.op == "":
            return value
        return self.grammar.param_transform(self, p, value)

    def _param_default(self, p: Part) -> str:
        colon = p.op.startswith(":")
        present = self.is_set(p.text) and not (colon and self.param(p.text) == "")
        kind = p.op[-1]
        if kind == "+":
            return self.expand_text(p.arg) if present else ""
        if present:
            return self.param(p.text)
        if kind == "-":
            return self.expand_text(p.arg)
        if kind == "=":
            value = self.expand_text(p.arg)
            self.set_var(p.text, value)
            return value
        msg = self.expand_text(p.arg) or ("parameter null or not set" if colon else "parameter not set")
        self.shell_error(TerminalSink(self.term, 2), f"{p.text}: {msg}")
        raise ExitShell(127)

    def command_substitution(self, src: str) -> str:
        """``$(src)``: run in a subshell, its output without trailing newlines."""
        sub = self.subshell()
        sink = BufferSink(self.file_limit)
        err = TerminalSink(self.term, 2)
        result, _ = parse(src)
        sub.status = self.status
        try:
            for group in result.groups:
                sub.status = sub.run_list(group, InStream(), sink, err)
            if result.error is not None:
                sub.report_parse_error(result.error, err, prefix="bash: command substitution: line "
                                       f"{getattr(result.error, 'line', 1)}: ")
        except ExitShell as exc:
            sub.status = exc.code
        except (LoopControl, ReturnFromFunction):
            pass
        self.subst_status = self.status = sub.status  # `$?` later in the same command sees it
        return sink.value().rstrip("\n")

    def process_substitution(self, src: str) -> str:
        """``<(src)``: the output of ``src`` behind a ``/dev/fd/N`` name, as bash gives it (63 first)."""
        sub = self.subshell()
        sink = BufferSink(self.file_limit)
        for group in parse(src)[0].groups:
            sub.run_group(group, sink, TerminalSink(self.term, 2))
        path = f"/dev/fd/{63 - len(self.fs.fds)}"
        self.fs.fds[path] = sink.value()
        return path

    def _fields_of(self, p: Part) -> list[str] | None:
        """``"$@"``: one field per positional parameter (None for any other part)."""
        if p.var and p.quoted and p.op == "" and p.text == "@":
            return list(self.positional)
        return None

    def expand_word(self, word: Word, split: bool = True, glob_single: bool = False,
                    assign: bool = False) -> list[str]:
        """Expand one word into fields: parameters, substitutions, field splitting, then pathname
        expansion."""
        fields: list[list[tuple[str, bool]]] = []
        cur: list[tuple[str, bool]] = []
        cur_live = False  # the current field exists even if empty (quoted text seen)
        ifs = self.vars.get("IFS", _DEFAULT_IFS)
        for p in self._tilde(word):
            if not p.var:
                cur.append((p.text, p.quoted))
                cur_live = cur_live or p.quoted or bool(p.text)
                continue
            at_fields = self._fields_of(p) if split else None
            if at_fields is not None:
                for k, piece in enumerate(at_fields):
                    if k > 0:
                        fields.append(cur)
                        cur = []
                    cur.append((piece, True))
                    cur_live = True
                continue
            value = self.param_op(p)
            if p.quoted or not split:
                cur.append((value, True))
                cur_live = True
                continue
            for k, piece in enumerate(_ifs_split(value, ifs)):
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


def pattern_regex(sh: Shell, word: Word) -> re.Pattern:
    """A glob pattern word (quoted parts literal) as a regex over a whole string (``case``, ``[[ == ]]``)."""
    chars: list[str] = []
    mask: list[bool] = []
    for p in word.parts:
        text = sh.param_op(p) if p.var else p.text
        chars.append(text)
        mask.extend([p.quoted] * len(text))
    return re.compile(fnmatch_to_regex("".join(chars), mask, pathname=False), re.DOTALL)


def _ifs_split(value: str, ifs: str) -> list[str]:
    """Field splitting of an unquoted expansion's value by ``IFS``; an empty first or last piece
    means the value starts or ends with a separator."""
    if ifs == _DEFAULT_IFS:
        return re.split("[ \t\n]+", value)
    if ifs == "":
        return [value]
    ws = "".join(c for c in ifs if c in _IFS_WS)
    other = "".join(c for c in ifs if c not in _IFS_WS)
    alts = []
    if other:
        alts.append(f"[{re.escape(ws)}]*[{re.escape(other)}][{re.escape(ws)}]*" if ws else f"[{re.escape(other)}]")
    if ws:
        alts.append(f"[{re.escape(ws)}]+")
    return re.split("|".join(alts), value)


# ===================================================================== brace expansion
_Atom = tuple  # (text, quoted, var): one character of literal text, or a whole parameter part


def _atoms(word: Word) -> list[_Atom]:
    out: list[_Atom] = []
    for p in word.parts:
        if p.var:
            out.append((p.text, p.quoted, p))
        else:
            out.extend((c, p.quoted, False) for c in p.text)
    return out


def _to_word(atoms: list[_Atom], raw: str) -> Word:
    parts: list[Part] = []
    for text, quoted, var in atoms:
        if var:
            parts.append(var)
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
