"""The initial work dir of a Terminal-Bench task: the files its image would hold there."""

from __future__ import annotations

import os
import posixpath

from compactrl.tasksets.terminal_bench.dockerfile import INLINE, DockerfileFacts, read_dockerfile
from compactrl.tasksets.terminal_bench.spec import TaskSpec

# 1.x files that are the task's machinery, never part of the image's work dir.
RESERVED = {"task.yaml", "solution.sh", "solution.yaml", "run-tests.sh", "Dockerfile", "docker-compose.yaml",
            "docker-compose.yml", ".dockerignore", "tests"}


def read_limited(path: str, limit: int) -> str | None:
    """Content as text; bytes that are not UTF-8 kept as lone surrogates (``surrogateescape``)."""
    if os.path.getsize(path) > limit:
        return None
    with open(path, "rb") as fh:
        return fh.read().decode("utf-8", errors="surrogateescape")


def _fallback_copies(spec: TaskSpec) -> list[tuple[str, str]]:
    """1.x without a Dockerfile: the folder's other files at the same relative paths."""
    out = []
    for dirpath, dirnames, filenames in os.walk(spec.folder):
        dirnames.sort()
        for name in sorted(filenames):
            rel = os.path.relpath(os.path.join(dirpath, name), spec.folder).replace(os.sep, "/")
            if rel.split("/", 1)[0] not in RESERVED:
                out.append((rel, rel))
    return out


def _facts(spec: TaskSpec) -> DockerfileFacts:
    if spec.dockerfile:
        facts = read_dockerfile(spec.dockerfile, spec.context)
    else:
        facts = DockerfileFacts()
        if spec.docker_image:
            facts.image_only.append(f"prebuilt image {spec.docker_image}: its files exist only in the image")
    if spec.workdir:
        facts.workdir, facts.workdir_source = spec.workdir, "task.toml environment.workdir"
    if spec.services:
        facts.image_only.append(f"docker-compose services {', '.join(spec.services)} (not started)")
    return facts


def task_files(spec: TaskSpec, limit: int) -> tuple[dict[str, str], list[str], DockerfileFacts]:
    """``(files, skipped, facts)``: work-dir-relative files, those left out (too large), the Dockerfile's facts.

    A copy outside the work dir cannot be placed without the image: it is a reason in
    ``facts.image_only``.
    """
    facts = _facts(spec)
    if spec.dockerfile:
        copies = facts.copies
    else:
        copies = [(s, posixpath.join(facts.workdir or "/", d)) for s, d in _fallback_copies(spec)] \
            if spec.version == 1 else []
    files, skipped, outside = {}, [], []
    root = (facts.workdir or "").rstrip("/") + "/"
    for src, dest in copies:
        if spec.version == 1 and not spec.dockerfile and not facts.workdir:
            rel = src
        elif facts.workdir and dest.startswith(root):
            rel = dest[len(root):]
        else:
            outside.append(dest)
            continue
        if src.startswith(INLINE):  # a COPY heredoc
            text = facts.inline.get(dest)
        else:
            text = read_limited(os.path.join(spec.context or spec.folder, src), limit)
        if text is None:
            skipped.append(src)
        else:
            files[rel] = text
    if outside:
        facts.image_only.append(f"COPY to {len(outside)} path(s) outside the work dir, e.g. {outside[0]}")
    return files, skipped, facts


def executable_files(spec: TaskSpec, facts: DockerfileFacts) -> list[str]:
    """Work-dir-relative paths of the copied files that are executable in the build context (``COPY``
    keeps a file's mode: ``mv tool.py /usr/local/bin/tool`` then runs it)."""
    root = (facts.workdir or "").rstrip("/") + "/"
    out = []
    for src, dest in facts.copies if spec.dockerfile else []:
        path = os.path.join(spec.context or spec.folder, src)
        if not src.startswith(INLINE) and facts.workdir and dest.startswith(root) and os.path.isfile(path) \
                and os.access(path, os.X_OK):
            out.append(dest[len(root):])
    return out
