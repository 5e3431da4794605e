"""The emulator's file system: a dict of work-dir-relative paths to text, plus empty directories.

Paths seen by commands are resolved against the shell's current directory and the work dir's
absolute ``root``. Anything outside ``root`` does not exist (reads fail with ENOENT, writes with
EACCES), except ``/dev/null``. Errors carry the ``strerror`` text that GNU tools print.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

ENOENT = "No such file or directory"
EISDIR = "Is a directory"
ENOTDIR = "Not a directory"
EEXIST = "File exists"
EACCES = "Permission denied"
ENOTEMPTY = "Directory not empty"


class FsError(Exception):
    """A failed file-system call; ``strerror`` is the C library's message."""

    def __init__(self, strerror: str) -> None:
        super().__init__(strerror)
        self.strerror = strerror


@dataclass(frozen=True)
class Resolved:
    """A path after resolution: ``rel`` is work-dir relative ("" is the work dir itself).

    ``outside`` marks a path that leaves the work dir; ``devnull`` marks ``/dev/null``.
    """

    rel: str
    outside: bool = False
    devnull: bool = False


class VirtualFS:
    """Files (``files``: relative path -> text, shared with the caller) and explicit empty dirs."""

    def __init__(self, files: dict[str, str], root: str) -> None:
        self.files = files
        self.root = posixpath.normpath(root) if root != "/" else "/"
        self.dirs: set[str] = set()
        self._dir_cache: set[str] | None = None

    # ----------------------------------------------------------------- resolution
    def resolve(self, cwd: str, path: str) -> Resolved:
        if path == "/dev/null":
            return Resolved("", devnull=True)
        base = path if path.startswith("/") else posixpath.join(self.abs_path(cwd), path)
        norm = posixpath.normpath(base)
        if norm.startswith("//"):
            norm = norm[1:]
        if norm == self.root:
            return Resolved("")
        prefix = self.root.rstrip("/") + "/"
        if norm.startswith(prefix):
            return Resolved(norm[len(prefix):])
        return Resolved(norm, outside=True)

    def abs_path(self, rel: str) -> str:
        if not rel:
            return self.root
        return posixpath.join(self.root, rel)

    # ----------------------------------------------------------------- queries
    def _all_dirs(self) -> set[str]:
        if self._dir_cache is None:
            dirs = {""}
            for path in list(self.dirs) + list(self.files):
                if path in self.dirs:
                    dirs.add(path)
                parent = posixpath.dirname(path)
                while parent and parent not in dirs:
                    dirs.add(parent)
                    parent = posixpath.dirname(parent)
            self._dir_cache = dirs
        return self._dir_cache

    def invalidate(self) -> None:
        self._dir_cache = None

    def is_file(self, r: Resolved) -> bool:
        return not r.outside and not r.devnull and r.rel in self.files

    def is_dir(self, r: Resolved) -> bool:
        if r.outside:  # the directories above the work dir exist; nothing else outside does
            return self._is_ancestor(r.rel)
        return not r.devnull and r.rel in self._all_dirs()

    def _is_ancestor(self, path: str) -> bool:
        return path == "/" or self.root.startswith(path.rstrip("/") + "/")

    def exists(self, r: Resolved) -> bool:
        return r.devnull or self.is_file(r) or self.is_dir(r)

    def lookup_error(self, r: Resolved) -> str:
        """The errno text for a path that does not exist (ENOENT or ENOTDIR)."""
        if r.outside:
            return ENOENT
        parent = posixpath.dirname(r.rel)
        while parent:
            if parent in self.files:
                return ENOTDIR
            parent = posixpath.dirname(parent)
        return ENOENT

    def listdir(self, r: Resolved) -> list[str]:
        """Sorted names in a directory (code point order, as ``LC_ALL=C.UTF-8``)."""
        if r.outside:
            if not self._is_ancestor(r.rel):
                return []
            rest = self.root[len(r.rel.rstrip("/")) + 1:]
            return [rest.split("/", 1)[0]]
        prefix = r.rel + "/" if r.rel else ""
        names: set[str] = set()
        for path in list(self.files) + list(self._all_dirs()):
            if path and path.startswith(prefix):
                rest = path[len(prefix):]
                if rest:
                    names.add(rest.split("/", 1)[0])
        return sorted(names)

    def walk(self, r: Resolved) -> list[str]:
        """Every path under a directory (relative to it), pre-order with sorted children."""
        out: list[str] = []
        for name in self.listdir(r):
            child = Resolved(posixpath.join(r.rel, name) if r.rel else name)
            out.append(name)
            if self.is_dir(child):
                out.extend(posixpath.join(name, sub) for sub in self.walk(child))
        return out

    # ----------------------------------------------------------------- reading and writing
    def read(self, r: Resolved) -> str:
        if r.devnull:
            return ""
        if self.is_file(r):
            return self.files[r.rel]
        if self.is_dir(r):
            raise FsError(EISDIR)
        raise FsError(self.lookup_error(r))

    def check_writable(self, r: Resolved) -> None:
        """Raise the error ``open(path, O_WRONLY|O_CREAT)`` would give, without writing."""
        if r.devnull:
            return
        if r.outside:
            raise FsError(EACCES)
        if self.is_dir(r):
            raise FsError(EISDIR)
        parent = Resolved(posixpath.dirname(r.rel))
        if not self.is_dir(parent):
            raise FsError(self.lookup_error(r) if self.lookup_error(r) == ENOTDIR else ENOENT)

    def write(self, r: Resolved, text: str, append: bool = False) -> None:
        self.check_writable(r)
        if r.devnull:
            return
        if any("\udc80" <= c <= "\udcff" for c in text):  # invalid UTF-8 bytes: U+FFFD in files
            text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        if append and r.rel in self.files:
            self.files[r.rel] += text
        else:
            if r.rel not in self.files:
                self.invalidate()
            self.files[r.rel] = text

    def mkdir(self, r: Resolved) -> None:
        if r.outside:
            raise FsError(EACCES)
        if self.exists(r):
            raise FsError(EEXIST)
        parent = Resolved(posixpath.dirname(r.rel))
        if not self.is_dir(parent):
            raise FsError(self.lookup_error(r) if self.lookup_error(r) == ENOTDIR else ENOENT)
        self.dirs.add(r.rel)
        self.invalidate()

    def remove_file(self, r: Resolved) -> None:
        del self.files[r.rel]
        parent = posixpath.dirname(r.rel)
        if parent:  # the parent directory survives its last file
            self.dirs.add(parent)
        self.invalidate()

    def remove_tree(self, r: Resolved) -> None:
        prefix = r.rel + "/"
        for path in [p for p in self.files if p.startswith(prefix)]:
            del self.files[path]
        self.dirs = {d for d in self.dirs if d != r.rel and not d.startswith(prefix)}
        parent = posixpath.dirname(r.rel)
        if parent:
            self.dirs.add(parent)
        self.invalidate()

    def remove_empty_dir(self, r: Resolved) -> None:
        if self.listdir(r):
            raise FsError(ENOTEMPTY)
        self.dirs.discard(r.rel)
        parent = posixpath.dirname(r.rel)
        if parent:
            self.dirs.add(parent)
        self.invalidate()

    def copy_tree(self, src: Resolved, dst: Resolved) -> None:
        self.dirs.add(dst.rel)
        for sub in self.walk(src):
            s, d = posixpath.join(src.rel, sub), posixpath.join(dst.rel, sub)
            if s in self.files:
                self.files[d] = self.files[s]
            else:
                self.dirs.add(d)
        self.invalidate()


def quote_shell(name: str, always: bool = True) -> str:
    """GNU ``quotearg`` shell-escape quoting, as in ``ls: cannot access 'a b'``.

    With ``always=False`` (``cat: a b``-style messages) the name is quoted only when needed.
    """
    needs = any(c in " \t\n!\"$&'()*:;<=>?[\\^`|" or ord(c) < 32 or ord(c) == 127 for c in name)
    needs = needs or name[:1] in ("#", "~") or name == ""
    if not needs and not always:
        return name
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return _quote_ansi(name)
    if "'" not in name:
        return f"'{name}'"
    if not any(c in name for c in '"$`\\'):
        return f'"{name}"'
    return "'" + name.replace("'", "'\\''") + "'"


def _quote_ansi(name: str) -> str:
    out, plain = [], []
    escapes = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\v": "\\v"}
    for c in name:
        if ord(c) < 32 or ord(c) == 127:
            if plain:
                out.append("'" + "".join(plain).replace("'", "'\\''") + "'")
                plain = []
            out.append("$'" + escapes.get(c, f"\\{ord(c):03o}") + "'")
        else:
            plain.append(c)
    if plain:
        out.append("'" + "".join(plain).replace("'", "'\\''") + "'")
    return "".join(out)


def quote_locale(text: str) -> str:
    """GNU ``quote()`` in a UTF-8 locale: curly single quotes, as in ``mkdir: ... ‘d’``."""
    return f"\u2018{text}\u2019"
