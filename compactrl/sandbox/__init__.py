"""Sandboxes: one protocol (:mod:`.base`), three backends.

``make_sandbox("sim")`` is in-process and needs nothing; ``"local"`` (bubblewrap/unshare) and
``"docker"`` (Docker SDK) are imported only when asked for, so their dependencies stay optional.
"""

from __future__ import annotations

import importlib

from compactrl.sandbox.base import ExecResult, Sandbox, SandboxError, TestReport
from compactrl.sandbox.sim import SimSandbox

BACKENDS: dict[str, str] = {
    "sim": "compactrl.sandbox.sim:SimSandbox",
    "local": "compactrl.sandbox.local:LocalSandbox",
    "docker": "compactrl.sandbox.docker:DockerSandbox",
}


def make_sandbox(backend: str, **kwargs) -> Sandbox:
    """A new, unstarted sandbox of ``backend`` (``sim``, ``local`` or ``docker``)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {sorted(BACKENDS)}, got {backend!r}")
    module_name, cls_name = BACKENDS[backend].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(**kwargs)


__all__ = ["BACKENDS", "ExecResult", "Sandbox", "SandboxError", "SimSandbox", "TestReport", "make_sandbox"]
