"""POSIX basic/extended regular expressions (GNU flavour) translated to Python ``re``.

Matching a line (grep's yes/no) agrees with GNU for the supported syntax. Where a match's *extent*
matters (``grep -o``, ``sed s///``), GNU picks the leftmost-longest match and Python the leftmost
match found by backtracking: they differ only for alternations and quantified groups whose
shorter branch matches first (documented in docs/terminal.md). Character classes are ASCII.
"""

from __future__ import annotations

import re

_CLASSES = {
    "alpha": "a-zA-Z",
    "digit": "0-9",
    "alnum": "0-9A-Za-z",
    "upper": "A-Z",
    "lower": "a-z",
    "space": " \\t\\n\\r\\f\\v",
    "blank": " \\t",
    "punct": re.sub(r"([\\\]\[\^\-&~|])", r"\\\1", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    "print": " -~",
    "graph": "!-~",
    "cntrl": "\\x00-\\x1f\\x7f",
    "xdigit": "0-9A-Fa-f",
}


class RegexError(ValueError):
    """An invalid pattern; the message is GNU's wording where known."""


def _class_char(c: str) -> str:
    return "\\" + c if c in "\\]^-[&~|" else c


def _bracket(p: str, i: int) -> tuple[str, int]:
    """Translate the bracket expression starting after ``[`` at ``p[i]``; return (class, end)."""
    n = len(p)
    negate = i < n and p[i] == "^"
    if negate:
        i += 1
    items: list[str] = []
    first = True
    while True:
        if i >= n:
            raise RegexError("Unmatched [, [^, [:, [., or [=")
        c = p[i]
        if c == "]" and not first:
            return ("[^" if negate else "[") + "".join(items) + "]", i + 1
        first = False
        if c == "[" and i + 1 < n and p[i + 1] in ":=.":
            kind = p[i + 1]
            end = p.find(kind + "]", i + 2)
            if end < 0:
                raise RegexError("Unmatched [, [^, [:, [., or [=")
            name = p[i + 2:end]
            i = end + 2
            if kind == ":":
                if name not in _CLASSES:
                    raise RegexError("Invalid character class name")
                items.append(_CLASSES[name])
            else:
                items.append("".join(_class_char(ch) for ch in name))
            continue
        if i + 2 < n and p[i + 1] == "-" and p[i + 2] != "]":
            hi = p[i + 2]
            if ord(hi) < ord(c):
                raise RegexError("Invalid range end")
            items.append(f"{_class_char(c)}-{_class_char(hi)}")
            i += 3
            continue
        items.append(_class_char(c))
        i += 1


def _interval(body: str) -> str | None:
    """``m``, ``m,``, ``,n``, ``m,n`` -> Python ``{m,n}``; None when it is not an interval."""
    m = re.fullmatch(r"(\d*)(,?)(\d*)", body)
    if not m or (not m.group(1) and not m.group(2)):
        return None
    lo, comma, hi = m.groups()
    if hi and lo and int(hi) < int(lo):
        raise RegexError("Invalid content of \\{\\}")
    if not comma:
        return "{" + lo + "}"
    return "{" + (lo or "0") + "," + hi + "}"


class _Builder:
    """Accumulates translated atoms so quantifiers can be stacked safely (``a**``)."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.atom_start: int | None = None  # index in ``out`` of the last quantifiable atom
        self.quantified = False
        self.groups: list[int] = []
        self.closed_groups = 0

    def atom(self, text: str) -> None:
        self.atom_start = len(self.out)
        self.quantified = False
        self.out.append(text)

    def anchor(self, text: str) -> None:
        self.out.append(text)
        self.atom_start = None

    def quantify(self, q: str) -> None:
        assert self.atom_start is not None
        if self.quantified:  # Python rejects "a**" and reads "a*+" as possessive
            body = "".join(self.out[self.atom_start:])
            del self.out[self.atom_start:]
            self.out.append(f"(?:{body})")
        self.out.append(q)
        self.quantified = True


def posix_to_python(pattern: str, extended: bool, sed_escapes: bool = False) -> str:
    """Translate a GNU BRE (``extended=False``) or ERE to Python regex syntax."""
    b = _Builder()
    p, n, i = pattern, len(pattern), 0
    at_start = True  # where '*' is literal and (BRE) '^' is an anchor
    while i < n:
        c = p[i]
        start_before = at_start
        at_start = False
        if c == "\\":
            if i + 1 >= n:
                raise RegexError("Trailing backslash")
            d = p[i + 1]
            i += 2
            i, at_start = _escape(b, p, i, d, extended, start_before, sed_escapes)
            continue
        i += 1
        if c == "[":
            cls, i = _bracket(p, i)
            b.atom(cls)
        elif c == ".":
            b.atom(".")
        elif c == "*":
            if start_before or b.atom_start is None:
                b.atom("\\*")
            else:
                b.quantify("*")
        elif c == "^":
            if extended or start_before:
                b.anchor("^")
                at_start = True
            else:
                b.atom("\\^")
        elif c == "$":
            rest = p[i:]
            if extended or rest == "" or rest.startswith("\\)") or rest.startswith("\\|"):
                b.anchor("$")
            else:
                b.atom("\\$")
        elif extended and c in "+?":
            if start_before or b.atom_start is None:
                b.atom(re.escape(c))
            else:
                b.quantify(c)
        elif extended and c == "{":
            end = p.find("}", i)
            q = _interval(p[i:end]) if end >= 0 and not start_before and b.atom_start is not None else None
            if q is None:
                b.atom("\\{")
            else:
                b.quantify(q)
                i = end + 1
        elif extended and c == "(":
            b.groups.append(len(b.out))
            b.anchor("(")
            at_start = True
        elif extended and c == ")":
            _close_group(b)
        elif extended and c == "|":
            b.anchor("|")
            at_start = True
        else:
            b.atom(re.escape(c))
    if b.groups:
        raise RegexError("Unmatched ( or \\(")
    return "".join(b.out)


def _close_group(b: _Builder) -> None:
    if not b.groups:
        raise RegexError("Unmatched ) or \\)")
    start = b.groups.pop()
    b.out.append(")")
    b.closed_groups += 1
    b.atom_start = start
    b.quantified = False


def _escape(b: _Builder, p: str, i: int, d: str, extended: bool, start_before: bool,
            sed_escapes: bool) -> tuple[int, bool]:
    """Handle ``\\d`` at ``p[i-2:i]``; return the new index and the new ``at_start``."""
    if not extended and d == "(":
        b.groups.append(len(b.out))
        b.anchor("(")
        return i, True
    if not extended and d == ")":
        _close_group(b)
        return i, False
    if not extended and d == "|":
        b.anchor("|")
        return i, True
    if not extended and d == "{":
        end = p.find("\\}", i)
        q = _interval(p[i:end]) if end >= 0 else None
        if q is None:
            raise RegexError("Unmatched \\{")
        if start_before or b.atom_start is None:
            raise RegexError("Invalid preceding regular expression")
        b.quantify(q)
        return end + 2, False
    if not extended and d in "+?":
        if start_before or b.atom_start is None:
            b.atom(re.escape(d))
        else:
            b.quantify(d)
        return i, False
    if d.isdigit() and d != "0":
        if int(d) > b.closed_groups:
            raise RegexError("Invalid back reference")
        b.atom(f"(?:\\{d})")
        return i, False
    special = {"<": r"\b(?=\w)", ">": r"\b(?<=\w)", "b": r"\b", "B": r"\B", "`": r"\A", "'": r"\Z"}
    if d in special:
        b.anchor(special[d])
        return i, False
    classes = {"w": "[A-Za-z0-9_]", "W": "[^A-Za-z0-9_]", "s": r"\s", "S": r"\S"}
    if d in classes:
        b.atom(classes[d])
        return i, False
    if sed_escapes and d in "nt":
        b.atom("\\n" if d == "n" else "\\t")
        return i, False
    b.atom(re.escape(d))
    return i, False


def compile_posix(pattern: str, extended: bool, icase: bool = False, sed_escapes: bool = False) -> re.Pattern:
    """Compile a POSIX pattern; raises :class:`RegexError` for invalid ones."""
    translated = posix_to_python(pattern, extended, sed_escapes)
    try:
        return re.compile(translated, re.IGNORECASE if icase else 0)
    except re.error as exc:  # a construct the translation passed through but Python rejects
        raise RegexError(str(exc)) from exc


def fnmatch_to_regex(pattern: str, quoted: list[bool] | None = None, pathname: bool = True) -> str:
    """A shell glob (``*``, ``?``, ``[...]``) as a Python regex; ``quoted[i]`` disables char ``i``.

    ``pathname=True`` keeps ``*`` and ``?`` from matching ``/`` (bash globs, ``find -path`` does not).
    """
    q = quoted or [False] * len(pattern)
    out, i, n = [], 0, len(pattern)
    any_char = "[^/]" if pathname else "."
    while i < n:
        c = pattern[i]
        if q[i]:
            out.append(re.escape(c))
            i += 1
        elif c == "*":
            out.append(any_char + "*")
            i += 1
        elif c == "?":
            out.append(any_char)
            i += 1
        elif c == "[":
            end = _glob_bracket_end(pattern, i + 1)
            if end < 0:
                out.append("\\[")
                i += 1
                continue
            body = pattern[i + 1:end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            cls, _ = _bracket(body + "]", 0)
            out.append(cls)
            i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _glob_bracket_end(p: str, i: int) -> int:
    """Index of the ``]`` closing a glob bracket that opened before ``p[i]``, or -1."""
    n = len(p)
    if i < n and p[i] in "!^":
        i += 1
    if i < n and p[i] == "]":
        i += 1
    while i < n:
        if p[i] == "[" and i + 1 < n and p[i + 1] == ":":
            end = p.find(":]", i + 2)
            if end >= 0:
                i = end + 2
                continue
        if p[i] == "]":
            return i
        i += 1
    return -1
