"""A Terminal-Bench task's own image, built from its Dockerfile on a Docker-compatible engine.

:func:`build_task_image` is what the docker backend starts for a task with ``Task.runtime.image_build``
(unless the task names ``docker_image``): the sandbox, at ``start``, asks for the image through
:func:`compactrl.task.built_image`, which reaches :meth:`.build.DockerfileReplay.image` and so this module;
the sandbox itself knows no task set. The build:

* resolves the Dockerfile's bases (``FROM``): a substitute named in the sandbox's ``base_images``, the
  engine's own image, a pull (``pull=True``) or a family substitute (:mod:`.base_images`,
  ``base_families=True``); a base it cannot have is a :class:`~compactrl.sandbox.SandboxError` naming it;
* adds, for a task graded with pytest, a layer with what its test scripts install at test time
  (:func:`.base_images.grader_layer`);
* rewrites BuildKit heredocs as files of the build context (:func:`expand_heredocs`);
* tags the image by the digest of its content (context files and modes, Dockerfile, base image ids), so
  an unchanged task is built once per engine (:func:`task_image_tag`).

The options (``base_images``, ``pull``, ``base_families``, ``build_network``, ``build_timeout_s``) are
:class:`~compactrl.sandbox.docker.DockerSandboxConfig`'s, given as ``--sandbox-kwargs``.
"""

from __future__ import annotations

import collections
import hashlib
import io
import logging
import os
import re
import tarfile
import threading
import time

from compactrl.sandbox.base import SandboxError
from compactrl.sandbox.docker import DockerEngine, DockerSandboxConfig
from compactrl.sandbox.shell_syntax import HEREDOC
from compactrl.task import Task
from compactrl.tasksets.terminal_bench.base_images import (
    NoSubstitute,
    dockerfile_bases,
    grader_layer,
    substitute_for,
    test_requirements,
)

log = logging.getLogger(__name__)

_BUILT_DOCKERFILE = ".compactrl.Dockerfile"
_build_locks: dict[str, threading.Lock] = {}
_locks_lock = threading.Lock()


def _resolve_bases(client, text: str, cfg: DockerSandboxConfig, where: str, engine: str | None) -> tuple[str, list[str]]:
    """The Dockerfile with substitutes in place of mapped bases, and the image ids of its bases.

    A base the engine lacks is pulled only with ``pull=True``; otherwise a SandboxError names it.
    """
    import docker

    lines, ids, mapping = text.splitlines(), [], dict(cfg.base_images)
    for i, base in dockerfile_bases(text):
        if "$" in base:  # set by a build ARG: only the build can tell
            continue
        wanted = mapping.get(base, base)
        try:
            image = client.images.get(wanted)
        except docker.errors.ImageNotFound:
            if not cfg.pull:
                family_note, image = "", None
                if cfg.base_families and wanted == base:
                    try:
                        wanted, recipe = substitute_for(client, base)
                        image = client.images.get(wanted)
                        log.info("%s: base %s -> family substitute %s%s", where, base, wanted,
                                 "".join(f"; {n}" for n in recipe.notes))
                    except NoSubstitute as e:
                        family_note = f" (no family substitute: {e})"
                    except (RuntimeError, OSError, docker.errors.DockerException) as e:
                        raise SandboxError(f"{where}: building the substitute for base image {base!r} failed: {e}") from e
                if image is None:
                    via = f" (substitute for {base!r})" if wanted != base else ""
                    on = f"the engine ({engine})" if engine else "the engine"
                    raise SandboxError(
                        f"{where}: base image {wanted!r}{via} is not on {on}{family_note}; pull it "
                        f"(docker pull {wanted}), or map it to a local image with base_images={{{base!r}: 'IMAGE'}} "
                        "(--sandbox-kwargs), or pass pull=True") from None
            else:
                log.info("pulling base image %s", wanted)
                image = client.images.pull(wanted)
        except docker.errors.APIError as e:
            raise SandboxError(f"{where}: engine error while looking up base image {wanted!r}: {e}") from e
        ids.append(image.id)
        if wanted != base:  # the engine's own name for it (Podman: localhost/...), so no registry is asked
            name = next((t for t in image.tags if t == wanted or t.endswith("/" + wanted)), image.id)
            lines[i] = lines[i].replace(base, name, 1)
    return "\n".join(lines) + "\n", ids


def _context_files(context: str) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(context):
        dirnames.sort()
        out += [os.path.join(dirpath, n) for n in sorted(filenames)]
    return out


_HEREDOC_DIR = ".compactrl-heredoc"


def expand_heredocs(text: str) -> tuple[str, dict[str, bytes]]:
    """BuildKit's heredocs (``COPY <<EOT /dest``, ``RUN <<EOF``, ``RUN python3 <<EOF``) as files of the
    build context, for engines whose builder lacks them (Podman 4's buildah): the Dockerfile rewritten
    to copy those files, and the files (context-relative path -> body)."""
    lines, out, files, i = text.split("\n"), [], {}, 0
    while i < len(lines):
        m = re.match(r"^(\s*)(COPY|ADD|RUN)(\s+)(.*)$", lines[i], re.I)
        docs = [d for d in HEREDOC.finditer(m[4]) if not (m[4][:d.start()].count("'") % 2
                                                            or m[4][:d.start()].count('"') % 2)] if m else []
        if not docs:
            out.append(lines[i])
            i += 1
            continue
        rest, j, names = m[4], i + 1, []
        for d in docs:
            body = []
            while j < len(lines) and (lines[j].lstrip("\t") if d[1] else lines[j]) != d[3]:
                body.append(lines[j].lstrip("\t") if d[1] else lines[j])
                j += 1
            j += 1
            name = f"{_HEREDOC_DIR}/{len(files)}"
            files[name] = ("\n".join(body) + "\n").encode()
            names.append((d, name))
        if m[2].upper() == "RUN":
            for _d, name in names:
                out.append(f"{m[1]}COPY {name} /tmp/{name.replace('/', '-')}")
            command = rest
            for d, name in names:
                where = f"/tmp/{name.replace('/', '-')}"
                bare = command.strip() == d.group(0)
                command = (f"sh {where}" if not files[name].startswith(b"#!") else f"chmod +x {where} && {where}") \
                    if bare else command.replace(d.group(0), f"< {where}", 1)
            out.append(f"{m[1]}RUN {command}")
        else:
            for d, name in names:
                rest = rest.replace(d.group(0), name, 1)
            out.append(f"{m[1]}{m[2]}{m[3]}{rest}")
        i = j
    return "\n".join(out), files


def _context_tar(context: str, dockerfile: str, extra: dict[str, bytes] | None = None) -> tuple[bytes, str]:
    """The build context as a tar (modes kept) with ``dockerfile`` and ``extra`` files (context-relative
    path -> bytes) added, and its content digest."""
    digest, buf = hashlib.sha256(dockerfile.encode()), io.BytesIO()
    for name, data in sorted((extra or {}).items()):
        digest.update(f"\0{name}\0".encode() + data)
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in sorted((extra or {}).items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        for path in _context_files(context):
            rel = os.path.relpath(path, context).replace(os.sep, "/")
            info = tar.gettarinfo(path, arcname=rel)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0  # the digest and the engine's layer cache depend on content only
            digest.update(f"\0{rel}\0{info.mode:o}\0{info.linkname}\0".encode())
            if info.isreg():
                with open(path, "rb") as fh:
                    data = fh.read()
                digest.update(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
        info = tarfile.TarInfo(_BUILT_DOCKERFILE)
        data = dockerfile.encode()
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), digest.hexdigest()


def task_image_tag(task_id: str, digest: str) -> str:
    """The tag of a task's image: ``compactrl-task/<task id as a slug>:<the first 24 digits of digest>``."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", str(task_id).lower()).strip("-._")[:60] or "task"
    return f"compactrl-task/{slug}:{digest[:24]}"


def task_build(task: Task) -> dict:
    """What :func:`build_task_image` builds for ``task``: its ``Task.runtime.image_build`` and, for a task
    graded with pytest (its tests run offline), the packages its test scripts install at test time."""
    image = task.runtime.image_build
    if image is None:
        raise ValueError(f"task {task.id}: runtime.image_build: the task has no Dockerfile to build")
    build: dict = {"context": image.context, "dockerfile": image.dockerfile}
    if task.grading.mode == "pytest":
        reqs = test_requirements([c for p, c in task.check.hidden_files.items() if p.endswith(".sh")])
        if reqs:
            build["grader_requirements"] = reqs
    return build


def build_task_image(client, task_id: str, build: dict, cfg: DockerSandboxConfig, engine: str | None = None) -> str:
    """Tag of the task's image, built from ``build = {"context": DIR, "dockerfile": PATH}`` unless an
    image with the same content digest (context files and modes, Dockerfile, base image ids) exists."""
    context, path = str(build.get("context") or ""), str(build.get("dockerfile") or "")
    if not os.path.isdir(context) or not os.path.isfile(path):
        raise SandboxError(f"task {task_id}: image_build needs an existing context folder and Dockerfile, got {build!r}")
    with open(path, encoding="utf-8", errors="replace") as fh:
        text, ids = _resolve_bases(client, fh.read(), cfg, path, engine)
    if build.get("grader_requirements"):  # what the task's test scripts install at test time
        lines = text.splitlines()
        last_stage = max((i for i, line in enumerate(lines) if line.strip().upper().startswith("FROM ")), default=0)
        users = [line.split(None, 1)[1].strip() for line in lines[last_stage:] if line.strip().upper().startswith("USER ")]
        text += "\n".join(grader_layer(list(build["grader_requirements"]), users[-1] if users else None)) + "\n"
    text, heredocs = expand_heredocs(text)
    data, digest = _context_tar(context, text, heredocs)
    tag = task_image_tag(task_id, hashlib.sha256(("\0".join([digest, *ids])).encode()).hexdigest())
    with _locks_lock:
        lock = _build_locks.setdefault(tag, threading.Lock())
    with lock:  # two episodes of one task build it once
        try:
            client.images.get(tag)
            return tag
        except Exception:  # not built yet (ImageNotFound) or unreadable: build
            pass
        started = time.monotonic()
        _run_build(client, data, tag, cfg, path)
        log.info("built %s for task %s in %.1f s", tag, task_id, time.monotonic() - started)
    return tag


_BUILD_CAUSE = re.compile(r"Could not resolve host|unable to access|Unable to locate package|No matching distribution|"
                          r"Temporary failure in name resolution|Failed to fetch|^E: |^ERROR|error:|No such file or directory")


def _run_build(client, data: bytes, tag: str, cfg: DockerSandboxConfig, where: str) -> None:
    import docker
    import requests

    tail: collections.deque[str] = collections.deque(maxlen=25)
    error = None
    try:
        stream = client.api.build(fileobj=io.BytesIO(data), custom_context=True, dockerfile=_BUILT_DOCKERFILE,
                                  tag=tag, rm=True, forcerm=True, pull=False, decode=True,
                                  network_mode=cfg.build_network, timeout=int(cfg.build_timeout_s))
        for chunk in stream:
            if chunk.get("stream"):
                tail.extend(line for line in chunk["stream"].splitlines() if line.strip())
            if chunk.get("error"):
                error = chunk["error"].strip()
    except (docker.errors.DockerException, requests.RequestException) as e:
        error = f"{type(e).__name__}: {e}"
    if error is None:
        try:
            client.images.get(tag)
        except docker.errors.DockerException:
            error = "the engine reported no error but holds no image"
    if error is not None:
        # the line of the step's output that says why (a host not reachable, a package not found...)
        cause = next((line.strip() for line in tail if _BUILD_CAUSE.search(line)), None)
        raise SandboxError(f"{where}: building the task's image failed: {error}" + (f" ({cause[:200]})" if cause else "")
                           + "\n" + "\n".join(tail))


def engine_image(task: Task, engine: DockerEngine) -> str:
    """Tag of ``task``'s own image on ``engine``, built (or reused) from ``Task.runtime.image_build`` with
    the engine's sandbox options; a :class:`~compactrl.sandbox.SandboxError` says why it cannot be."""
    return build_task_image(engine.client, task.id, task_build(task), engine.config, engine.name)
