"""Seeded task generators (``code``: repositories with far-away facts; see docs/environments.md)."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CodeTaskGenerator": "compactrl.envs.generators.code",
    "CodeTaskConfig": "compactrl.envs.generators.code",
    "GeneratedTasks": "compactrl.envs.generators.code",
    "PRESETS": "compactrl.envs.generators.code",
    "task_seed_for": "compactrl.envs.generators.code",
    "split_of_seed": "compactrl.envs.generators.code",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'compactrl.envs.generators' has no attribute {name!r}")
