"""Lexer and parser for the emulator's bash subset.

Grammar covered: lists of and-or lists (``;``, newline, ``&&``, ``||``) of pipelines (``|``, leading
``!``) of simple commands (assignments, words, redirections ``<``, ``>``, ``>>``, ``>|``, ``N>``,
``N>>``, ``N>&M``, ``&>``, ``&>>``, ``<<``/``<<-`` here-documents, ``<<<`` here-strings). Words
support single/double quotes, backslash escapes, ``$'...'``, ``$NAME``, ``${NAME}`` and the special
parameters ``$?``, ``$#``, ``$$``, ``$0``-``$9``, ``$@``, ``$*``. Compound commands, functions,
subshells, command and arithmetic substitution and background jobs raise :class:`Unsupported`.

Like bash, the script is executed one input line at a time: a syntax error on line 3 does not
stop lines 1-2 from running, so :func:`parse` returns the complete line groups before the error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

RESERVED = {"if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case", "esac",
            "function", "select", "{", "}", "[[", "]]", "coproc", "time"}
OPERATORS = ("&&", "||", ";;", "|&", "|", "&", ";", "(", ")")
REDIR_OPS = ("<<<", "<<-", "&>>", "<<", ">>", "<&", ">&", "<>", ">|", "&>", "<", ">")
SPECIAL_PARAMS = "?#$@*!-0123456789"


class Unsupported(Exception):
    """A construct outside the emulator's documented subset."""


class ShellSyntaxError(Exception):
    """A bash syntax error: ``messages`` are the lines bash prints after ``bash: -c: line N:``."""

    def __init__(self, message: str, line: int, *more: str) -> None:
        super().__init__(message)
        self.messages = (message, *more)
        self.line = line


@dataclass
class Part:
    """A piece of a word: literal text, or a parameter name when ``var`` (``$NAME``).

    ``op``/``arg`` hold a parameter operator: ``:-``/``-`` with its default word, or ``#``
    (length).
    """

    text: str
    quoted: bool
    var: bool = False
    op: str = ""
    arg: str = ""


@dataclass
class Word:
    parts: list[Part]
    raw: str = ""


@dataclass
class Redirect:
    fd: int
    op: str
    target: Word | None = None
    heredoc: str | None = None
    heredoc_expand: bool = False
    line: int = 0


@dataclass
class Command:
    assigns: list[tuple[str, Word]] = field(default_factory=list)
    words: list[Word] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)
    line: int = 1


@dataclass
class Pipeline:
    commands: list[Command]
    negate: bool = False


@dataclass
class AndOr:
    first: Pipeline
    rest: list[tuple[str, Pipeline]] = field(default_factory=list)


@dataclass
class Token:
    kind: str  # "word", "op", "redir", "newline", "eof"
    value: object
    line: int
    text: str = ""
    fd: int | None = None


@dataclass
class ParseResult:
    """Complete line groups parsed before any error, then the error (if any)."""

    groups: list[list[AndOr]]
    error: ShellSyntaxError | Unsupported | None = None


# ===================================================================== lexer
class Lexer:
    def __init__(self, src: str) -> None:
        self.src = src
        self.i = 0
        self.line = 1
        self.pending_heredocs: list[Redirect] = []
        self.heredoc_warnings: list[tuple[int, str]] = []

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.src[j] if j < len(self.src) else ""

    def tokens(self) -> list[Token]:
        out: list[Token] = []
        while True:
            tok = self.next_token()
            out.append(tok)
            if tok.kind == "eof":
                return out

    def next_token(self) -> Token:
        self._skip_blanks()
        c = self.peek()
        if c == "":
            if self.pending_heredocs:
                self._read_heredocs()
            return Token("eof", None, self.line, "")
        if c == "\n":
            line = self.line
            self.i += 1
            self.line += 1
            if self.pending_heredocs:
                self._read_heredocs()
            return Token("newline", "\n", line, "newline")
        if c == "#":
            while self.peek() not in ("", "\n"):
                self.i += 1
            return self.next_token()
        for op in REDIR_OPS:
            if self.src.startswith(op, self.i):
                self.i += len(op)
                return Token("redir", op, self.line, op)
        for op in OPERATORS:
            if self.src.startswith(op, self.i):
                self.i += len(op)
                return Token("op", op, self.line, op)
        return self._read_word()

    def _skip_blanks(self) -> None:
        while True:
            c = self.peek()
            if c in (" ", "\t"):
                self.i += 1
            elif c == "\\" and self.peek(1) == "\n":
                self.i += 2
                self.line += 1
            else:
                return

    def _read_word(self) -> Token:
        start, line = self.i, self.line
        parts: list[Part] = []
        buf: list[str] = []

        def flush(quoted: bool = False) -> None:
            if buf:
                parts.append(Part("".join(buf), quoted))
                buf.clear()

        while True:
            c = self.peek()
            if c == "" or c in " \t\n;&|<>()":
                break
            if c == "\\":
                nxt = self.peek(1)
                if nxt == "\n":
                    self.i += 2
                    self.line += 1
                    continue
                flush()
                if nxt == "":
                    buf.append("\\")
                    self.i += 1
                    continue
                parts.append(Part(nxt, True))
                self.i += 2
            elif c == "'":
                flush()
                end = self.src.find("'", self.i + 1)
                if end < 0:
                    raise ShellSyntaxError("unexpected EOF while looking for matching `''", line)
                text = self.src[self.i + 1:end]
                self.line += text.count("\n")
                parts.append(Part(text, True))
                self.i = end + 1
            elif c == '"':
                flush()
                parts.extend(self._read_double_quoted(line))
            elif c == "$":
                flush()
                parts.extend(self._read_dollar(quoted=False))
            elif c == "`":
                raise Unsupported("command substitution (`...`)")
            else:
                buf.append(c)
                self.i += 1
        flush()
        text = self.src[start:self.i]
        if text.isdigit() and text.isascii() and self.peek() in ("<", ">"):
            for op in REDIR_OPS:
                if not op.startswith("&") and self.src.startswith(op, self.i):
                    self.i += len(op)
                    return Token("redir", op, line, text + op, fd=int(text))
        return Token("word", Word(parts, text), line, text)

    def _read_double_quoted(self, line: int) -> list[Part]:
        self.i += 1
        parts: list[Part] = []
        buf: list[str] = []
        while True:
            c = self.peek()
            if c == "":
                raise ShellSyntaxError('unexpected EOF while looking for matching `"\'', line)
            if c == '"':
                self.i += 1
                break
            if c == "\\" and self.peek(1) in ('"', "\\", "$", "`", "\n"):
                if self.peek(1) == "\n":
                    self.line += 1
                else:
                    buf.append(self.peek(1))
                self.i += 2
            elif c == "$":
                if buf:
                    parts.append(Part("".join(buf), True))
                    buf = []
                parts.extend(self._read_dollar(quoted=True))
            elif c == "`":
                raise Unsupported("command substitution (`...`)")
            else:
                if c == "\n":
                    self.line += 1
                buf.append(c)
                self.i += 1
        if buf or not parts:
            parts.append(Part("".join(buf), True))
        return parts

    def _read_dollar(self, quoted: bool) -> list[Part]:
        nxt = self.peek(1)
        if nxt == "(":
            what = "arithmetic expansion $((...))" if self.peek(2) == "(" else "command substitution $(...)"
            raise Unsupported(what)
        if nxt == "'" and not quoted:
            return [Part(self._read_ansi_c(), True)]
        if nxt == '"' and not quoted:  # $"..." is a locale-translated string: plain double quotes
            self.i += 1
            return self._read_double_quoted(self.line)
        if nxt == "{":
            end = self.src.find("}", self.i + 2)
            body = self.src[self.i + 2:end] if end >= 0 else ""
            m = re.fullmatch(r"(#?)([A-Za-z_][A-Za-z0-9_]*|[?#$0-9@*!-])(?:(:?-)([^${}`\\'\"]*))?", body)
            if end < 0 or not m or (m.group(1) and m.group(3)):
                raise Unsupported("parameter expansion beyond ${NAME}, ${NAME:-word}, ${NAME-word}, ${#NAME}")
            self.i = end + 1
            op = "#" if m.group(1) else (m.group(3) or "")
            return [Part(m.group(2), quoted, var=True, op=op, arg=m.group(4) or "")]
        if nxt and nxt in SPECIAL_PARAMS:
            self.i += 2
            return [Part(nxt, quoted, var=True)]
        if nxt and (nxt.isalpha() or nxt == "_") and nxt.isascii():
            j = self.i + 1
            while j < len(self.src) and (self.src[j].isalnum() or self.src[j] == "_") and self.src[j].isascii():
                j += 1
            name = self.src[self.i + 1:j]
            self.i = j
            return [Part(name, quoted, var=True)]
        self.i += 1
        return [Part("$", quoted)]

    def _read_ansi_c(self) -> str:
        self.i += 2
        out: list[str] = []
        simple = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
                  "e": "\x1b", "E": "\x1b", "\\": "\\", "'": "'", '"': '"', "?": "?"}
        while True:
            c = self.peek()
            if c == "":
                raise ShellSyntaxError("unexpected EOF while looking for matching `''", self.line)
            self.i += 1
            if c == "'":
                return "".join(out)
            if c != "\\":
                out.append(c)
                continue
            e = self.peek()
            self.i += 1
            if e in simple:
                out.append(simple[e])
            elif e in "01234567":
                digits = e
                while len(digits) < 3 and self.peek() in "01234567" and self.peek():
                    digits += self.peek()
                    self.i += 1
                out.append(chr(int(digits, 8)))
            elif e == "x":
                digits = ""
                while len(digits) < 2 and self.peek() and self.peek() in "0123456789abcdefABCDEF":
                    digits += self.peek()
                    self.i += 1
                out.append(chr(int(digits, 16)) if digits else "\\x")
            else:
                out.append("\\" + e)

    def _read_heredocs(self) -> None:
        for redir in self.pending_heredocs:
            delim = redir.heredoc or ""
            strip_tabs = redir.op == "<<-"
            lines: list[str] = []
            while True:
                if self.i >= len(self.src):
                    self.heredoc_warnings.append((
                        max(self.line - 1, redir.line),
                        f"warning: here-document at line {redir.line} delimited by end-of-file "
                        f"(wanted `{delim}')",
                    ))
                    break
                end = self.src.find("\n", self.i)
                raw = self.src[self.i:] if end < 0 else self.src[self.i:end]
                self.i = len(self.src) if end < 0 else end + 1
                self.line += 1
                text = raw.lstrip("\t") if strip_tabs else raw
                if text == delim:
                    break
                lines.append(text + "\n")
            redir.heredoc = "".join(lines)
        self.pending_heredocs = []


# ===================================================================== parser
class Parser:
    def __init__(self, src: str) -> None:
        self.lexer = Lexer(src)
        self.src_lines = src.split("\n")
        self.tok: Token = Token("eof", None, 1)

    def _advance(self) -> None:
        self.tok = self.lexer.next_token()

    def _error_near(self, tok: Token) -> ShellSyntaxError:
        if tok.kind == "eof":
            line = self.lexer.line + (0 if self.lexer.src.endswith("\n") else 1)
            return ShellSyntaxError("syntax error: unexpected end of file", line)
        text = tok.text if tok.kind != "newline" else "newline"
        line_text = self.src_lines[tok.line - 1] if tok.line - 1 < len(self.src_lines) else ""
        return ShellSyntaxError(f"syntax error near unexpected token `{text}'", tok.line, f"`{line_text}'")

    def parse(self) -> ParseResult:
        groups: list[list[AndOr]] = []
        current: list[AndOr] = []
        try:
            self._advance()
            while True:
                if self.tok.kind == "eof":
                    if current:
                        groups.append(current)
                    return ParseResult(groups)
                if self.tok.kind == "newline":
                    if current:
                        groups.append(current)
                        current = []
                    self._advance()
                    continue
                current.append(self._and_or())
                if self.tok.kind == "op" and self.tok.value == ";":
                    self._advance()
                elif self.tok.kind == "op" and self.tok.value == "&":
                    raise Unsupported("background jobs (&)")
                elif self.tok.kind not in ("newline", "eof"):
                    raise self._error_near(self.tok)
        except (ShellSyntaxError, Unsupported) as exc:
            return ParseResult(groups, exc)

    def _and_or(self) -> AndOr:
        node = AndOr(self._pipeline())
        while self.tok.kind == "op" and self.tok.value in ("&&", "||"):
            op = str(self.tok.value)
            self._advance()
            while self.tok.kind == "newline":
                self._advance()
            node.rest.append((op, self._pipeline()))
        return node

    def _pipeline(self) -> Pipeline:
        negate = False
        while self.tok.kind == "word" and self.tok.text == "!":
            negate = not negate
            self._advance()
        cmds = [self._command()]
        while self.tok.kind == "op" and self.tok.value in ("|", "|&"):
            if self.tok.value == "|&":
                raise Unsupported("|& (pipe stderr)")
            self._advance()
            while self.tok.kind == "newline":
                self._advance()
            cmds.append(self._command())
        return Pipeline(cmds, negate)

    def _command(self) -> Command:
        cmd = Command(line=self.tok.line)
        if self.tok.kind == "op" and self.tok.value == "(":
            raise Unsupported("subshells ( ... )")
        if self.tok.kind == "word" and self.tok.text in RESERVED:
            raise Unsupported(f"compound commands and keywords ({self.tok.text})")
        while True:
            tok = self.tok
            if tok.kind == "word":
                assert isinstance(tok.value, Word)
                name, eq, _ = tok.text.partition("=")
                if not cmd.words and eq and name.isidentifier() and name.isascii():
                    cmd.assigns.append((name, _strip_assignment_name(tok.value, len(name) + 1)))
                elif not cmd.words and tok.text.endswith("()"):
                    raise Unsupported("function definitions")
                else:
                    cmd.words.append(tok.value)
                self._advance()
            elif tok.kind == "redir":
                cmd.redirects.append(self._redirect())
            elif tok.kind == "op" and tok.value == "(" and cmd.words:
                raise Unsupported("function definitions")
            else:
                break
        if not cmd.words and not cmd.assigns and not cmd.redirects:
            raise self._error_near(self.tok)
        return cmd

    def _redirect(self) -> Redirect:
        tok = self.tok
        op = str(tok.value)
        fd = tok.fd if tok.fd is not None else (0 if op.startswith("<") else 1)
        if op == "<>":
            raise Unsupported("<> redirection")
        self._advance()
        target = self.tok
        if target.kind != "word":
            raise self._error_near(target)
        assert isinstance(target.value, Word)
        if op in ("<<", "<<-"):
            # register before reading on: the body starts after the next newline token
            delim = "".join(p.text if not p.var else "$" + p.text for p in target.value.parts)
            quoted = any(p.quoted for p in target.value.parts)
            redir = Redirect(fd, op, None, heredoc=delim, heredoc_expand=not quoted, line=tok.line)
            self.lexer.pending_heredocs.append(redir)
            self._advance()
            return redir
        self._advance()
        return Redirect(fd, op, target.value)


def _strip_assignment_name(word: Word, n: int) -> Word:
    """The value part of ``NAME=value`` (drop the first ``n`` literal characters)."""
    parts = []
    for p in word.parts:
        if n <= 0:
            parts.append(p)
        elif len(p.text) <= n and not p.var:
            n -= len(p.text)
        else:
            parts.append(Part(p.text[n:], p.quoted, p.var))
            n = 0
    return Word(parts or [Part("", True)], word.raw[word.raw.find("=") + 1:])


def parse(src: str) -> tuple[ParseResult, list[tuple[int, str]]]:
    """Parse a command string; returns the result and here-document warnings."""
    parser = Parser(src)
    result = parser.parse()
    return result, parser.lexer.heredoc_warnings
