"""Seeded task generators (``code``: repositories with far-away facts; see docs/environments.md)."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CodeTaskGenerator": "compactrl.tasksets.generators.code",
    "CodeTaskConfig": "compactrl.tasksets.generators.code",
    "GeneratedTasks": "compactrl.tasksets.generators.code",
    "PRESETS": "compactrl.tasksets.generators.code",
    "task_seed_for": "compactrl.tasksets.generators.code",
    "split_of_seed": "compactrl.tasksets.generators.code",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'compactrl.tasksets.generators' has no attribute {name!r}")
