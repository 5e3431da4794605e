"""Helpers of the loader tests (imported by name: the tests dir has no packages)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
SWEBENCH_ROWS = os.path.join(FIXTURES, "swebench", "instances.jsonl")
TB_TASK = os.path.join(FIXTURES, "terminal_bench", "count-errors")


def build_module():
    spec = importlib.util.spec_from_file_location("swebench_fixture_build", os.path.join(FIXTURES, "swebench", "build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



def local_unavailable() -> str | None:
    from compactrl.sandbox.base import SandboxError
    from compactrl.sandbox.local import choose_isolation

    try:
        choose_isolation("auto")
    except SandboxError as e:
        return f"local sandbox unavailable: {e} (apt-get install bubblewrap)"
    return None


_docker: list[str | None] = []


def docker_unavailable() -> str | None:
    if not _docker:
        _docker.append(_probe_docker())
    return _docker[0]


def _probe_docker() -> str | None:
    try:
        import docker
    except ImportError:
        return "the Docker SDK is not installed (pip install 'compactrl[docker]')"
    from compactrl.sandbox.docker import DEFAULT_IMAGE

    try:
        client = docker.from_env(timeout=10)
        client.version()
        client.images.get(DEFAULT_IMAGE)
        client.close()
    except Exception as e:  # noqa: BLE001 - any failure means "cannot run here"
        return (f"no Docker-compatible engine with {DEFAULT_IMAGE} at {os.environ.get('DOCKER_HOST', 'the default socket')}"
                f" ({type(e).__name__}); run `bash scripts/ci_docker.sh`")
    return None


def write_tb_task(folder: Path, *, instruction: str, dockerfile: str, solution: str, tests: str,
                  **files: str) -> str:
    """``folder`` with ``task.yaml`` (the pytest parser), ``Dockerfile``, ``solution.sh``,
    ``tests/test_outputs.py`` and any other ``files`` (name -> text); its path."""
    (folder / "tests").mkdir(parents=True)
    (folder / "task.yaml").write_text(f"instruction: {instruction}\nparser_name: pytest\n")
    (folder / "Dockerfile").write_text(dockerfile)
    (folder / "solution.sh").write_text(solution)
    (folder / "tests" / "test_outputs.py").write_text(tests)
    for name, text in files.items():
        (folder / name).write_text(text)
    return str(folder)
