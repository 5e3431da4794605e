"""Lexer and parser for the emulator's bash subset.

Grammar covered: lists of and-or lists (``;``, newline, ``&&``, ``||``) of pipelines (``|``, leading
``!``) of commands. A command is a simple command (assignments, words, redirections ``<``, ``>``,
``>>``, ``>|``, ``N>``, ``N>>``, ``N>&M``, ``&>``, ``&>>``, ``<<``/``<<-`` here-documents, ``<<<``
here-strings), a compound command (``if``/``elif``/``else``, ``for``, ``for ((;;))``, ``while``,
``until``, ``case``, ``{ ...; }``, ``( ... )``, ``(( ... ))``, ``[[ ... ]]``) with its own
redirections, or a function definition. Words support single/double quotes, backslash escapes,
``$'...'``, parameters (``$NAME``, ``${NAME...}`` with the usual operators), command substitution
(``$(...)``, backticks) and arithmetic expansion ``$((...))``. Background jobs, coprocesses,
``select`` and arrays raise :class:`Unsupported`.

Like bash, the script is executed one complete command at a time: a syntax error on line 3 does
not stop lines 1-2 from running, so :func:`parse` returns the complete groups before the error.
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
    """A piece of a word: literal text, or an expansion when ``var``.

    An expansion is a parameter (``text`` is its name; ``op``/``arg`` hold an operator of
    ``${NAME<op><arg>}`` such as ``:-``, ``#``, ``%%``, ``/``, ``:`` (substring) or ``len`` for
    ``${#NAME}``), a command substitution (``op`` is ``$(``, ``text`` its source) or an arithmetic
    expansion (``op`` is ``$((``, ``text`` the expression).
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
class Compound:
    """A compound command; ``kind`` says which and the fields it uses.

    ``if``: ``clauses`` (condition, body) pairs then ``body`` as the else part; ``for``: ``name``,
    ``words`` (None for ``"$@"``) and ``body``; ``arith_for``: ``exprs`` (init, test, step) and
    ``body``; ``while``/``until``: ``clauses[0]`` (condition, body); ``case``: ``subject`` and
    ``items`` (patterns, body, terminator); ``group``/``subshell``: ``body``; ``arith``:
    ``exprs[0]``; ``cond`` (``[[ ]]``): ``cond`` tokens; ``func``: ``name`` and ``func_body``.
    """

    kind: str
    line: int = 1
    body: list = field(default_factory=list)
    clauses: list = field(default_factory=list)
    name: str = ""
    words: list | None = None
    exprs: list = field(default_factory=list)
    subject: Word | None = None
    items: list = field(default_factory=list)
    cond: list = field(default_factory=list)
    func_body: Compound | None = None
    redirects: list[Redirect] = field(default_factory=list)


@dataclass
class Pipeline:
    commands: list[Command | Compound]
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
        if c in "<>" and self.peek(1) == "(":
            return self._read_process_substitution()
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

    def _read_word(self, stop: str = " \t\n;&|<>()") -> Token:
        start, line = self.i, self.line
        parts: list[Part] = []
        buf: list[str] = []

        def flush(quoted: bool = False) -> None:
            if buf:
                parts.append(Part("".join(buf), quoted))
                buf.clear()

        while True:
            c = self.peek()
            if c == "" or c in stop:
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
                flush()
                parts.append(self._read_backquote(quoted=False))
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

    def _read_double_quoted(self, line: int, heredoc: bool = False) -> list[Part]:
        """A double-quoted string; with ``heredoc`` the whole remaining text, where ``"`` is
        literal (the expansion rules of an unquoted here-document body)."""
        self.i += 0 if heredoc else 1
        parts: list[Part] = []
        buf: list[str] = []
        escapable = ("\\", "$", "`", "\n") if heredoc else ('"', "\\", "$", "`", "\n")
        while True:
            c = self.peek()
            if c == "" and heredoc:
                break
            if c == "":
                raise ShellSyntaxError('unexpected EOF while looking for matching `"\'', line)
            if c == '"' and not heredoc:
                self.i += 1
                break
            if c == "\\" and self.peek(1) in escapable:
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
                if buf:
                    parts.append(Part("".join(buf), True))
                    buf = []
                parts.append(self._read_backquote(quoted=True))
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
        if nxt == "(" and self.peek(2) == "(":
            end = _arith_end(self.src, self.i + 3)
            if end is not None:
                text = self.src[self.i + 3:end]
                self.line += text.count("\n")
                self.i = end + 2
                return [Part(text, quoted, var=True, op="$((")]
        if nxt == "(":
            start = self.i + 2
            end = _subst_end(self.src, start, self.line)
            text = self.src[start:end]
            self.line += text.count("\n")
            self.i = end + 1
            return [Part(text, quoted, var=True, op="$(")]
        if nxt == "'" and not quoted:
            return [Part(self._read_ansi_c(), True)]
        if nxt == '"' and not quoted:  # $"..." is a locale-translated string: plain double quotes
            self.i += 1
            return self._read_double_quoted(self.line)
        if nxt == "{":
            end = _brace_end(self.src, self.i + 2)
            if end is None:
                raise ShellSyntaxError("unexpected EOF while looking for matching `}'", self.line)
            body = self.src[self.i + 2:end]
            self.line += body.count("\n")
            self.i = end + 1
            return [_param_part(body, quoted)]
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

    def _read_process_substitution(self) -> Token:
        """``<(list)``: a word naming a file that holds the list's output (``>(...)`` is not
        emulated)."""
        start, line = self.i, self.line
        if self.peek() == ">":
            raise Unsupported("output process substitution >(...)")
        end = _subst_end(self.src, self.i + 2, self.line)
        text = self.src[self.i + 2:end]
        self.line += text.count("\n")
        self.i = end + 1
        raw = self.src[start:self.i]
        return Token("word", Word([Part(text, False, var=True, op="<(")], raw), line, raw)

    def _read_backquote(self, quoted: bool) -> Part:
        """`` `...` ``: the text up to the next unescaped backquote, with ``\\$``, ``\\` `` and
        ``\\\\`` unescaped (and ``\\"`` inside double quotes), as bash reads it."""
        out: list[str] = []
        j = self.i + 1
        while True:
            if j >= len(self.src):
                raise ShellSyntaxError("unexpected EOF while looking for matching ``'", self.line)
            c = self.src[j]
            if c == "`":
                break
            if c == "\\" and j + 1 < len(self.src) and (self.src[j + 1] in "$`\\" or quoted and self.src[j + 1] == '"'):
                out.append(self.src[j + 1])
                j += 2
                continue
            out.append(c)
            j += 1
        text = "".join(out)
        self.line += text.count("\n")
        self.i = j + 1
        return Part(text, quoted, var=True, op="$(")

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


# ===================================================================== scanning helpers
def _arith_end(src: str, i: int) -> int | None:
    """Index of the ``))`` closing ``$((`` whose body starts at ``i`` (None: not arithmetic)."""
    depth = 0
    while i < len(src):
        c = src[i]
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                return i if src.startswith("))", i) else None
            depth -= 1
        elif c == "\\":
            i += 1
        elif c in "'\"`":  # a quoted string (e.g. inside a nested $(...)) cannot close the expression
            end = src.find(c, i + 1)
            if end < 0:
                return None
            i = end
        i += 1
    return None


def _subst_end(src: str, start: int, line: int) -> int:
    """Index of the ``)`` closing a ``$(`` whose body starts at ``start``: the body's tokens are
    read (quotes, nested substitutions, comments) until an unbalanced ``)``."""
    lexer = Lexer(src)
    lexer.i, lexer.line = start, line
    depth = 0
    while True:
        tok = lexer.next_token()
        if tok.kind == "eof":
            raise ShellSyntaxError("unexpected EOF while looking for matching `)'", line)
        if tok.kind == "op" and tok.value == "(":
            depth += 1
        elif tok.kind == "op" and tok.value == ")":
            if depth == 0:
                return lexer.i - 1
            depth -= 1


def _brace_end(src: str, i: int) -> int | None:
    """Index of the ``}`` closing a ``${`` whose body starts at ``i``."""
    depth = 0
    while i < len(src):
        c = src[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            j = src.find("'", i + 1)
            i = len(src) if j < 0 else j + 1
            continue
        if c == "$" and src.startswith("${", i):
            depth += 1
            i += 2
            continue
        if c == "}":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return None


_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[?#$@*!-]")
_PARAM_OPS = (":-", ":=", ":+", ":?", "##", "%%", "//", "/#", "/%", "^^", ",,", "-", "=", "+", "?", "#", "%",
              "/", "^", ",", ":")


def _param_part(body: str, quoted: bool) -> Part:
    """The parameter expansion ``${body}``; an unknown form becomes op ``bad`` (bash reports
    "bad substitution" when it expands it)."""
    if body.startswith("#") and len(body) > 1 and _PARAM_NAME.fullmatch(body[1:]):
        return Part(body[1:], quoted, var=True, op="len")
    if body.startswith("!") and len(body) > 1:
        raise Unsupported("indirect expansion ${!NAME}")
    m = _PARAM_NAME.match(body)
    if not m:
        return Part(body, quoted, var=True, op="bad")
    name, rest = m.group(0), body[m.end():]
    if not rest:
        return Part(name, quoted, var=True)
    if name == "BASH_REMATCH" and re.fullmatch(r"\[\d+\]", rest):  # stored as plain variables
        return Part(name + rest, quoted, var=True)
    if rest.startswith("["):
        raise Unsupported("arrays")
    for op in _PARAM_OPS:
        if rest.startswith(op):
            return Part(name, quoted, var=True, op=op, arg=rest[len(op):])
    return Part(body, quoted, var=True, op="bad")


def lex_text(text: str, heredoc: bool = False) -> list[Part]:
    """The parts of ``text`` read as one word (quotes removed, nothing splits it), or with
    ``heredoc`` as an unquoted here-document body (only dollars, backquotes and backslashes are
    special)."""
    lexer = Lexer(text)
    if heredoc:
        return lexer._read_double_quoted(1, heredoc=True)
    parts: list[Part] = []
    while lexer.i < len(text):
        tok = lexer._read_word(stop="")
        assert isinstance(tok.value, Word)
        parts.extend(tok.value.parts)
    return parts


# ===================================================================== parser
_LIST_END = {"then", "else", "elif", "fi", "do", "done", "esac", "}", ";;", ";&", ";;&"}


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

    def _is_word(self, *texts: str) -> bool:
        return self.tok.kind == "word" and self.tok.text in texts

    def _is_op(self, *ops: str) -> bool:
        return self.tok.kind == "op" and self.tok.value in ops

    def _expect_word(self, text: str) -> None:
        if not self._is_word(text):
            raise self._error_near(self.tok)
        self._advance()

    def _skip_newlines(self) -> None:
        while self.tok.kind == "newline":
            self._advance()

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
                if self._is_op(";"):
                    self._advance()
                elif self._is_op("&"):
                    raise Unsupported("background jobs (&)")
                elif self.tok.kind not in ("newline", "eof"):
                    raise self._error_near(self.tok)
        except (ShellSyntaxError, Unsupported) as exc:
            return ParseResult(groups, exc)

    def _compound_list(self) -> list[AndOr]:
        """A list inside a compound command, up to a closing keyword (which is not consumed)."""
        nodes: list[AndOr] = []
        self._skip_newlines()
        while not (self.tok.kind == "word" and self.tok.text in _LIST_END) and not self._is_op(")", ";;"):
            if self.tok.kind == "eof":
                raise self._error_near(self.tok)
            nodes.append(self._and_or())
            if self._is_op(";"):
                self._advance()
            elif self._is_op("&"):
                raise Unsupported("background jobs (&)")
            elif self.tok.kind != "newline" and not self._is_op(")", ";;") and not (
                    self.tok.kind == "word" and self.tok.text in _LIST_END):
                raise self._error_near(self.tok)
            self._skip_newlines()
        if not nodes:
            raise self._error_near(self.tok)
        return nodes

    def _and_or(self) -> AndOr:
        node = AndOr(self._pipeline())
        while self._is_op("&&", "||"):
            op = str(self.tok.value)
            self._advance()
            self._skip_newlines()
            node.rest.append((op, self._pipeline()))
        return node

    def _pipeline(self) -> Pipeline:
        negate = False
        while self._is_word("!"):
            negate = not negate
            self._advance()
        cmds = [self._command()]
        while self._is_op("|", "|&"):
            if self.tok.value == "|&":
                raise Unsupported("|& (pipe stderr)")
            self._advance()
            self._skip_newlines()
            cmds.append(self._command())
        return Pipeline(cmds, negate)

    def _command(self) -> Command | Compound:
        if self._is_op("("):
            node = self._arith_command() if self.lexer.peek() == "(" else self._subshell()
            return self._compound_redirects(node)
        if self.tok.kind == "word" and self.tok.text == "function":
            return self._function(keyword=True)
        if self.tok.kind == "word" and self.tok.text in RESERVED:
            return self._compound_redirects(self._keyword_command())
        cmd = Command(line=self.tok.line)
        while True:
            tok = self.tok
            if tok.kind == "word":
                assert isinstance(tok.value, Word)
                name, eq, _ = tok.text.partition("=")
                if not cmd.words and eq and name.isidentifier() and name.isascii():
                    if name.endswith("+") or tok.text == name + "=" and self.lexer.peek() == "(":
                        raise Unsupported("arrays and += assignments")
                    cmd.assigns.append((name, _strip_assignment_name(tok.value, len(name) + 1)))
                elif not cmd.words and not cmd.assigns and not cmd.redirects and self._at_function_parens():
                    return self._function(keyword=False)
                else:
                    cmd.words.append(tok.value)
                self._advance()
            elif tok.kind == "redir":
                cmd.redirects.append(self._redirect())
            elif tok.kind == "op" and tok.value == "(" and cmd.words:
                raise self._error_near(tok)
            else:
                break
        if not cmd.words and not cmd.assigns and not cmd.redirects:
            raise self._error_near(self.tok)
        return cmd

    def _at_function_parens(self) -> bool:
        """``name ()`` or ``name()`` follows: a function definition."""
        rest = self.lexer.src[self.lexer.i:]
        return bool(re.match(r"[ \t]*\([ \t]*\)", rest)) and self.tok.text.isidentifier()

    def _function(self, keyword: bool) -> Compound:
        line = self.tok.line
        if keyword:
            self._advance()
            if self.tok.kind != "word":
                raise self._error_near(self.tok)
        name = self.tok.text
        self._advance()
        if self._is_op("("):
            self._advance()
            if not self._is_op(")"):
                raise self._error_near(self.tok)
            self._advance()
        self._skip_newlines()
        body = self._command()
        if not isinstance(body, Compound):
            raise self._error_near(self.tok)
        return Compound("func", line, name=name, func_body=body)

    def _compound_redirects(self, node: Compound) -> Compound:
        while self.tok.kind == "redir":
            node.redirects.append(self._redirect())
        return node

    def _keyword_command(self) -> Compound:
        word, line = self.tok.text, self.tok.line
        handlers = {"if": self._if, "for": self._for, "while": self._while, "until": self._while,
                    "case": self._case, "{": self._group, "[[": self._cond}
        handler = handlers.get(word)
        if handler is None:
            if word in ("select", "coproc", "time"):
                raise Unsupported(f"{word}")
            raise self._error_near(self.tok)
        node = handler()
        node.line = line
        return node

    def _if(self) -> Compound:
        self._advance()
        clauses = []
        while True:
            cond = self._compound_list()
            self._expect_word("then")
            clauses.append((cond, self._compound_list()))
            if self._is_word("elif"):
                self._advance()
                continue
            break
        body: list[AndOr] = []
        if self._is_word("else"):
            self._advance()
            body = self._compound_list()
        self._expect_word("fi")
        return Compound("if", clauses=clauses, body=body)

    def _do_group(self) -> list[AndOr]:
        self._skip_newlines()
        if self._is_word("{"):  # bash also accepts `for x in y; { ...; }`
            return [AndOr(Pipeline([self._group()]))]
        self._expect_word("do")
        body = self._compound_list()
        self._expect_word("done")
        return body

    def _for(self) -> Compound:
        rest = self.lexer.src[self.lexer.i:]
        m = re.match(r"[ \t]*\(\(", rest)
        if m:
            return self._arith_for(m.end())
        self._advance()
        if self.tok.kind != "word" or not self.tok.text.isidentifier():
            raise self._error_near(self.tok)
        name = self.tok.text
        self._advance()
        words: list[Word] | None = None
        self._skip_newlines()
        if self._is_word("in"):
            self._advance()
            words = []
            while self.tok.kind == "word":
                assert isinstance(self.tok.value, Word)
                words.append(self.tok.value)
                self._advance()
            if not (self._is_op(";") or self.tok.kind == "newline"):
                raise self._error_near(self.tok)
            self._advance()
        elif self._is_op(";"):
            self._advance()
        return Compound("for", name=name, words=words, body=self._do_group())

    def _arith_for(self, skip: int) -> Compound:
        src, i = self.lexer.src, self.lexer.i + skip
        end = _arith_end(src, i)
        if end is None:
            raise self._error_near(self.tok)
        exprs = src[i:end].split(";")
        if len(exprs) != 3:
            raise ShellSyntaxError("syntax error: arithmetic expression required", self.tok.line)
        self.lexer.line += src[i:end].count("\n")
        self.lexer.i = end + 2
        self._advance()
        if self._is_op(";"):
            self._advance()
        return Compound("arith_for", exprs=[e.strip() for e in exprs], body=self._do_group())

    def _while(self) -> Compound:
        kind = self.tok.text
        self._advance()
        cond = self._compound_list()
        self._expect_word("do")
        body = self._compound_list()
        self._expect_word("done")
        return Compound(kind, clauses=[(cond, body)])

    def _case(self) -> Compound:
        self._advance()
        if self.tok.kind != "word":
            raise self._error_near(self.tok)
        subject = self.tok.value
        self._advance()
        self._skip_newlines()
        self._expect_word("in")
        items = []
        self._skip_newlines()
        while not self._is_word("esac"):
            items.append(self._case_item())
            self._skip_newlines()
        self._advance()
        return Compound("case", subject=subject, items=items)

    def _case_item(self) -> tuple:
        if self._is_op("("):
            self._advance()
        patterns: list[Word] = []
        while True:
            if self.tok.kind != "word":
                raise self._error_near(self.tok)
            patterns.append(self.tok.value)
            self._advance()
            if self._is_op("|"):
                self._advance()
                continue
            break
        if not self._is_op(")"):
            raise self._error_near(self.tok)
        self._advance()
        self._skip_newlines()
        body: list[AndOr] = []
        if not self._is_op(";;") and not self._is_word("esac") and not self._case_fallthrough():
            body = self._compound_list()
        terminator = ";;"
        if self._is_op(";;"):
            self._advance()
            if self._is_op("&"):
                raise Unsupported("case fall-through ;;&")
        elif self._case_fallthrough():
            raise Unsupported("case fall-through ;&")
        elif not self._is_word("esac"):
            raise self._error_near(self.tok)
        return patterns, body, terminator

    def _case_fallthrough(self) -> bool:
        return self._is_op(";") and self.lexer.peek() == "&"

    def _group(self) -> Compound:
        self._advance()
        body = self._compound_list()
        self._expect_word("}")
        return Compound("group", body=body)

    def _subshell(self) -> Compound:
        line = self.tok.line
        self._advance()
        body = self._compound_list()
        if not self._is_op(")"):
            raise self._error_near(self.tok)
        self._advance()
        return Compound("subshell", line, body=body)

    def _arith_command(self) -> Compound:
        src, i, line = self.lexer.src, self.lexer.i + 1, self.tok.line
        end = _arith_end(src, i)
        if end is None:  # `( (cmd) )`: nested subshells
            return self._subshell()
        self.lexer.line += src[i:end].count("\n")
        self.lexer.i = end + 2
        self._advance()
        return Compound("arith", line, exprs=[src[i:end]])

    def _cond(self) -> Compound:
        """``[[ ... ]]``: words, ``&&``, ``||``, ``!``, parentheses and ``<``/``>`` comparisons."""
        self._advance()
        toks: list = []
        while not self._is_word("]]"):
            tok = self.tok
            if tok.kind in ("eof", "newline") or tok.kind == "op" and tok.value not in ("&&", "||", "(", ")"):
                raise self._error_near(tok)
            if tok.kind == "redir" and tok.value in ("<", ">"):
                toks.append(("op", tok.value))
            elif tok.kind == "redir":
                raise self._error_near(tok)
            elif tok.kind == "op":
                toks.append(("op", tok.value))
            elif tok.text == "=~":
                toks.append(("word", tok.value))
                toks.append(("word", self._regex_word()))
            else:
                toks.append(("word", tok.value))
            self._advance()
        self._advance()
        return Compound("cond", cond=toks)

    def _regex_word(self) -> Word:
        """The operand of ``=~``: up to unquoted white space, parentheses and ``|`` included."""
        src, i = self.lexer.src, self.lexer.i
        while i < len(src) and src[i] in " \t":
            i += 1
        start, depth = i, 0
        while i < len(src) and (src[i] not in " \t\n" or depth > 0):
            c = src[i]
            if c == "\\":
                i += 1
            elif c in "'\"":
                end = src.find(c, i + 1)
                i = len(src) - 1 if end < 0 else end
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            i += 1
        raw = src[start:i]
        self.lexer.i = i
        return Word(lex_text(raw), raw)

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
            parts.append(Part(p.text[n:], p.quoted, p.var, p.op, p.arg))
            n = 0
    return Word(parts or [Part("", True)], word.raw[word.raw.find("=") + 1:])


_CACHE: dict[str, tuple[ParseResult, list[tuple[int, str]]]] = {}
_CACHE_MAX = 4096


def parse(src: str) -> tuple[ParseResult, list[tuple[int, str]]]:
    """Parse a command string; returns the result and here-document warnings. Results are cached
    (the executor never mutates the tree): loops re-expand the same substitutions many times."""
    hit = _CACHE.get(src)
    if hit is not None:
        return hit
    parser = Parser(src)
    result = parser.parse(), parser.lexer.heredoc_warnings
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[src] = result
    return result
