"""Helpers for the sandbox tests (imported by name: the tests dir has no packages).

``local`` needs bubblewrap or unshare (``apt-get install bubblewrap``); ``docker`` needs a
Docker-compatible engine (``DOCKER_HOST``; ``scripts/ci_docker.sh`` starts Podman's) holding the
default image. Where either is missing the tests skip and say what to install or run.
"""

from __future__ import annotations

import os

import pytest

from compactrl.sandbox.base import SandboxError
from compactrl.task import Check, Task

# Small limits: the tests must hit them quickly.
LOCAL_OPTIONS = dict(timeout_s=20.0, max_processes=64, output_limit_bytes=20_000)
DOCKER_OPTIONS = dict(timeout_s=20.0, max_processes=64, output_limit_bytes=20_000, memory_bytes=512 << 20)

_docker_reason: list[str | None] = []


def docker_unavailable() -> str | None:
    """Why the docker tests cannot run here (None: they can). Checked once per session."""
    if not _docker_reason:
        _docker_reason.append(_probe_docker())
    return _docker_reason[0]


def _probe_docker() -> str | None:
    try:
        import docker
    except ImportError:
        return "the Docker SDK is not installed (pip install 'compactrl[docker]')"
    from compactrl.sandbox.docker import DEFAULT_IMAGE

    where = os.environ.get("DOCKER_HOST", "the default socket")
    try:
        client = docker.from_env(timeout=10)
        client.version()
    except Exception as e:
        return (f"no Docker-compatible engine reachable at {where} ({type(e).__name__}); "
                "run `bash scripts/ci_docker.sh` (starts Podman's socket) or set DOCKER_HOST")
    try:
        client.images.get(DEFAULT_IMAGE)
    except Exception:
        return f"the engine at {where} has no image {DEFAULT_IMAGE}; `bash scripts/ci_docker.sh` builds it offline"
    finally:
        client.close()
    return None


def local_unavailable() -> str | None:
    from compactrl.sandbox.local import choose_isolation

    try:
        choose_isolation("auto")
    except SandboxError as e:
        return str(e)
    return None


def small_task(files: dict[str, str] | None = None, **check) -> Task:
    files = files if files is not None else {
        "calc.py": "def add(a, b):\n    return a + b\n",
        "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    }
    return Task(id="sandbox-test", kind="code", instruction="test", files=files, check=Check(**check))


def make_backend(name: str, **options):
    """A fresh, unstarted sandbox of ``name`` with the test limits, or skip saying why."""
    if name == "local":
        why = local_unavailable()
        if why:
            pytest.skip(why)
        from compactrl.sandbox.local import LocalSandbox

        return LocalSandbox(**{**LOCAL_OPTIONS, **options})
    if name == "docker":
        why = docker_unavailable()
        if why:
            pytest.skip(why)
        from compactrl.sandbox.docker import DockerSandbox

        return DockerSandbox(**{**DOCKER_OPTIONS, **options})
    from compactrl.sandbox.sim import SimSandbox

    return SimSandbox(**options)


REAL_BACKENDS = [pytest.param("local", id="local"), pytest.param("docker", id="docker", marks=pytest.mark.docker)]
