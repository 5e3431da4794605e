"""The emulator's file system: two in-memory areas, the work dir and a private ``/tmp``.

The work dir's files are the caller's dict (work-dir-relative path -> text), edited in place; the
``/tmp`` area (scratch files, as the real sandboxes' private tmpfs) lives only in the session.
Paths are resolved against the shell's current directory. Anything else outside the work dir does
not exist (reads fail with ENOENT, writes with EACCES), except ``/dev/null``; the directories above
the work dir exist but list only the way down to it. Errors carry the ``strerror`` text that GNU
tools print.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace

ENOENT = "No such file or directory"
EISDIR = "Is a directory"
ENOTDIR = "Not a directory"
EEXIST = "File exists"
EACCES = "Permission denied"
ENOTEMPTY = "Directory not empty"
TMP = "/tmp"


class FsError(Exception):
    """A failed file-system call; ``strerror`` is the C library's message."""

    def __init__(self, strerror: str) -> None:
        super().__init__(strerror)
        self.strerror = strerror


@dataclass(frozen=True)
class Resolved:
    """A path after resolution: ``rel`` is relative to its area ("" is the area's top).

    ``area`` is ``""`` for the work dir and ``"/tmp"`` for the scratch area; ``outside`` marks any
    other absolute path (then ``rel`` holds it); ``devnull`` marks ``/dev/null``.
    """

    rel: str
    outside: bool = False
    devnull: bool = False
    area: str = ""


@dataclass
class _Store:
    files: dict[str, str]
    dirs: set[str]
    cache: set[str] | None = None


class VirtualFS:
    """The two areas; ``files`` (work dir) is shared with the caller, ``dirs`` its empty dirs."""

    def __init__(self, files: dict[str, str], root: str) -> None:
        self.files = files
        self.root = posixpath.normpath(root) if root != "/" else "/"
        self.dirs: set[str] = set()
        self._tmp = _Store({}, set())
        self.fds: dict[str, str] = {}  # process substitutions' /dev/fd/N, for one command line

    def _store(self, r: Resolved) -> _Store:
        if r.area == TMP:
            return self._tmp
        store = getattr(self, "_work", None)
        if store is None or store.files is not self.files or store.dirs is not self.dirs:
            store = self._work = _Store(self.files, self.dirs)
        return store

    # ----------------------------------------------------------------- resolution
    def resolve(self, cwd: str, path: str) -> Resolved:
        """``cwd`` is the shell's current directory as an absolute path."""
        if path == "/dev/null":
            return Resolved("", devnull=True)
        if path in self.fds:
            return Resolved(path, outside=True)
        base = path if path.startswith("/") else posixpath.join(cwd or self.root, path)
        norm = posixpath.normpath(base)
        if norm.startswith("//"):
            norm = norm[1:]
        for top, area in ((self.root, ""), (TMP, TMP)):  # the work dir first: it may sit in /tmp
            if norm == top:
                return Resolved("", area=area)
            if norm.startswith(top.rstrip("/") + "/"):
                return Resolved(norm[len(top.rstrip("/")) + 1:], area=area)
        return Resolved(norm, outside=True)

    def abs_path(self, rel: str, area: str = "") -> str:
        top = TMP if area == TMP else self.root
        return posixpath.join(top, rel) if rel else top

    def abs_of(self, r: Resolved) -> str:
        return r.rel if r.outside else self.abs_path(r.rel, r.area)

    def parent(self, r: Resolved) -> Resolved:
        return replace(r, rel=posixpath.dirname(r.rel))

    def child(self, r: Resolved, name: str) -> Resolved:
        return replace(r, rel=posixpath.join(r.rel, name) if r.rel else name)

    # ----------------------------------------------------------------- queries
    def _all_dirs(self, r: Resolved) -> set[str]:
        store = self._store(r)
        if store.cache is None:
            dirs = {""}
            for path in list(store.dirs) + list(store.files):
                if path in store.dirs:
                    dirs.add(path)
                parent = posixpath.dirname(path)
                while parent and parent not in dirs:
                    dirs.add(parent)
                    parent = posixpath.dirname(parent)
            store.cache = dirs
        return store.cache

    def invalidate(self) -> None:
        self._store(Resolved("")).cache = None
        self._tmp.cache = None

    def _invalidate(self, r: Resolved) -> None:
        self._store(r).cache = None

    def _is_ancestor(self, path: str) -> bool:
        return any(path == "/" or top.startswith(path.rstrip("/") + "/") for top in (self.root, TMP))

    def is_file(self, r: Resolved) -> bool:
        return not r.outside and not r.devnull and r.rel in self._store(r).files

    def is_dir(self, r: Resolved) -> bool:
        if r.outside:  # the directories above the areas exist; nothing else outside does
            return self._is_ancestor(r.rel)
        return not r.devnull and r.rel in self._all_dirs(r)

    def exists(self, r: Resolved) -> bool:
        return r.devnull or self.is_file(r) or self.is_dir(r) or r.outside and r.rel in self.fds

    def lookup_error(self, r: Resolved) -> str:
        """The errno text for a path that does not exist (ENOENT or ENOTDIR)."""
        if r.outside:
            return ENOENT
        files = self._store(r).files
        parent = posixpath.dirname(r.rel)
        while parent:
            if parent in files:
                return ENOTDIR
            parent = posixpath.dirname(parent)
        return ENOENT

    def listdir(self, r: Resolved) -> list[str]:
        """Sorted names in a directory (code point order, as ``LC_ALL=C.UTF-8``)."""
        if r.outside:
            if not self._is_ancestor(r.rel):
                return []
            names = set()
            for top in (self.root, TMP):
                if top.startswith(r.rel.rstrip("/") + "/"):
                    names.add(top[len(r.rel.rstrip("/")) + 1:].split("/", 1)[0])
            return sorted(names)
        store = self._store(r)
        prefix = r.rel + "/" if r.rel else ""
        names: set[str] = set()
        for path in list(store.files) + list(self._all_dirs(r)):
            if path and path.startswith(prefix):
                rest = path[len(prefix):]
                if rest:
                    names.add(rest.split("/", 1)[0])
        return sorted(names)

    def walk(self, r: Resolved) -> list[str]:
        """Every path under a directory (relative to it), pre-order with sorted children."""
        out: list[str] = []
        for name in self.listdir(r):
            child = self.child(r, name) if not r.outside else Resolved(posixpath.join(r.rel, name), outside=True)
            out.append(name)
            if self.is_dir(child) and not (child.outside and not self._is_ancestor(child.rel)):
                out.extend(posixpath.join(name, sub) for sub in self.walk(self.resolve("/", self.abs_of(child))))
        return out

    def size(self, r: Resolved) -> int:
        return len(self._store(r).files.get(r.rel, "").encode("utf-8", "surrogateescape"))

    # ----------------------------------------------------------------- reading and writing
    def read(self, r: Resolved) -> str:
        if r.devnull:
            return ""
        if r.outside and r.rel in self.fds:
            return self.fds[r.rel]
        if self.is_file(r):
            return self._store(r).files[r.rel]
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
        if not self.is_dir(self.parent(r)):
            raise FsError(ENOTDIR if self.lookup_error(r) == ENOTDIR else ENOENT)

    def write(self, r: Resolved, text: str, append: bool = False) -> None:
        self.check_writable(r)
        if r.devnull:
            return
        if any("\udc80" <= c <= "\udcff" for c in text):  # invalid UTF-8 bytes: U+FFFD in files
            text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        files = self._store(r).files
        if append and r.rel in files:
            files[r.rel] += text
        else:
            if r.rel not in files:
                self._invalidate(r)
            files[r.rel] = text

    def mkdir(self, r: Resolved) -> None:
        if r.outside:
            raise FsError(EACCES)
        if self.exists(r):
            raise FsError(EEXIST)
        if not self.is_dir(self.parent(r)):
            raise FsError(ENOTDIR if self.lookup_error(r) == ENOTDIR else ENOENT)
        self._store(r).dirs.add(r.rel)
        self._invalidate(r)

    def _keep_parent(self, r: Resolved) -> None:
        parent = posixpath.dirname(r.rel)
        if parent:  # the parent directory survives its last entry
            self._store(r).dirs.add(parent)
        self._invalidate(r)

    def remove_file(self, r: Resolved) -> None:
        del self._store(r).files[r.rel]
        self._keep_parent(r)

    def remove_tree(self, r: Resolved) -> None:
        store = self._store(r)
        prefix = r.rel + "/"
        for path in [p for p in store.files if p.startswith(prefix)]:
            del store.files[path]
        keep = {d for d in store.dirs if d != r.rel and not d.startswith(prefix)}
        store.dirs.clear()
        store.dirs.update(keep)
        self._keep_parent(r)

    def remove_empty_dir(self, r: Resolved) -> None:
        if self.listdir(r):
            raise FsError(ENOTEMPTY)
        self._store(r).dirs.discard(r.rel)
        self._keep_parent(r)

    def copy_tree(self, src: Resolved, dst: Resolved) -> None:
        dst_store = self._store(dst)
        dst_store.dirs.add(dst.rel)
        for sub in self.walk(src):
            s, d = self.child(src, sub), self.child(dst, sub)
            if self.is_file(s):
                dst_store.files[d.rel] = self.read(s)
            else:
                dst_store.dirs.add(d.rel)
        self._invalidate(dst)


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
