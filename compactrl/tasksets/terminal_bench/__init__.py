"""Terminal-Bench (1.x ``task.yaml`` and 2.x / Harbor ``task.toml`` folders): folders -> tasks
(:mod:`.folders`, :mod:`.spec`, :mod:`.files`), what a task's Dockerfile does (:mod:`.dockerfile`), its file
state replayed for the local sandbox (:mod:`.local_build`, :mod:`.downloads`, :mod:`.toolchains`) and
substitutes for its base images on a container engine (:mod:`.base_images`)."""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TerminalBenchConfig": "compactrl.tasksets.terminal_bench.folders",
    "load_task_dir": "compactrl.tasksets.terminal_bench.folders",
    "load_terminal_bench": "compactrl.tasksets.terminal_bench.folders",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'compactrl.tasksets.terminal_bench' has no attribute {name!r}")
