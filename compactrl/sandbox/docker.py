"""``backend="docker"``: one container per episode, driven through the Docker SDK.

Works against Docker Engine and against Podman's Docker-compatible socket (``podman system
service``); the engine is chosen by ``base_url`` or, by default, ``DOCKER_HOST``. The container:

* runs the task's image (``task.docker_image``), the task's own image built from its Dockerfile
  (``Task.runtime.image_build``: built by the task set that loaded the task, reached through
  :func:`compactrl.task.built_image` with a :class:`DockerEngine`) or ``config.image``, kept alive by a
  small reaping ``/bin/sh`` loop as PID 1;
* has no network (``network_mode="none"``; ``network`` names another mode), memory / CPU /
  process-count limits, no capabilities and ``no-new-privileges``; when the work dir is filled from the task, the root file system is
  read-only and the work dir and ``/tmp`` are size-limited tmpfs mounts;
* carries labels naming its owner process, so containers of crashed episodes are removed later.

Files move in and out with ``put_archive`` / ``get_archive``; commands run with ``exec_run`` under
``timeout -s KILL``, with the same shell semantics as the local backend (see ``_shell.py``).
"""

from __future__ import annotations

import io
import logging
import os
import posixpath
import socket
import tarfile
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

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
from compactrl.sandbox.base import ExecResult, SandboxError, TestReport
from compactrl.task import Check, Task, built_image

log = logging.getLogger(__name__)

LABEL = "compactrl.sandbox"
"""Label on every container this backend creates; ``compactrl.owner`` holds ``host:pid``."""
DEFAULT_IMAGE = "compactrl-sandbox:latest"
GRADER_DIR = "/opt/compactrl/grader"
"""pytest (the version the harness installs for its test runs) and its dependencies, unpacked in a task's
image for its python3 but outside its site-packages: the agent's python does not see them; the tests of a
task graded with pytest (``Task.grading.mode``) get the folder on ``PYTHONPATH``, as the harness's own
test run has pytest (installed at test time, which needs a network the sandbox does not have)."""
GRADER_DEPS_DIR = "/opt/compactrl/grader-deps"
"""What a task's test scripts install at test time, installed when its image is built; on the tests'
``PYTHONPATH`` with :data:`GRADER_DIR`."""
GRADER_PYTHON_DIR = "/opt/compactrl/python"
"""A CPython for the tests of an image without ``python3``; its ``bin`` goes after the image's ``PATH``."""
_GO_MODE_SYMLINK = 1 << 27  # os.ModeSymlink in the engines' stat header
_ENV = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat",
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
# The driver of one command (argv: $1 = timeout, $2 = command, $3 = end marker): run it under
# timeout in an empty environment that ENV_FILE restores, kill what it left, report the code. The
# driver's own stderr (job notices such as "Killed") is dropped; the command's goes to stdout.
_DRIVER = (
    f'exec 2>/dev/null; timeout -s KILL "$1" env -i BASH_ENV={_shell.ENV_FILE_PATH} bash --noprofile --norc'
    f' -c "$2" </dev/null 2>&1; __crl_rc=$?; {_shell.KILL_LEFTOVERS}; printf \'%s%d\\n\' "$3" "$__crl_rc"'
)
# The same, leaving what the command started in the background running (a server for the tests).
_DRIVER_KEEP = _DRIVER.replace(_shell.KILL_LEFTOVERS, ":")
# PID 1 of the container: idles, and reaps the orphans that killed commands leave (a bare
# `sleep infinity` would collect zombies until the pids limit is reached).
_INIT = "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done"
# Checks a write target the way the local backend's kernel checks do: no escape through
# symlinks, no directory in the way, no file where a parent directory must be.
_WRITE_CHECK = (
    'p=$1; r=$(realpath -m -- "$p") || exit 13; case "$r/" in "$2"/*) ;; *) exit 13;; esac;'
    ' [ -d "$p" ] && exit 21; d=$(dirname -- "$p");'
    ' while [ "$d" != . ] && [ "$d" != / ]; do [ -e "$d" ] && [ ! -d "$d" ] && { printf %s "${d#"$2"/}"; exit 20; }; d=$(dirname -- "$d"); done;'
    " exit 0"
)


@dataclass(frozen=True)
class DockerSandboxConfig:
    """Options of :class:`DockerSandbox` (all validated; a bad value raises ``ValueError``)."""

    image: str = DEFAULT_IMAGE
    """Image for tasks without ``docker_image`` (``scripts/ci_docker.sh`` builds this one offline)."""
    base_url: str | None = None
    """Engine socket, e.g. ``unix:///run/podman/podman.sock``; None: ``DOCKER_HOST`` or the default."""
    workdir: str = "/workspace"
    """Work dir inside the container (a task's ``Task.runtime.workdir`` wins, e.g. ``/testbed``)."""
    timeout_s: float = 30.0
    """Default wall-clock limit of one shell command, in seconds."""
    output_limit_bytes: int = 100_000
    """Output kept per command: the first and last halves, with a marker where bytes were dropped."""
    test_output_limit_bytes: int = 64 << 20
    """Output kept when running the tests: the whole log that the verdict parses and records keep (beyond
    it, head and tail, and the record says ``test_output_complete: false``); the agent sees it clipped to
    ``output_limit_bytes`` like any output."""
    memory_bytes: int = 2 << 30
    """Memory limit of the container (swap included)."""
    cpus: float = 1.0
    """CPU quota of the container, in cores."""
    max_processes: int = 256
    """pids limit of the container (processes and threads)."""
    tmpfs_bytes: int = 256 << 20
    """Size of the container's ``/tmp``."""
    workdir_bytes: int = 512 << 20
    """Size of the work dir tmpfs (when the work dir is filled from the task, not from the image)."""
    read_only_root: bool | None = None
    """Read-only root file system; None: yes, unless the task's repo lives in the image (workdir set)."""
    drop_capabilities: bool | None = None
    """Drop every Linux capability (root in the container can then not chown, mount, ...). None:
    yes, except in a task image built from its Dockerfile, which keeps the engine's default set as
    the harness runs it (its solutions ``mkdir /solution``, ``chmod``, ``apt-get``... as root)."""
    user: str | None = None
    """User to run as (``uid[:gid]``); None: the image's default."""
    pull: bool = False
    """Pull a missing image (off: nothing downloads unless asked)."""
    engine_timeout_s: float = 120.0
    """Timeout of one engine API call that is not a command (create, archive, remove)."""
    reap_stale: bool = True
    """On start, remove labelled containers whose owner process on this host has died."""
    build_images: bool = True
    """Build (or reuse) a task's own image from ``Task.runtime.image_build`` (a Terminal-Bench
    task's Dockerfile and build context) when it names no ``docker_image``; cached by a content
    digest, so an unchanged task is built once per engine."""
    base_images: tuple[tuple[str, str], ...] = ()
    """Substitutes for base images (``FROM``) the engine lacks, as ``{"python:3.13-slim":
    "my-local-python:3.13"}`` or pairs: a build uses the substitute in their place."""
    base_families: bool = True
    """A base the engine lacks, not in ``base_images`` and not pulled, is replaced by its family's
    substitute (Terminal-Bench's base images: ``python:3.12-slim`` -> Debian 12 with
    CPython 3.12 in /usr/local, ``ubuntu:24.04`` -> an Ubuntu 24.04 root, ...), built on first use
    and cached in the engine; a base with no substitute is named with the reason."""
    build_network: str | None = None
    """Network mode of image builds (``"host"``, ``"none"``...; None: the engine's default). The
    running container's is ``network``."""
    network: str = "none"
    """Network mode of the running container: ``"none"`` (default: only a loopback of its own, nothing
    an agent does reaches out), or one the engine knows (``"bridge"``, ``"host"``, a network's name) to
    run as Terminal-Bench's harness does (its containers have the network: a reference solution that
    ``apt-get install``s nginx, a test script that ``pip install``s pytest)."""
    keep_background: bool = False
    """Leave what a command starts in the background running after it (a server the tests talk to),
    as Terminal-Bench's tmux session does; a task's ``Task.runtime.keep_background`` asks for it too.
    Off: the command's leftovers are killed when it ends."""
    build_timeout_s: float = 1800.0
    """Limit of one image build, in seconds (a read of the engine's build log that waits longer fails)."""

    def __post_init__(self) -> None:
        pairs = self.base_images.items() if isinstance(self.base_images, dict) else self.base_images
        try:
            pairs = tuple(sorted((str(a), str(b)) for a, b in pairs))
        except (TypeError, ValueError):
            raise ValueError(f"base_images must map image names to image names, got {self.base_images!r}") from None
        if any(not a or not b for a, b in pairs):
            raise ValueError(f"base_images must map non-empty image names, got {self.base_images!r}")
        object.__setattr__(self, "base_images", pairs)
        if not isinstance(self.network, str) or not self.network.strip():
            raise ValueError(f"network must be a network mode ('none', 'bridge', 'host', a network's name), "
                             f"got {self.network!r}")
        if not isinstance(self.image, str) or not self.image:
            raise ValueError(f"image must be a non-empty image name, got {self.image!r}")
        if not self.workdir.startswith("/") or self.workdir.rstrip("/") in ("", "/tmp", "/proc", "/dev"):
            raise ValueError(f"workdir must be an absolute path other than /, /tmp, /proc, /dev; got {self.workdir!r}")
        for name in ("timeout_s", "cpus", "engine_timeout_s", "build_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("output_limit_bytes", "test_output_limit_bytes", "memory_bytes", "max_processes",
                     "tmpfs_bytes", "workdir_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.max_processes < 8:
            raise ValueError(f"max_processes must be >= 8 (the shell needs a few), got {self.max_processes}")
        if self.memory_bytes < 16 << 20:
            raise ValueError(f"memory_bytes must be >= 16 MiB, got {self.memory_bytes}")


def _tar(files: dict[str, bytes], owner: tuple[int, int] = (0, 0), mode: int = 0o644) -> bytes:
    """A tar archive of ``files`` (relative paths), with explicit parent directories."""
    buf, now, dirs = io.BytesIO(), time.time(), set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, data in files.items():
            parts = rel.split("/")
            for k in range(1, len(parts)):
                d = "/".join(parts[:k])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, now
                    info.uid, info.gid = owner
                    tar.addfile(info)
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), mode, now
            info.uid, info.gid = owner
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _tree_tar(source: str, owner: tuple[int, int] = (0, 0), skip: tuple[str, ...] = (".git",)) -> bytes:
    """A tar archive of the host folder ``source`` as it is on disk (modes, symlinks, binary files,
    timestamps), owned by ``owner``; top-level names in ``skip`` left out (a work tree's ``.git``)."""
    if not os.path.isdir(source):
        raise SandboxError(f"the task's work tree {source!r} is not a folder (prepare the task again)")

    def own(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid, info.gid, info.uname, info.gname = owner[0], owner[1], "", ""
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(os.listdir(source)):
            if name not in skip:
                tar.add(os.path.join(source, name), arcname=name, recursive=True, filter=own)
    return buf.getvalue()


def _owner(user: str | None) -> tuple[int, int]:
    if user and user.split(":")[0].isdigit():
        uid, _, gid = user.partition(":")
        return int(uid), int(gid or uid)
    return 0, 0


def _remove_container(client, container_id: str) -> None:
    try:
        client.api.remove_container(container_id, force=True, v=True)
    except Exception as e:  # already gone, or the engine is down: nothing else to do here
        if "No such container" not in str(e) and "no such container" not in str(e):
            log.warning("could not remove container %s: %s", container_id[:12], e)


_reaped: set[str] = set()
_reap_lock = threading.Lock()


def reap_stale_containers(client, host: str | None = None) -> list[str]:
    """Remove containers labelled by this backend whose owner process (on this host) is gone."""
    host = host or socket.gethostname()
    removed = []
    for info in client.api.containers(all=True, filters={"label": LABEL}):
        owner = (info.get("Labels") or {}).get("compactrl.owner", "")
        owner_host, _, pid = owner.rpartition(":")
        if owner_host != host or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _remove_container(client, info["Id"])
        removed.append(info["Id"])
    if removed:
        log.info("removed %d container(s) of dead episodes", len(removed))
    return removed


@dataclass(frozen=True)
class DockerEngine:
    """The engine a task's own image is built on, as :meth:`DockerSandbox.start` hands it to
    :func:`compactrl.task.built_image`: the Docker SDK ``client``, the sandbox's ``config`` (its build
    options: ``base_images``, ``pull``, ``base_families``, ``build_network``, ``build_timeout_s``) and the
    engine's ``name`` and version, for messages."""

    client: Any
    config: DockerSandboxConfig
    name: str | None = None


class DockerSandbox:
    """One episode's container. See the module docstring.

    ``DockerSandbox(base_url="unix:///run/compactrl-podman.sock", image="compactrl-sandbox:latest")``.
    After :meth:`start`: ``container_id``, ``image``, ``engine`` (the engine's name and version).
    """

    backend = "docker"

    def __init__(self, *, config: DockerSandboxConfig | None = None, **options) -> None:
        self.config: DockerSandboxConfig = make_config(DockerSandboxConfig, config, options)
        self.container_id: str | None = None
        self.image: str | None = None
        self.engine: str | None = None
        self.task: Task | None = None
        self._client = None
        self._workdir = self.config.workdir
        self._cache: dict[str, str] = {}
        self._listing: list[str] | None = None
        self._finalizer: weakref.finalize | None = None

    # ------------------------------------------------------------------------------ lifecycle
    def _connect(self):
        try:
            import docker
        except ImportError as e:
            raise SandboxError("backend='docker' needs the Docker SDK: pip install 'compactrl[docker]'") from e
        cfg = self.config
        try:
            if cfg.base_url:
                client = docker.DockerClient(base_url=cfg.base_url, timeout=int(cfg.engine_timeout_s))
            else:
                client = docker.from_env(timeout=int(cfg.engine_timeout_s))
            version = client.version()
        except Exception as e:
            where = cfg.base_url or os.environ.get("DOCKER_HOST") or "the default socket"
            raise SandboxError(f"no Docker-compatible engine reachable at {where}: {e}") from e
        names = [c.get("Name", "") for c in version.get("Components", [])]
        self.engine = f"{'Podman' if any('Podman' in n for n in names) else 'Docker'} {version.get('Version')}"
        return client

    def start(self, task: Task) -> None:
        self.close()
        cfg = self.config
        self.task = task
        self._client = client = self._connect()
        if cfg.reap_stale:
            with _reap_lock:
                key = cfg.base_url or os.environ.get("DOCKER_HOST", "")
                if key not in _reaped:
                    _reaped.add(key)
                    reap_stale_containers(client)
        build = task.runtime.image_build if cfg.build_images and not task.docker_image else None
        # a task built from its own Dockerfile keeps the image's root and work dir, as the harness does
        in_image = bool(task.runtime.workdir or build)
        self._workdir = str(task.runtime.workdir or cfg.workdir).rstrip("/") or cfg.workdir
        self.image = task.docker_image or cfg.image
        try:
            if build:
                self.image = built_image(task, DockerEngine(self._client, cfg, self.engine))
                if not task.runtime.workdir:  # e.g. inherited from a base the loader cannot read
                    self._workdir = self._image_workdir() or self._workdir
            else:
                self._ensure_image()
            self._create(in_image, built=bool(build))
            # a built image already holds the files, with the modes and edits of its RUN steps
            files = {} if build else {work_rel(p): file_bytes(c) for p, c in task.files.items()}
            if task.runtime.work_tree and not build:  # modes, symlinks, built files
                self._api().put_archive(self.container_id, self._workdir,
                                        _tree_tar(str(task.runtime.work_tree), _owner(cfg.user)))
                files = {}  # the task's files are the tree's text files: a tar of them would reset their modes
            if files:
                self._put(files)
            res = self._exec_raw(["bash", "--noprofile", "--norc", "-c",
                                  f"cd -- \"$1\" && {_shell.SAVE_INITIAL_STATE}", "init", self._workdir])
            if res[0] != 0:
                raise SandboxError(f"container did not initialise ({res[0]}): {_shell.readable(res[1][-2000:])}")
            for command in task.setup:
                out = self.exec(command, timeout_s=task.check.timeout_s)
                if out.exit_code != 0:
                    raise SandboxError(f"setup command {command!r} failed ({out.exit_code}): {out.output[-2000:]}")
        except BaseException:
            self.close()
            raise
        log.info("docker sandbox for %s up (%s, %s, %s)", task.id, self.engine, self.image, self.container_id)

    def _ensure_image(self) -> None:
        import docker

        try:
            self._client.images.get(self.image)
        except docker.errors.ImageNotFound:
            if not self.config.pull:
                raise SandboxError(
                    f"image {self.image!r} not found on the engine ({self.engine}); build the default one "
                    "with scripts/ci_docker.sh, pull it, or pass pull=True"
                ) from None
            log.info("pulling %s", self.image)
            self._client.images.pull(self.image)
        except docker.errors.APIError as e:
            raise SandboxError(f"engine error while looking up image {self.image!r}: {e}") from e

    def _image_workdir(self) -> str | None:
        """The image's own ``WORKDIR`` (None for the root or none)."""
        try:
            workdir = (self._client.images.get(self.image).attrs.get("Config") or {}).get("WorkingDir") or ""
        except Exception as e:  # the image was just built: an error here is the engine's
            raise SandboxError(f"could not inspect image {self.image!r}: {e}") from e
        return workdir.rstrip("/") or None

    def _create(self, in_image: bool, built: bool = False) -> None:
        import docker

        cfg = self.config
        read_only = (not in_image) if cfg.read_only_root is None else cfg.read_only_root
        tmpfs = {"/tmp": f"size={cfg.tmpfs_bytes},mode=1777,exec"}
        if not in_image:
            tmpfs[self._workdir] = f"size={cfg.workdir_bytes},mode=0755,exec"
        kwargs = dict(
            image=self.image, entrypoint=["/bin/sh", "-c", _INIT], command=[], detach=True,
            network_mode=cfg.network, network_disabled=cfg.network == "none", mem_limit=cfg.memory_bytes,
            memswap_limit=cfg.memory_bytes, nano_cpus=int(cfg.cpus * 1e9), pids_limit=cfg.max_processes,
            read_only=read_only, tmpfs=tmpfs, working_dir=self._workdir,
            # HOME as the sim's shell has it, unless the image's own setup may depend on its HOME
            environment={**_ENV, **({} if in_image else {"HOME": self._workdir})},
            labels={LABEL: "1", "compactrl.owner": f"{socket.gethostname()}:{os.getpid()}",
                    "compactrl.task": str(self.task.id)[:200] if self.task else ""},
            security_opt=["no-new-privileges"], hostname="sandbox",
        )
        if cfg.drop_capabilities or (cfg.drop_capabilities is None and not built):
            kwargs["cap_drop"] = ["ALL"]
        if cfg.user:
            kwargs["user"] = cfg.user
        mounts = [m for m in (self.task.runtime.ro_mounts if self.task else ())
                  if isinstance(m, str) and os.path.isabs(m) and os.path.isdir(m)]
        if mounts:  # a prepared row's environment lives on the host: at the same paths, read-only
            kwargs["volumes"] = {m: {"bind": m, "mode": "ro"} for m in mounts}
        try:
            container = self._client.containers.create(**kwargs)
            self.container_id = container.id
            self._finalizer = weakref.finalize(self, _remove_container, self._client, container.id)
            # Before start: the root may be read-only once running.
            env_tar = _tar({_shell.ENV_FILE_PATH.lstrip("/"): _shell.ENV_FILE.encode()})
            container.put_archive("/", env_tar)
            container.start()
        except docker.errors.DockerException as e:
            raise SandboxError(f"could not create the container from {self.image!r}: {e}") from e

    def close(self) -> None:
        """Remove the container (and its tmpfs mounts). Idempotent."""
        if self._finalizer is not None:
            self._finalizer()  # removes the container once, even if called again
            self._finalizer = None
        self.container_id = None
        if self._client is not None:
            try:
                self._client.close()
            except Exception:
                pass
            self._client = None
        self._cache.clear()
        self._listing = None

    # --------------------------------------------------------------------------------- engine
    def _api(self):
        if self._client is None or self.container_id is None:
            raise SandboxError("the docker sandbox is not started (call start(task) first)")
        return self._client.api

    def _exec_stream(self, argv: list[str], call_timeout: float) -> tuple[str, object]:
        """Start ``argv`` in the container: its exec id and a generator of output chunks."""
        import docker
        import requests

        api = self._api()
        api.timeout = max(self.config.engine_timeout_s, call_timeout)  # a quiet command is not a hang
        try:
            exec_id = api.exec_create(self.container_id, argv, stdout=True, stderr=True,
                                      workdir=self._workdir, user=self.config.user or "")["Id"]
            return exec_id, api.exec_start(exec_id, stream=True, demux=False)
        except (docker.errors.DockerException, requests.RequestException) as e:
            raise self._infra_error(e) from e

    def _infra_error(self, e: Exception) -> SandboxError:
        try:
            state = self._client.api.inspect_container(self.container_id)["State"]["Status"]
        except Exception:
            state = "gone"
        return SandboxError(f"the sandbox container {str(self.container_id)[:12]} failed (state: {state}): {e}")

    def _iterate(self, stream):
        import docker
        import requests

        try:
            yield from stream
        except (docker.errors.DockerException, requests.RequestException, OSError) as e:
            raise self._infra_error(e) from e

    def _exec_raw(self, argv: list[str]) -> tuple[int, bytes]:
        """Run a helper command (not the agent's): its exit code and raw output."""
        exec_id, stream = self._exec_stream(argv, self.config.engine_timeout_s)
        out = b"".join(self._iterate(stream))
        try:
            code = self._api().exec_inspect(exec_id)["ExitCode"]
        except Exception as e:
            raise self._infra_error(e) from e
        return (-1 if code is None else int(code)), out

    # --------------------------------------------------------------------------------- shell
    def exec(self, command: str, timeout_s: float | None = None) -> ExecResult:
        return self._run(command, timeout_s or command_timeout(self.task, self.config.timeout_s),
                         self.config.output_limit_bytes)

    def _run(self, command: str, timeout_s: float, limit: int) -> ExecResult:
        self._cache.clear()  # the command may change any file
        self._listing = None
        marker = _shell.new_marker()
        keep = self.config.keep_background or bool(self.task and self.task.runtime.keep_background)
        argv = ["bash", "--noprofile", "--norc", "-c", _DRIVER_KEEP if keep else _DRIVER, "bash", f"{timeout_s:.3f}",
                command.replace("\x00", ""), marker]
        out = _shell.CappedOutput(limit)
        scanner = _shell.MarkerScanner(marker.encode(), out)
        started = time.monotonic()
        done = False
        _, stream = self._exec_stream(argv, timeout_s + 60)
        for chunk in self._iterate(stream):
            if not done:
                done = scanner.feed(chunk)
            if done and keep:  # a process left in the background may hold the stream open: do not wait for it
                break
        if not done:
            scanner.flush()
            raise self._infra_error(RuntimeError("the command's output ended without its exit code"))
        code = scanner.exit_code if scanner.exit_code is not None else -1
        elapsed = time.monotonic() - started
        if code in (124, 137) and elapsed >= timeout_s * 0.98:
            note = f"\n[timed out after {timeout_s:g}s: the command and every process it started were killed]"
            return ExecResult(out.text() + note, _shell.TIMEOUT_EXIT_CODE, timed_out=True, truncated=out.truncated)
        return ExecResult(out.text(), code, truncated=out.truncated)

    # ---------------------------------------------------------------------------------- files
    def _abs(self, rel: str) -> str:
        return posixpath.join(self._workdir, rel) if rel else self._workdir

    def _get(self, rel: str, depth: int = 0) -> bytes:
        """Bytes of work-dir file ``rel``, following symlinks only while they stay in the work dir."""
        import docker

        api, path = self._api(), self._abs(rel)
        try:
            stream, stat = api.get_archive(self.container_id, path)
            raw = b"".join(self._iterate(stream))
        except docker.errors.NotFound:
            raise FileNotFoundError(f"no such file: {rel}") from None
        except docker.errors.APIError as e:
            if "not a directory" in str(e).lower():
                raise FileNotFoundError(f"no such file: {rel}") from None
            raise self._infra_error(e) from e
        # Podman follows links and reports the resolved path in linkTarget; Docker Engine returns
        # the link itself (its raw target in linkTarget and a symlink tar member).
        target, resolved = stat.get("linkTarget") or "", path
        if stat.get("mode", 0) & _GO_MODE_SYMLINK or (target and target != path):
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
            if not (resolved + "/").startswith(self._workdir + "/") or depth >= 16:
                raise PermissionError(f"{rel!r} leads outside the work dir")
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            member = tar.next()
            if member is None:
                raise FileNotFoundError(f"no such file: {rel}")
            if member.isdir():
                raise IsADirectoryError(f"{rel} is a directory")
            if member.issym():
                return self._get(posixpath.relpath(resolved, self._workdir), depth + 1)
            if not member.isreg():
                raise PermissionError(f"{rel} is not a regular file")
            return tar.extractfile(member).read()

    def read_file(self, path: str) -> str:
        rel = work_rel(path)
        if not rel:
            raise is_a_directory(path)
        if rel not in self._cache:
            try:
                data = self._get(rel)
            except FileNotFoundError:
                raise not_found(path) from None
            except IsADirectoryError:
                raise is_a_directory(path) from None
            self._cache[rel] = data.decode("utf-8", errors="replace")
        return self._cache[rel]

    def _check_write(self, rel: str, path: str | None = None) -> None:
        code, out = self._exec_raw(["bash", "--noprofile", "--norc", "-c", _WRITE_CHECK, "check",
                                    self._abs(rel), self._workdir])
        if code == 13:
            raise PermissionError(f"{rel!r} leads outside the work dir")
        if code == 21:
            raise is_a_directory(path or rel)
        if code == 20:
            raise not_a_directory(out.decode("utf-8", errors="replace") or rel)
        if code != 0:
            raise SandboxError(f"checking {rel!r} failed ({code}): {_shell.readable(out[-500:])}")

    def _put(self, files: dict[str, bytes]) -> None:
        import docker

        try:
            self._api().put_archive(self.container_id, self._workdir, _tar(files, _owner(self.config.user)))
        except docker.errors.APIError as e:
            raise self._infra_error(e) from e

    def write_file(self, path: str, content: str) -> None:
        rel = work_rel(path)
        if not rel:
            raise is_a_directory(path)
        self._check_write(rel, path)
        data = content.encode("utf-8", errors="surrogatepass")
        self._put({rel: data})
        self._cache[rel] = data.decode("utf-8", errors="replace")
        if self._listing is not None and rel not in self._listing:
            self._listing = sorted([*self._listing, rel])

    def list_files(self) -> list[str]:
        if self._listing is None:
            code, out = self._exec_raw(["find", ".", "-type", "f", "-print0"])
            if code != 0:
                raise SandboxError(f"listing the work dir failed ({code}): {_shell.readable(out[-500:])}")
            names = (p.decode("utf-8", errors="replace") for p in out.split(b"\x00") if p)
            self._listing = sorted(p[2:] if p.startswith("./") else p for p in names)
        return list(self._listing)

    def _remove(self, rel: str) -> None:
        self._exec_raw(["rm", "-f", "--", self._abs(rel)])

    # ---------------------------------------------------------------------------------- tests
    def run_tests(self, check: Check | None = None) -> TestReport:
        if self.task is None:
            raise SandboxError("the docker sandbox is not started (call start(task) first)")
        check = check or self.task.check
        before: dict[str, bytes | None] = {}
        for path in check.hidden_files:
            rel = work_rel(path)
            try:
                before[rel] = self._get(rel) if rel not in self.task.files else None
            except (FileNotFoundError, IsADirectoryError, PermissionError):
                before[rel] = None
        try:
            for rel in before:
                self._check_write(rel)
            if check.hidden_files:
                self._put({work_rel(p): file_bytes(c) for p, c in check.hidden_files.items()})
        except OSError as e:  # the agent put something in the way (a directory, a symlink out)
            return hidden_files_blocked(e)
        try:
            command = check.command
            if self.task.grading.mode == "pytest":
                # a family substitute carries pytest for its python3 outside site-packages (base_images)
                grader = f"{GRADER_DEPS_DIR}:{GRADER_DIR}"
                command = (f"[ -d {GRADER_DIR} ] && export PYTHONPATH={grader}${{PYTHONPATH:+:$PYTHONPATH}};"
                           # an image without python3: the substitute's own, after the image's PATH
                           f" command -v python3 >/dev/null || export PATH=$PATH:{GRADER_PYTHON_DIR}/bin;"
                           f" {command}")
            res = self._run(command, check.timeout_s, self.config.test_output_limit_bytes)
        finally:
            restore = hidden_restore_plan(self.task, before)
            self._cache.clear()
            self._listing = None
            for rel in [r for r, data in restore.items() if data is None]:
                self._remove(rel)
            kept = {r: data for r, data in restore.items() if data is not None}
            if kept:
                self._put(kept)
        return report_from_run(check, res, self.config.output_limit_bytes)

