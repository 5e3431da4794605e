"""Terminal-Bench (1.x ``task.yaml`` and 2.x / Harbor ``task.toml`` folders): folders -> tasks
(:mod:`.folders`, :mod:`.spec`, :mod:`.files`), what a task's Dockerfile does (:mod:`.dockerfile`), its file
state replayed for the local sandbox (:mod:`.local_build`, :mod:`.downloads`, :mod:`.toolchains`) and
substitutes for its base images on a container engine (:mod:`.base_images`)."""

from __future__ import annotations

from compactrl.lazy import lazy_exports

_EXPORTS = {
    "TerminalBenchConfig": "compactrl.tasksets.terminal_bench.folders",
    "load_task_dir": "compactrl.tasksets.terminal_bench.folders",
    "load_terminal_bench": "compactrl.tasksets.terminal_bench.folders",
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
