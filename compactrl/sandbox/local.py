"""``backend="local"``: real files and one long-lived bash per episode, isolated on this machine.

Isolation (bubblewrap, or ``unshare`` where bubblewrap is missing; chosen automatically and kept
in :attr:`LocalSandbox.isolation`):

* a new root built from read-only binds of the host's system directories (``/usr``, ``/etc``,
  ``/lib*``) and of the Python that runs compactrl; nothing else of the host is visible;
* the episode's private work dir (a temp dir on the host) is the only writable host path,
  plus a private size-limited tmpfs at ``/tmp``;
* new user, pid, network, ipc and uts namespaces: no network at all (not even loopback to the
  host), no view of host processes; as root the shell runs as an unprivileged uid;
* resource limits (CPU time, address space, processes, file size) set on the shell with
  ``ulimit`` (hard limits: the agent cannot raise them); the process limit is counted per
  sandbox because each sandbox has its own user namespace;
* a per-command timeout, an output cap, and cleanup of every process a command leaves behind.

The shell protocol: commands are written to bash's stdin as one line each, followed by a random
marker that bash prints with the exit code when the command is done (pipes, no pty; see
``_shell.py`` for the shell semantics shared with the docker backend).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Literal

from compactrl.sandbox import _shell
from compactrl.sandbox._common import (
    command_timeout,
    file_bytes,
    hidden_files_blocked,
    hidden_restore_plan,
    is_a_directory,
    make_config,
    not_a_directory,
    not_found,
    report_from_run,
    work_rel,
)
from compactrl.sandbox._hostfs import HostWorkDir, copy_tree
from compactrl.sandbox.base import ExecResult, SandboxError, TestReport
from compactrl.task import Check, Task

log = logging.getLogger(__name__)

Isolation = Literal["auto", "bwrap", "unshare"]
_OPT_DIR = "/opt/compactrl"  # inside: bin/ (`python`, `python3`, `pytest` wrappers) and env.sh
_BIN_DIR = f"{_OPT_DIR}/bin"
_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
_SHELL = ("/bin/bash", "--noprofile", "--norc")
# The shell dies with the process that holds the sandbox (unshare's or bwrap's outer process, itself
# tied to the Python that started it): the parent-death signal unshare --kill-child and bwrap
# --die-with-parent set is cleared when the shell's uid is dropped (setpriv --reuid), and a shell busy
# with a command (it reads no EOF then) would outlive a killed trainer, eval or validate. Set by the
# shell's last exec, after every change of credentials.
_DIE_WITH_PARENT = ("setpriv", "--pdeathsig", "KILL", "--")


@dataclass(frozen=True)
class LocalSandboxConfig:
    """Options of :class:`LocalSandbox` (all validated; a bad value raises ``ValueError``)."""

    isolation: Isolation = "auto"
    """``"bwrap"``, ``"unshare"``, or ``"auto"``: bubblewrap if it works here, else unshare."""
    workdir: str = "/workspace"
    """Absolute path of the work dir inside the sandbox (a task's ``Task.runtime.workdir`` wins)."""
    timeout_s: float = 30.0
    """Default wall-clock limit of one shell command, in seconds."""
    output_limit_bytes: int = 100_000
    """Output kept per command: the first and last halves, with a marker where bytes were dropped."""
    test_output_limit_bytes: int = 64 << 20
    """Output kept when running the tests: the whole log that the verdict parses and records keep (beyond
    it, head and tail, and the record says ``test_output_complete: false``); the agent sees it clipped to
    ``output_limit_bytes`` like any output."""
    cpu_time_s: int = 600
    """RLIMIT_CPU of every sandboxed process, in CPU seconds."""
    memory_bytes: int = 4 << 30
    """RLIMIT_AS (address space) of every sandboxed process."""
    max_processes: int = 256
    """RLIMIT_NPROC: processes (and threads) alive at once in this sandbox."""
    file_size_bytes: int = 256 << 20
    """RLIMIT_FSIZE: the largest file a sandboxed process may write."""
    tmpfs_bytes: int = 256 << 20
    """Size of the private ``/tmp``."""
    sandbox_uid: int = 65534
    """Unprivileged uid (and gid) the shell runs as when compactrl runs as root."""
    python: str | None = None
    """Interpreter behind ``python``/``python3``/``pytest`` inside (default: ``sys.executable``)."""
    tmp_root: str | None = None
    """Host directory for the private session dirs (default: the system temp dir)."""
    startup_timeout_s: float = 20.0
    """How long a fresh sandbox may take to answer before :class:`SandboxError`."""
    pytest_plugin_autoload: bool = False
    """Let pytest load every plugin installed next to ``python`` (development environments often
    hold hypothesis & co., ~2 s per run). Off by default, which also matches the docker image."""
    ro_binds: tuple[str, ...] = ()
    """Extra host directories mounted read-only at the same paths (an environment's data, a
    shared wheel or model cache); ``python``'s prefix is mounted without being listed."""
    writable_paths: tuple[str, ...] = ()
    """Absolute folders outside the work dir that get a private writable tmpfs each (``/root``,
    ``/logs``: where a task image lets a solution write); a task's ``Task.runtime.writable_paths``
    adds to them. Not ``/`` nor under the system folders, ``/proc``, ``/dev``, ``/tmp``."""
    writable_bytes: int = 256 << 20
    """Size of each tmpfs of ``writable_paths``."""
    keep_background: bool = False
    """Keep the processes a command leaves in the background running after it ends (servers the
    tests talk to); by default every one is killed when its command ends."""
    host_toolchains: bool = True
    """Mount the host's toolchains that live outside the system folders (rustup's ``cargo``, a Go
    outside ``/usr``) read-only and put them on PATH (:func:`host_toolchains`)."""
    root_layer: str | None = None
    """A host folder whose subfolders named as system folders (``usr/``, ``etc/``) lie over those
    folders inside (overlayfs): the files a task's image adds, changes or removes there (removals as
    overlayfs whiteouts). Those folders are writable in the episode (a private upper layer in the
    session dir, gone at close), as far as the layer's owners allow: a prepared layer belongs to the
    sandbox's uid, so the shell may change what the image's steps put there (the image's root could).
    A task's prepared state brings its own (``<Task.runtime.state>/layer``). Needs root; such a sandbox
    isolates with unshare (bubblewrap 0.8 has no overlays)."""
    root_layer_writable: bool = False
    """Prepare only: the shell runs as root, as an image's ``RUN`` steps do, and what it writes under
    the system folders goes into ``root_layer`` (the overlays' upper layer); still no network."""

    def __post_init__(self) -> None:
        if self.isolation not in ("auto", "bwrap", "unshare"):
            raise ValueError(f"isolation must be 'auto', 'bwrap' or 'unshare', got {self.isolation!r}")
        if not self.workdir.startswith("/") or self.workdir.rstrip("/") in ("", "/tmp", "/proc", "/dev"):
            raise ValueError(f"workdir must be an absolute path other than /, /tmp, /proc, /dev; got {self.workdir!r}")
        for name in ("timeout_s", "startup_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("output_limit_bytes", "test_output_limit_bytes", "cpu_time_s", "memory_bytes",
                     "max_processes", "file_size_bytes", "tmpfs_bytes", "writable_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.max_processes < 8:
            raise ValueError(f"max_processes must be >= 8 (the shell needs a few), got {self.max_processes}")
        if not isinstance(self.sandbox_uid, int) or self.sandbox_uid <= 0:
            raise ValueError(f"sandbox_uid must be a positive int (not root), got {self.sandbox_uid!r}")
        bad = [p for p in self.ro_binds if not (isinstance(p, str) and os.path.isabs(p) and os.path.isdir(p))]
        if isinstance(self.ro_binds, str) or bad:
            raise ValueError(f"ro_binds must be a list of absolute paths of existing directories, got {self.ro_binds!r}")
        if self.root_layer is not None and not (isinstance(self.root_layer, str) and os.path.isabs(self.root_layer)
                                                and os.path.isdir(self.root_layer)):
            raise ValueError(f"root_layer must be the absolute path of an existing directory, got {self.root_layer!r}")
        if self.root_layer_writable and self.root_layer is None:
            raise ValueError("root_layer_writable needs root_layer (the folder that receives the writes)")
        bad = [p for p in self.writable_paths if _writable_problem(p)]
        if isinstance(self.writable_paths, str) or bad:
            raise ValueError(f"writable_paths must be absolute folders outside /, the system folders, /proc, /dev "
                             f"and /tmp; got {self.writable_paths!r}")


_NOT_WRITABLE = tuple("/" + d for d in (*_SYSTEM_DIRS, "proc", "dev", "tmp", "opt/compactrl"))


def _writable_problem(path) -> bool:
    """True when ``path`` cannot be a private writable folder (relative, the root, or a system folder)."""
    if not isinstance(path, str) or not path.startswith("/") or posixpath.normpath(path) == "/":
        return True
    path = posixpath.normpath(path)
    return any(path == d or path.startswith(d + "/") for d in _NOT_WRITABLE)


# ---------------------------------------------------------------------------------- isolation
_probe_cache: dict[str, str | None] = {}


def _drop_privileges(uid: int) -> list[str]:
    if os.geteuid() != 0:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]


def _probe(kind: str, uid: int) -> str | None:
    """None when ``kind`` can build a sandbox here, else why not (cached per process)."""
    key = f"{kind}:{uid}"
    if key not in _probe_cache:
        tool = "bwrap" if kind == "bwrap" else "unshare"
        if shutil.which(tool) is None:
            _probe_cache[key] = f"{tool} is not installed"
        else:
            if kind == "bwrap":
                argv = [*_drop_privileges(uid), "bwrap", "--unshare-user", "--unshare-net", "--unshare-pid",
                        "--ro-bind", "/", "/", "true"]
            else:
                argv = ["unshare", *([] if os.geteuid() == 0 else ["--map-root-user"]),
                        "--mount", "--net", "--pid", "--fork", "true"]
            try:
                res = subprocess.run(argv, capture_output=True, timeout=20)
                _probe_cache[key] = None if res.returncode == 0 else (
                    f"{' '.join(argv)} failed: {res.stderr.decode(errors='replace').strip()[:300]}")
            except (OSError, subprocess.TimeoutExpired) as e:
                _probe_cache[key] = f"{tool} failed to start: {e}"
    return _probe_cache[key]


def choose_isolation(requested: Isolation, uid: int = 65534) -> str:
    """The isolation tool to use; ``SandboxError`` (saying how to fix it) when none works."""
    order = ["bwrap", "unshare"] if requested == "auto" else [requested]
    reasons = []
    for kind in order:
        why = _probe(kind, uid)
        if why is None:
            if requested == "auto" and kind != "bwrap":
                log.warning("bubblewrap unusable (%s); isolating with unshare instead", reasons[0])
            return kind
        reasons.append(why)
    raise SandboxError(
        "no working isolation tool for the local sandbox: " + "; ".join(reasons)
        + ". Install bubblewrap (apt-get install bubblewrap) or util-linux's unshare, "
        "and allow user namespaces (sysctl user.max_user_namespaces > 0)."
    )


def _root_layer_isolation() -> str:
    """The isolation of a sandbox with a root layer: unshare as root (it mounts the overlays)."""
    if os.geteuid() != 0:
        raise SandboxError("a root layer (a task whose image changes system files) needs compactrl to run as root "
                           "(overlay mounts over /usr and /etc)")
    return choose_isolation("unshare")


def _host_binds(python: str, extra: tuple[str, ...] = ()) -> tuple[list[tuple[str, str]], list[str]]:
    """(symlinks as (target, path), read-only bind paths) that make up the sandbox's root."""
    links, binds = [], []
    for name in _SYSTEM_DIRS:
        path = f"/{name}"
        if os.path.islink(path):
            links.append((os.readlink(path), path))
        elif os.path.isdir(path):
            binds.append(path)
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  os.path.dirname(os.path.realpath(python)), os.path.dirname(os.path.dirname(python)),
                  *_interpreter_prefixes(python), *extra}
    for cand in sorted(os.path.realpath(c) for c in candidates):
        if cand in ("/", "") or not os.path.isdir(cand):
            continue
        covered = [b for b in binds if cand == b or cand.startswith(b.rstrip("/") + "/")]
        if not covered:
            binds.append(cand)
    return links, binds


def _interpreter_prefixes(python: str) -> list[str]:
    """Prefixes ``python`` needs to start (its ``lib/`` holds ``libpython`` and the stdlib): its
    own (``<prefix>/bin/python``, links resolved) and, for a venv, its base interpreter's (the
    ``home`` of ``pyvenv.cfg``), so a venv made by another interpreter (pyenv, uv, conda) starts."""
    prefixes = [os.path.dirname(os.path.dirname(os.path.realpath(python)))]
    cfg = os.path.join(os.path.dirname(os.path.dirname(python)), "pyvenv.cfg")
    try:
        with open(cfg, encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    prefixes.append(os.path.dirname(os.path.realpath(value.strip())))
    except OSError:
        pass
    return prefixes


# The shell of a task whose reference solution manages the image's users (``Task.runtime.image_root``): root
# in a user namespace of its own, made here because unshare(1) leaves multi-range maps to newuidmap, which
# wants /etc/subuid entries. Run as the host's root inside the sandbox's other namespaces: a child enters a
# new user namespace; this process (privileged in the parent namespace) maps the child's root to the
# sandbox's uid and its uids/gids 1-65535 to a range this machine does not use; the child becomes root
# there and runs the shell, dying with this process; this process reaps every orphan (it is PID 1).
_IMAGE_ROOT_LAUNCHER = """
import ctypes, os, sys
uid, base, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(ready_r); os.close(go_w)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000) != 0:
        os.write(2, b"unshare(CLONE_NEWUSER) failed\\n"); os._exit(125)
    os.write(ready_w, b"1"); os.close(ready_w)
    if os.read(go_r, 1) != b"1":
        os._exit(125)
    os.setgroups([]); os.setresgid(0, 0, 0); os.setresuid(0, 0, 0)
    libc.prctl(1, 9)  # PR_SET_PDEATHSIG SIGKILL, after the credentials change that clears it
    os.execv(argv[0], argv)
os.close(ready_w); os.close(go_r)
if os.read(ready_r, 1) != b"1":
    sys.exit(125)
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{name}", "w") as fh:
        fh.write(f"0 {uid} 1\\n1 {base} 65535\\n")
os.write(go_w, b"1")
while True:
    done, status = os.wait()
    if done == pid:
        sys.exit(os.waitstatus_to_exitcode(status))
"""
# the host's uids and gids that the image's users (1-65535) map to: far above any this machine hands out
IMAGE_UID_BASE = 1 << 30


def _inner_userns() -> list[str]:
    """``unshare`` options of the shell's own user namespace. The shell's uid and gid are mapped to
    themselves: with an empty map they read as unmapped, and ``posix_spawn`` with
    ``POSIX_SPAWN_RESETIDS`` (GNU make runs every recipe line so) fails with EINVAL, which made
    every ``make`` recipe, recursive ones included, fail with ``make: make: Invalid argument``."""
    if "map" not in _probe_cache:
        try:
            res = subprocess.run(["unshare", "--user", "--map-current-user", "true"], capture_output=True, timeout=20)
            _probe_cache["map"] = "ok" if res.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            _probe_cache["map"] = None
    return ["--user", "--map-current-user"] if _probe_cache["map"] else ["--user"]


def host_toolchains() -> tuple[list[str], list[str], dict[str, str]]:
    """``(read-only binds, PATH entries, environment)`` that make the host's toolchains living outside
    the system folders usable inside: rustup's ``cargo``/``rustc`` (``~/.cargo``, ``~/.rustup``) and a
    Go outside ``/usr``. Caches the tools write go to the private ``/tmp``."""
    binds: list[str] = []
    path: list[str] = []
    env: dict[str, str] = {}
    home = os.path.expanduser("~")
    cargo_home = os.environ.get("CARGO_HOME") or os.path.join(home, ".cargo")
    rustup_home = os.environ.get("RUSTUP_HOME") or os.path.join(home, ".rustup")
    if os.path.isfile(os.path.join(cargo_home, "bin", "cargo")) and os.path.isdir(os.path.join(rustup_home, "toolchains")):
        binds += [os.path.join(cargo_home, "bin"), rustup_home]
        path.append(os.path.join(cargo_home, "bin"))
        env |= {"RUSTUP_HOME": rustup_home, "CARGO_HOME": "/tmp/.cargo"}
    go = shutil.which("go") or _versioned_go()
    if go:
        goroot = os.path.dirname(os.path.dirname(os.path.realpath(go)))
        if not any(goroot == f"/{d}" or goroot.startswith(f"/{d}/") for d in _SYSTEM_DIRS):
            binds.append(goroot)
        if os.path.dirname(go) not in BASE_PATH_DIRS:
            path.append(os.path.join(goroot, "bin"))
        env |= {"GOPATH": "/tmp/go", "GOCACHE": "/tmp/.gocache", "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    return [b for b in binds if os.path.isdir(b)], path, env


BASE_PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def _versioned_go() -> str | None:
    """The newest Debian ``golang-1.NN-go`` (``/usr/lib/go-1.NN/bin/go``, e.g. from bookworm-backports)
    when no ``go`` is on PATH: such packages install no ``/usr/bin/go``."""
    found = []
    for name in os.listdir("/usr/lib") if os.path.isdir("/usr/lib") else ():
        parts = name.split("-", 1)
        if parts[0] == "go" and len(parts) == 2 and os.path.isfile(f"/usr/lib/{name}/bin/go"):
            try:
                found.append((tuple(int(x) for x in parts[1].split(".")), f"/usr/lib/{name}/bin/go"))
            except ValueError:
                continue
    return max(found)[1] if found else None


def _ns_processes(ns: str) -> list[int]:
    """Host pids of the live processes in the pid namespace ``ns`` (``"pid:[...]"``).

    Zombies are left out: they are dead, and once their parent is gone only the host's init reaps
    them, which some inits do only every few seconds.
    """
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") == ns and not _is_zombie(entry):
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def _is_zombie(pid: str) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"Z", b"X")


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
            if int(stat[stat.rindex(b")") + 2 :].split()[1]) == pid:
                out.append(int(entry))
    return out


class LocalSandbox:
    """One episode's isolated bash on this machine. See the module docstring.

    ``LocalSandbox(timeout_s=10, max_processes=64)`` or ``LocalSandbox(config=LocalSandboxConfig(...))``.
    After :meth:`start`: ``isolation`` ("bwrap" or "unshare"), ``session_dir`` (host temp dir),
    ``pid_namespace`` (for checking that nothing outlives :meth:`close`), ``restarts``.
    """

    backend = "local"

    def __init__(self, *, config: LocalSandboxConfig | None = None, **options) -> None:
        self.config: LocalSandboxConfig = make_config(LocalSandboxConfig, config, options)
        self.isolation: str | None = None
        self.session_dir: str | None = None
        self.pid_namespace: str | None = None
        self._ns_fd: int | None = None
        self.restarts = 0
        self.task: Task | None = None
        self._proc: subprocess.Popen | None = None
        self._shell_pid: int | None = None
        self._fs: HostWorkDir | None = None
        self._workdir = self.config.workdir
        self._python = self.config.python or sys.executable
        self._rest = b""
        self._state: str | None = None

    # ------------------------------------------------------------------------------ lifecycle
    def start(self, task: Task) -> None:
        self.close()
        cfg = self.config
        self.isolation = choose_isolation(cfg.isolation, cfg.sandbox_uid)
        self.task = task
        self._workdir = str(task.runtime.workdir or cfg.workdir).rstrip("/") or cfg.workdir
        # a task that names its own interpreter (SWE-bench rows: a per-repository environment) runs
        # the wrappers with it and gets its prefix mounted; otherwise the configured one
        own = str(task.runtime.python or "")
        self._python = own if os.path.isabs(own) else (cfg.python or sys.executable)
        try:
            self._make_session_dir()
            tree = task.runtime.work_tree
            if tree:  # the tree a harness sees (modes, symlinks, what its install built), then the files
                copy_tree(str(tree), os.path.join(self.session_dir, "work"), self._files().owner)
            state = self._state = self._local_state(task)
            replayed = bool(state and os.path.isdir(os.path.join(state, "work")))
            # a replayed work dir is the task's files after its steps (`mv tool.py /usr/local/bin/` took one away)
            for path, content in ({} if replayed else task.files).items():
                self._files().write_bytes(work_rel(path), file_bytes(content))
            if replayed:  # a Dockerfile's replayed steps (a repository they made or cloned, .git and all)
                copy_tree(os.path.join(state, "work"), os.path.join(self.session_dir, "work"), self._files().owner,
                          skip=())
            self._launch()
            if state and os.path.isfile(os.path.join(state, "roots.tar")):  # ... and what they wrote outside
                res = self.exec(f"tar -C / --no-overwrite-dir -xf {shlex.quote(os.path.join(state, 'roots.tar'))} 2>&1",
                                timeout_s=max(60.0, cfg.timeout_s))
                if res.exit_code != 0:
                    raise SandboxError(f"restoring {state}/roots.tar failed ({res.exit_code}): {res.output[-1000:]}")
            if self._home() != self._workdir:  # `useradd -m` is the image's: its home is made here
                self.exec(f"mkdir -p {shlex.quote(self._home())}", timeout_s=max(60.0, cfg.timeout_s))
            for command in task.setup:
                res = self.exec(command, timeout_s=task.check.timeout_s)
                if res.exit_code != 0:
                    raise SandboxError(f"setup command {command!r} failed ({res.exit_code}): {res.output[-2000:]}")
        except BaseException:
            self.close()
            raise
        log.info("local sandbox for %s up (%s, %s)", task.id, self.isolation, self.session_dir)

    def _home(self) -> str:
        """The shell's HOME: the task's ``Task.runtime.home`` (a Terminal-Bench image's user's home: ``/root``,
        or ``/home/<USER>``) where it lies in one of the episode's writable folders, else the work dir."""
        home = str((self.task.runtime.home if self.task else None) or "")
        if posixpath.isabs(home) and any(home == p or home.startswith(p + "/") for p in self._writable()):
            return posixpath.normpath(home)
        return self._workdir

    def _shared_parents(self, dests: list[str]) -> list[str]:
        """The folders made inside a private writable folder to lead to a mount (``/root/.cache`` for a prepared
        state under ``/root/.cache/compactrl``, when ``HOME`` is ``/root``): writable by the shell, as the rest
        of that folder is (a tool's ``~/.cache/uv`` goes beside the mount), else they would be root's."""
        out: list[str] = []
        for root in self._writable():
            for dest in dests:
                if not dest.startswith(root + "/"):
                    continue
                parts = dest[len(root) + 1:].split("/")[:-1]
                out += [p for p in (root + "/" + "/".join(parts[:k]) for k in range(1, len(parts) + 1)) if p not in out]
        return out

    def _writable(self) -> list[str]:
        """The tmpfs folders of this episode: configured and the task's, minus the work dir's own."""
        wanted = [*self.config.writable_paths, *(self.task.runtime.writable_paths if self.task else ())]
        out: list[str] = []
        for path in sorted({posixpath.normpath(p) for p in wanted if isinstance(p, str)}):
            if _writable_problem(path):
                log.warning("writable path %r ignored (a system folder or not absolute)", path)
            elif not (path == self._workdir or path.startswith(self._workdir + "/")
                      or any(path.startswith(o + "/") for o in out)):
                out.append(path)
        return out

    def _ro_binds(self) -> tuple[str, ...]:
        tools = host_toolchains()[0] if self.config.host_toolchains else []
        # a task's own read-only folders (``Task.runtime.ro_binds``: a toolchain its loader fetched at prepare)
        own = [p for p in (self.task.runtime.ro_binds if self.task else ())
               if isinstance(p, str) and os.path.isabs(p) and os.path.isdir(p)]
        return (*self.config.ro_binds, *tools, *own, *((self._state,) if self._state else ()))

    def _local_state(self, task: Task) -> str | None:
        """The prepared state the task starts from (``Task.runtime.state``), which :func:`compactrl.task.prepared`
        sets before the episode from the task's ``Task.build``. The sandbox never prepares one itself: it
        starts what the task describes, and a build that was not prepared, or cannot be (``Task.build.error``:
        a step only the image can run), is a :class:`SandboxError` naming the task."""
        state, build = task.runtime.state, task.build
        if state or build is None or (build.plan is None and not build.error):
            return str(state) if state else None
        if build.error:
            raise SandboxError(f"task {task.id}: {build.error}")
        raise SandboxError(f"task {task.id}: its Dockerfile's steps are not prepared for the local backend "
                           "(Task.runtime.state): load it with TerminalBenchConfig(prepare=True), or start it "
                           "through CodeRepoEnv/TerminalEnv, which prepare it at reset")

    def _keep_background(self) -> bool:
        """Whether what a command leaves running in the background survives it (a task's
        ``Task.runtime.keep_background``, as Terminal-Bench's tmux session keeps a server the agent
        started for the tests), or is killed when the command ends (the default)."""
        return self.config.keep_background or bool(self.task and self.task.runtime.keep_background)

    def _limit(self, name: str) -> int:
        """A resource limit: the task's own (``Task.runtime.limits``) or the configured one."""
        own = self.task.runtime.limits.get(name) if self.task else None
        return int(own) if isinstance(own, int) and own > 0 else getattr(self.config, name)

    def _make_session_dir(self) -> None:
        cfg = self.config
        self.session_dir = tempfile.mkdtemp(prefix=f"compactrl-local-{os.getpid()}-", dir=cfg.tmp_root)
        owner = (cfg.sandbox_uid, cfg.sandbox_uid) if os.geteuid() == 0 else None
        work, opt = os.path.join(self.session_dir, "work"), os.path.join(self.session_dir, "opt")
        bin_dir = os.path.join(opt, "bin")
        for d in (work, opt, bin_dir, os.path.join(self.session_dir, "root")):
            os.mkdir(d, 0o755)
        if owner is not None:
            os.chown(work, *owner)
        python = self._python
        wrappers = {"python": f'exec {python!r} "$@"', "python3": f'exec {python!r} "$@"',
                    "pytest": f'exec {python!r} -m pytest "$@"'}
        for name, body in wrappers.items():
            path = os.path.join(bin_dir, name)
            with open(path, "w") as f:
                f.write(f"#!/bin/sh\n{body}\n")
            os.chmod(path, 0o755)
        with open(os.path.join(opt, "env.sh"), "w") as f:
            f.write(_shell.ENV_FILE)
        os.chmod(os.path.join(opt, "env.sh"), 0o644)
        self._fs = HostWorkDir(work, owner)

    def _env(self) -> dict[str, str]:
        _, tool_path, tool_env = host_toolchains() if self.config.host_toolchains else ([], [], {})
        # a task's own environment (a Dockerfile's ENV), its PATH behind the wrappers'
        own = {k: str(v).replace("__SITE__", os.path.join(self._state or "", "site"))
               for k, v in (self.task.runtime.env if self.task else {}).items()}
        base = own.pop("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        env = {
            **tool_env,
            "PATH": ":".join([_BIN_DIR, base, *tool_path]),
            # HOME: the task image's user's (Terminal-Bench: the solution, the agent and the verifier share
            # it, as in the image), else the work dir, as the sim's shell has it (`cd ~` agrees); the locale too
            "HOME": self._home(), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
            # the shell programs start for their user (tmux's panes, `script`, editors' `:!`): the sandbox
            # user's own login shell is nologin (nobody), an image's root has bash
            "SHELL": "/bin/bash",
            **({} if self.config.pytest_plugin_autoload else {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}),
        }
        env.update({k: v for k, v in own.items() if k not in ("HOME", "BASH_ENV", "ENV")})
        return env

    def _launch(self) -> None:
        assert self.session_dir is not None
        if self._root_layer() and self.isolation != "unshare":
            self.isolation = _root_layer_isolation()
        argv, fds = self._bwrap_argv() if self.isolation == "bwrap" else self._unshare_argv()
        try:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=self._env(), pass_fds=fds, cwd="/", start_new_session=True,
            )
        except OSError as e:
            raise SandboxError(f"cannot start the {self.isolation} sandbox: {e}") from e
        finally:
            for fd in fds:
                os.close(fd)
        self._rest = b""
        self._handshake()

    def _limits_script(self) -> str:
        lim = self._limit
        return (
            f"ulimit -c 0 && ulimit -t {lim('cpu_time_s')} && ulimit -v {lim('memory_bytes') // 1024}"
            f" && ulimit -u {lim('max_processes')} && ulimit -f {max(1, lim('file_size_bytes') // 1024)}"
        )

    def _handshake(self) -> None:
        marker = _shell.new_marker()
        init = (
            f"cd -- {_shell.ansi_c_quote(self._workdir)} || exit 97\n"
            f"{self._limits_script()} || exit 98\n"
            f"{_shell.SAVE_INITIAL_STATE} || exit 99\n"
            "export -n $(compgen -e)\n"
            f"__crl_run() {{ {_shell.RUN_COMMAND}; __crl_rc=$?; {':' if self._keep_background() else _shell.KILL_LEFTOVERS};"
            f" printf '%s%d\\n' \"$1\" \"$__crl_rc\"; }}\n"
            # job notices ("Killed ...") would land in the next output: silence the shell itself
            "exec 2>/dev/null\n"
            f"printf '%s%d\\n' {marker} 0\n"
        )
        self._send(init)
        out = _shell.CappedOutput(self.config.output_limit_bytes)
        code = self._collect(marker, out, time.monotonic() + self.config.startup_timeout_s)
        if code is None:
            raise SandboxError(f"the {self.isolation} sandbox did not start in "
                               f"{self.config.startup_timeout_s}s: {out.text()[-2000:]}")
        self._shell_pid = self._find_shell()
        self._release_namespace()
        # Held open until the namespace is reaped: a namespace's id (its inode number) is reused once the
        # namespace is gone, and another sandbox's namespace that got it would be reaped in its place.
        self._ns_fd = os.open(f"/proc/{self._shell_pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
        self.pid_namespace = os.readlink(f"/proc/{self._shell_pid}/ns/pid")

    def _find_shell(self) -> int:
        """The sandbox's bash: the leaf of the (linear, at start-up) chain of processes below ours."""
        assert self._proc is not None
        pid = self._proc.pid
        while kids := _children(pid):
            pid = kids[0]
        return pid

    def _bwrap_argv(self) -> tuple[list[str], list[int]]:
        cfg, session = self.config, self.session_dir
        assert session is not None
        links, binds = _host_binds(self._python, self._ro_binds())
        if os.geteuid() == 0:
            # Privileged bwrap builds the root (it can reach e.g. a Python under /root), then the
            # shell drops to an unprivileged uid in a user namespace of its own, which makes
            # RLIMIT_NPROC count this sandbox's processes only (root is exempt from it).
            # bwrap's own init stays PID 1 here: the outer bwrap keeps uid 0 without capabilities, so
            # the kernel refuses its death signal to a shell of another uid; killing the init (same
            # uid) ends the whole pid namespace.
            head = ["bwrap", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            tail = [*_drop_privileges(cfg.sandbox_uid), "unshare", *_inner_userns(), "--", *_DIE_WITH_PARENT,
                    *_SHELL]
        else:
            head = ["bwrap", "--unshare-user", "--disable-userns", "--as-pid-1"]
            tail = [*_DIE_WITH_PARENT, *_SHELL]
        argv = [*head, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
                "--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent",
                "--new-session"]
        for target, path in links:
            argv += ["--symlink", target, path]
        argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(self._limit("tmpfs_bytes")),
                 "--tmpfs", "/tmp", "--perms", "1777", "--size", str(16 << 20), "--tmpfs", "/dev/shm"]  # as unshare's
        for path in self._writable():  # before the binds: a work dir or a bind may lie inside one
            argv += ["--perms", "1777", "--size", str(self._limit("writable_bytes")), "--tmpfs", path]
        made: set[str] = set()
        shared = set(self._shared_parents([*binds, self._workdir, _OPT_DIR]))
        for dest in [*binds, self._workdir, _OPT_DIR]:
            # bwrap would create missing parents as 0700 root: make them traversable for the shell
            parts = dest.strip("/").split("/")[:-1]
            for k in range(1, len(parts) + 1):
                parent = "/" + "/".join(parts[:k])
                if parent not in made and not any(parent == b or parent.startswith(b + "/") for b in binds):
                    made.add(parent)
                    argv += ["--perms", "1777" if parent in shared else "0755", "--dir", parent]
        for path in binds:
            argv += ["--ro-bind", path, path]
        argv += ["--bind", os.path.join(session, "work"), self._workdir,
                 "--ro-bind", os.path.join(session, "opt"), _OPT_DIR,
                 "--chdir", self._workdir, "--remount-ro", "/", *tail]
        return argv, []

    # ------------------------------------------------------------------------------ root layer
    def _root_layer(self) -> str | None:
        """The folder whose ``usr/``, ``etc/``... lie over the system folders: the configured one, or
        the ``layer/`` of the task's prepared state (a Dockerfile's steps that changed system files)."""
        if self.config.root_layer:
            return self.config.root_layer
        layer = os.path.join(self._state, "layer") if self._state else None
        return layer if layer and os.path.isdir(layer) else None

    def _image_root(self) -> bool:
        """Whether the shell is root in a user namespace of its own (``Task.runtime.image_root``: a reference
        solution that adds users), which needs a root layer and compactrl running as root."""
        return bool(self.task and self.task.runtime.image_root and self._root_layer() and os.geteuid() == 0)

    def _root_layer_mounts(self, binds: list[str]) -> list[tuple[str, str]]:
        """``[(system folder, mount line)]`` of the unshare script: an overlay of the layer's folder of
        that name over the host's with a private upper layer, or (prepare) the layer's folder as upper."""
        layer = self._root_layer()
        if not layer:
            return []
        q, out = shlex.quote, []
        for path in binds:
            name = path.strip("/")
            if name not in _SYSTEM_DIRS:
                continue
            upper = os.path.join(layer, name)
            if self.config.root_layer_writable:
                work = os.path.join(layer, ".work", name)
                os.makedirs(upper, exist_ok=True)
                os.makedirs(work, exist_ok=True)
                opts = f"lowerdir={path},upperdir={upper},workdir={work}"
            elif os.path.isdir(upper) and os.listdir(upper):
                assert self.session_dir is not None
                mine, work = (os.path.join(self.session_dir, "layer", kind, name) for kind in ("upper", "work"))
                os.makedirs(mine)
                os.makedirs(work)
                st = os.stat(upper)  # the merged folder's owner and mode are its upper layer's
                os.chown(mine, st.st_uid, st.st_gid)
                os.chmod(mine, st.st_mode & 0o7777)
                opts = f"lowerdir={upper}:{path},upperdir={mine},workdir={work}"
            else:
                continue
            out.append((path, f'mkdir -p "$R"{q(path)}; mount -t overlay compactrl-layer -o {q(opts)} "$R"{q(path)}'))
        return out

    def _unshare_argv(self) -> tuple[list[str], list[int]]:
        cfg, session = self.config, self.session_dir
        assert session is not None
        links, binds = _host_binds(self._python, self._ro_binds())
        q = shlex.quote  # the script runs under /bin/sh
        root = os.path.join(session, "root")
        lines = [
            "set -e", f"R={q(root)}",
            'mount -t tmpfs -o mode=755,size=4m compactrl-root "$R"',
        ]
        for target, path in links:
            lines.append(f'ln -s {q(target)} "$R"{q(path)}')
        lines += [
            'mkdir -p "$R/proc" "$R/dev" "$R/tmp"', 'mount -t proc proc "$R/proc"',
            f'mount -t tmpfs -o mode=1777,size={self._limit("tmpfs_bytes")} tmpfs "$R/tmp"',
            'mount -t tmpfs -o mode=755,size=1m dev "$R/dev"',
            'for d in null zero full random urandom tty; do touch "$R/dev/$d";'
            ' mount --bind "/dev/$d" "$R/dev/$d"; done',
            'ln -s /proc/self/fd "$R/dev/fd"; ln -s /proc/self/fd/0 "$R/dev/stdin"',
            'ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"',
            'mkdir -p "$R/dev/shm"; mount -t tmpfs -o mode=1777,size=16m shm "$R/dev/shm"',
            # pseudo-terminals of its own (tmux's panes, `script`), as bubblewrap's --dev makes them
            'mkdir -p "$R/dev/pts"; mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$R/dev/pts"'
            ' && ln -s pts/ptmx "$R/dev/ptmx"',
        ]
        for path in self._writable():
            lines.append(f'mkdir -p "$R"{q(path)}; mount -t tmpfs -o mode=1777,size={self._limit("writable_bytes")} '
                         f'tmpfs "$R"{q(path)}')
        layered = self._root_layer_mounts(binds)
        lines += [line for _path, line in layered]
        mounts = [(p, p, True) for p in binds if p not in dict(layered)]
        mounts += [(os.path.join(session, "work"), self._workdir, False),
                   (os.path.join(session, "opt"), _OPT_DIR, True)]
        for src, dst, ro in mounts:
            lines.append(f'mkdir -p "$R"{q(dst)}; mount --bind {q(src)} "$R"{q(dst)}')
            if ro:
                lines.append(f'mount -o remount,bind,ro "$R"{q(dst)}')
        for parent in self._shared_parents([dst for _src, dst, _ro in mounts]):
            lines.append(f'chmod 1777 "$R"{q(parent)}')
        drop = " ".join(_drop_privileges(cfg.sandbox_uid))
        lines += [
            "hostname sandbox",
            "ip link set lo up 2>/dev/null || true",  # as bubblewrap does (needs iproute2)
            'cd "$R"; mkdir .old; pivot_root . .old; umount -l /.old; rmdir /.old',
            "mount -o remount,ro /",
            f"cd -- {q(self._workdir)}",
            f"exec {drop} unshare {' '.join(_inner_userns())} -- {' '.join((*_DIE_WITH_PARENT, *_SHELL))}",
        ]
        if self.config.root_layer_writable:  # prepare: the image's RUN steps run as root
            lines[-1] = f"exec setpriv --pdeathsig KILL -- {' '.join(_SHELL)}"
        elif self._image_root():  # the image's root, with the users its reference solution adds
            lines[-1] = (f"exec {q(self._python)} -I -S -c {q(_IMAGE_ROOT_LAUNCHER)} {cfg.sandbox_uid} {IMAGE_UID_BASE} "
                         f"{' '.join(_SHELL)}")
        user = [] if os.geteuid() == 0 else ["--map-root-user"]
        argv = ["setpriv", "--pdeathsig", "KILL", "unshare", *user, "--mount", "--net", "--pid", "--ipc",
                "--uts", "--kill-child", "--propagation", "private", "--", "/bin/sh", "-c", "\n".join(lines)]
        return argv, []

    def close(self) -> None:
        """Kill every sandboxed process, remove the session dir. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            for pid in (self._shell_pid, proc.pid):
                if pid is not None:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.error("sandbox process %d did not exit after SIGKILL", proc.pid)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
            self._reap_namespace()
        self._release_namespace()
        self._shell_pid = None
        if self._fs is not None:
            self._fs.close()
            self._fs = None
        if self.session_dir is not None:
            _rmtree(self.session_dir)
            self.session_dir = None

    def _release_namespace(self) -> None:
        if self._ns_fd is not None:
            os.close(self._ns_fd)
            self._ns_fd = None

    def _reap_namespace(self, wait_s: float = 5.0) -> None:
        """Wait until the pid namespace is empty (killing stragglers), so close() leaves nothing."""
        if self.pid_namespace is None:
            return
        deadline = time.monotonic() + wait_s
        while pids := _ns_processes(self.pid_namespace):
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                log.error("processes %s of a closed sandbox are still alive", pids)
                return
            time.sleep(0.01)

    def __del__(self) -> None:  # a forgotten close() must not leak processes or temp dirs
        try:
            self.close()
        except Exception:
            pass

    # --------------------------------------------------------------------------------- shell
    def _send(self, text: str) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(text.encode("utf-8", errors="surrogatepass"))
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise SandboxError(f"the sandbox shell is gone ({e})") from e

    def _collect(self, marker: str, out: _shell.CappedOutput, deadline: float) -> int | None:
        """Read until ``marker``'s line; its exit code, or None at ``deadline``.

        Raises :class:`SandboxError` when the shell's output ends (the sandbox died).
        """
        assert self._proc is not None and self._proc.stdout is not None
        scanner = _shell.MarkerScanner(marker.encode(), out)
        rest, self._rest = self._rest, b""
        if rest and scanner.feed(rest):
            self._rest = scanner.rest
            return scanner.exit_code
        fd = self._proc.stdout.fileno()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                scanner.flush()
                code = self._proc.wait()
                raise SandboxError(f"the sandbox shell exited unexpectedly (status {code}); "
                                   f"last output: {out.text()[-500:]!r}")
            if scanner.feed(chunk):
                self._rest = scanner.rest
                return scanner.exit_code

    def _alive(self) -> None:
        if self._proc is None:
            raise SandboxError("the local sandbox is not started (call start(task) first)")
        code = self._proc.poll()
        if code is not None:
            raise SandboxError(f"the sandbox shell died (status {code}); the episode cannot continue")

    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        return self._run(command, timeout_s or command_timeout(self.task, self.config.timeout_s),
                         self.config.output_limit_bytes)

    def _run(self, command: str, timeout_s: float, limit: int) -> ExecResult:
        self._alive()
        marker = _shell.new_marker()
        self._send(f"__crl_cmd={_shell.ansi_c_quote(command)}; __crl_run {marker}\n")
        out = _shell.CappedOutput(limit)
        code = self._collect(marker, out, time.monotonic() + timeout_s)
        if code is not None:
            return ExecResult(out.text(), code, truncated=out.truncated)
        self._kill_command()
        code = self._collect(marker, out, time.monotonic() + 5.0)
        note = f"\n[timed out after {timeout_s:g}s: the command and every process it started were killed]"
        if code is None:  # the shell itself is wedged: replace it, keeping the files
            self._restart()
            note += "\n[the shell was restarted: cwd, environment and /tmp were reset]"
        return ExecResult(out.text() + note, _shell.TIMEOUT_EXIT_CODE, timed_out=True, truncated=out.truncated)

    def _kill_command(self) -> None:
        """Kill the running command's subshell; the shell then kills what it left behind."""
        if self._shell_pid is None:
            return
        for pid in _children(self._shell_pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _restart(self) -> None:
        self.restarts += 1
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        self._reap_namespace()
        log.warning("local sandbox shell restarted after a wedged command (%s)", self.session_dir)
        self._launch()

    # ---------------------------------------------------------------------------------- files
    def _files(self) -> HostWorkDir:
        if self._fs is None:
            raise SandboxError("the local sandbox is not started (call start(task) first)")
        return self._fs

    def read_file(self, path: str) -> str:
        rel = work_rel(path)
        if not rel:
            raise is_a_directory(path)
        try:
            data = self._files().read_bytes(rel)
        except (FileNotFoundError, NotADirectoryError):
            raise not_found(path) from None
        except IsADirectoryError:
            raise is_a_directory(path) from None
        return data.decode("utf-8", errors="replace")

    def write_file(self, path: str, content: str) -> None:
        rel = work_rel(path)
        if not rel:
            raise is_a_directory(path)
        fs = self._files()
        try:
            fs.write_bytes(rel, content.encode("utf-8", errors="surrogatepass"))
        except IsADirectoryError:
            raise is_a_directory(path) from None
        except NotADirectoryError:
            raise not_a_directory(fs.file_prefix(rel) or rel) from None

    def list_files(self) -> list[str]:
        return self._files().list_files()

    # ---------------------------------------------------------------------------------- tests
    def run_tests(self, check: Check | None = None) -> TestReport:
        if self.task is None:
            raise SandboxError("the local sandbox is not started (call start(task) first)")
        check = check or self.task.check
        try:
            before = self._install_hidden(check.hidden_files)
        except OSError as e:  # the agent put something in the way (a directory, a symlink out)
            return hidden_files_blocked(e)
        watch = _FillWatch(self._shell_pid, ["/tmp", *self._writable()])
        try:
            with watch:
                res = self._run(check.command, check.timeout_s, self.config.test_output_limit_bytes)
        finally:
            self._restore_hidden(hidden_restore_plan(self.task, before))
        report = report_from_run(check, res, self.config.output_limit_bytes)
        hit = self.limit_hit(res)
        if hit is None and not report.success and watch.full:
            # the error itself may be in no output the tests print (a subprocess's stderr they do not show)
            hit = (f"private tmpfs full: {watch.full} was full while the tests ran (/tmp "
                   f"{_size(self._limit('tmpfs_bytes'))}: tmpfs_bytes; other writable folders "
                   f"{_size(self._limit('writable_bytes'))} each: writable_bytes)")
        if hit:
            report = dataclasses.replace(report, limit_hit=hit, log_tail=f"{report.log_tail}\n[sandbox limit hit: {hit}]")
        return report

    def limit_hit(self, res: ExecResult) -> str | None:
        """The sandbox resource limit a run hit, named with its value and setting, read from the
        signal that ended it (exit 128 + SIGXFSZ/SIGXCPU) or the error the limit makes (EFBIG "File
        too large", ENOMEM, EAGAIN on fork, ENOSPC on a private tmpfs); None when none shows."""
        out, code = res.output, res.exit_code
        if code == 128 + signal.SIGXFSZ or "File too large" in out or "[Errno 27]" in out:
            return f"file size limit {_size(self._limit('file_size_bytes'))} (RLIMIT_FSIZE, file_size_bytes)"
        if code == 128 + signal.SIGXCPU or "CPU time limit exceeded" in out:
            return f"CPU time limit {self._limit('cpu_time_s')} s per process (RLIMIT_CPU, cpu_time_s)"
        if any(m in out for m in _MEMORY_ERRORS):
            return f"memory limit {_size(self._limit('memory_bytes'))} of address space (RLIMIT_AS, memory_bytes)"
        if any(m in out for m in _PROCESS_ERRORS):
            return f"process limit {self._limit('max_processes')} (RLIMIT_NPROC, max_processes)"
        if "No space left on device" in out or "[Errno 28]" in out:
            return (f"private tmpfs full: /tmp {_size(self._limit('tmpfs_bytes'))} (tmpfs_bytes), other writable "
                    f"folders {_size(self._limit('writable_bytes'))} each (writable_bytes)")
        return None

    def _install_hidden(self, hidden: dict[str, str]) -> dict[str, bytes | None]:
        """Write the hidden files; return what they replaced (None: did not exist)."""
        fs, before = self._files(), {}
        for path in hidden:
            rel = work_rel(path)
            try:
                before[rel] = fs.read_bytes(rel)
            except FileNotFoundError:
                before[rel] = None
        written: dict[str, bytes | None] = {}
        try:
            for path, content in hidden.items():
                rel = work_rel(path)
                written[rel] = before[rel]
                fs.write_bytes(rel, file_bytes(content))
        except OSError:
            self._restore_hidden(written)
            raise
        return before

    def _restore_hidden(self, before: dict[str, bytes | None]) -> None:
        fs = self._files()
        for rel, data in before.items():
            try:
                if data is None:
                    fs.remove(rel)
                else:
                    fs.write_bytes(rel, data)
            except OSError as e:  # the tests may have removed or replaced it; nothing to restore then
                log.debug("could not restore hidden file %s: %s", rel, e)


class _FillWatch:
    """While a command runs, samples how full the sandbox's private tmpfs folders are (through the shell's
    ``/proc/<pid>/root``, every ``interval_s``); ``full`` is the first one seen full (99% of its blocks
    used), else None. A sample can miss a folder that was full only for a moment (filled, then removed)."""

    def __init__(self, pid: int | None, paths: list[str], interval_s: float = 0.01) -> None:
        self.paths = paths if pid is not None else []
        self.pid, self.interval_s, self.full = pid, interval_s, None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _FillWatch:
        if self.paths:
            self._thread = threading.Thread(target=self._sample, name="sandbox-fill-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s) and self.full is None:
            for path in self.paths:
                try:
                    st = os.statvfs(f"/proc/{self.pid}/root{path}")
                except OSError:
                    continue
                if st.f_blocks and st.f_bavail * 100 <= st.f_blocks:
                    self.full = path
                    return


_MEMORY_ERRORS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory", "[Errno 12]",
                  "memory allocation of", "Could not reserve enough space", "failed to reserve")
_PROCESS_ERRORS = ("fork: retry", "fork: Resource temporarily unavailable", "can't start new thread",
                   "BlockingIOError: [Errno 11]", "pthread_create failed", "Resource temporarily unavailable (os error 11)",
                   "unable to create native thread")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


def _rmtree(path: str) -> None:
    def fix(func, p, _exc):  # sandboxed code may leave dirs without write/exec permission
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix)
