"""File tools on a host directory that sandboxed code can also write to.

The agent can plant symlinks in its work dir (``ln -s /etc/passwd x``). The host process (often
root) must never follow one out of the work dir, and a symlink swapped in between a check and an
``open`` must not help either, so every path is opened with ``openat2(RESOLVE_BENEATH)``: the
kernel resolves it relative to the work dir and refuses (EXDEV) any step that leaves it. Kernels
without ``openat2`` (< 5.6) fall back to a ``realpath`` check plus ``O_NOFOLLOW``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import subprocess

_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = 437  # the same number on every architecture (added after the syscall table unification)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_have_openat2: bool | None = None


def _openat2(dir_fd: int, path: str, flags: int, mode: int = 0) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(
        ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def _open_fallback(root: str, dir_fd: int, path: str, flags: int, mode: int) -> int:
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(real_root, path))
    if target != real_root and not target.startswith(real_root + os.sep):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), path)
    return os.open(os.path.relpath(target, real_root), flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                   dir_fd=dir_fd)


def open_beneath(root: str, dir_fd: int, path: str, flags: int, mode: int = 0) -> int:
    """``open`` of work-dir-relative ``path`` that can never resolve outside ``root``.

    Raises ``PermissionError`` for a path (or symlink) that leads outside, else the usual OSError.
    """
    global _have_openat2
    try:
        if _have_openat2 is False:
            return _open_fallback(root, dir_fd, path, flags, mode)
        fd = _openat2(dir_fd, path, flags, mode)
        _have_openat2 = True
        return fd
    except OSError as e:
        if e.errno == errno.ENOSYS and _have_openat2 is None:
            _have_openat2 = False
            return open_beneath(root, dir_fd, path, flags, mode)
        if e.errno == errno.EXDEV:
            raise PermissionError(errno.EACCES, f"{path!r} leads outside the work dir", path) from None
        raise


class HostWorkDir:
    """Read, write and list files of a work dir on the host, safely (see the module docstring).

    ``owner``: (uid, gid) given to every file and directory the host creates, so that sandboxed
    code running as another user can still edit them; None keeps the host process's own.
    """

    def __init__(self, root: str, owner: tuple[int, int] | None = None) -> None:
        self.root = root
        self.owner = owner
        self.fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _open(self, rel: str, flags: int, mode: int = 0) -> int:
        return open_beneath(self.root, self.fd, rel, flags, mode)

    def read_bytes(self, rel: str) -> bytes:
        fd = self._open(rel, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: a planted FIFO must not hang us
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), rel)
            if not stat.S_ISREG(st.st_mode):
                raise PermissionError(errno.EACCES, "not a regular file", rel)
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def _ensure_parents(self, rel: str) -> None:
        parts = rel.split("/")[:-1]
        for k in range(1, len(parts) + 1):
            prefix = "/".join(parts[:k])
            try:
                os.close(self._open(prefix, os.O_PATH | os.O_DIRECTORY))
                continue
            except FileNotFoundError:
                pass
            parent = self._open("/".join(parts[: k - 1]) or ".", os.O_PATH | os.O_DIRECTORY)
            try:
                os.mkdir(parts[k - 1], 0o755, dir_fd=parent)
                if self.owner is not None:
                    os.chown(parts[k - 1], *self.owner, dir_fd=parent, follow_symlinks=False)
            except FileExistsError:
                pass
            finally:
                os.close(parent)

    def write_bytes(self, rel: str, data: bytes) -> None:
        self._ensure_parents(rel)
        fd = self._open(rel, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o644)
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), rel)
            if not stat.S_ISREG(st.st_mode):
                raise PermissionError(errno.EACCES, "not a regular file", rel)
            os.ftruncate(fd, 0)
            if self.owner is not None and (st.st_uid, st.st_gid) != self.owner:
                os.fchown(fd, *self.owner)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def file_prefix(self, rel: str) -> str | None:
        """The first parent of ``rel`` that exists and is not a directory (why a write failed)."""
        parts = rel.split("/")[:-1]
        for k in range(1, len(parts) + 1):
            prefix = "/".join(parts[:k])
            try:
                fd = self._open(prefix, os.O_PATH)
            except OSError:
                return None
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    return prefix
            finally:
                os.close(fd)
        return None

    def remove(self, rel: str) -> None:
        """Delete a file (never following a symlink out of the work dir)."""
        head, _, name = rel.rpartition("/")
        parent = self._open(head or ".", os.O_PATH | os.O_DIRECTORY)
        try:
            os.unlink(name, dir_fd=parent)
        finally:
            os.close(parent)

    def list_files(self) -> list[str]:
        """Sorted relative paths of every regular file (symlinks are not followed nor listed)."""
        out = []
        for dirpath, _dirs, files in os.walk(self.root, followlinks=False):
            rel_dir = os.path.relpath(dirpath, self.root)
            for name in files:
                full = os.path.join(dirpath, name)
                try:
                    if stat.S_ISREG(os.lstat(full).st_mode):
                        out.append(name if rel_dir == "." else f"{rel_dir}/{name}")
                except OSError:
                    continue
        return sorted(out)


def copy_tree(source: str, dest: str, owner: tuple[int, int] | None = None, skip: tuple[str, ...] = (".git",)) -> None:
    """Copy the host folder ``source`` into the fresh work dir ``dest`` as it is on disk: file modes
    (a runner's executable bit), symlinks as symlinks, binary files, timestamps (a build step's
    outputs stay newer than their sources); top-level names in ``skip`` are left out (a git work
    tree's ``.git`` points outside). ``owner``: given to everything copied (sandboxed code runs as
    another user and must edit the files). Runs before any sandboxed code can touch ``dest``."""
    if not os.path.isdir(source):
        raise FileNotFoundError(errno.ENOENT, "no work tree folder", source)
    names = [n for n in sorted(os.listdir(source)) if n not in skip]
    if names:
        res = subprocess.run(["cp", "-R", "--no-dereference", "--preserve=mode,timestamps,links", "--",
                              *[os.path.join(source, n) for n in names], dest + "/"],
                             capture_output=True, text=True, timeout=1800)
        if res.returncode != 0:
            raise OSError(errno.EIO, f"copying the work tree {source} failed: {res.stderr.strip()[-500:]}", source)
    if owner is not None:
        res = subprocess.run(["chown", "-R", "--no-dereference", f"{owner[0]}:{owner[1]}", "--", dest],
                             capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise OSError(errno.EPERM, f"chown of the work tree copy failed: {res.stderr.strip()[-500:]}", dest)
