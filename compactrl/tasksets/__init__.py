"""Loaders of real task formats: SWE-bench rows (:mod:`.swebench`) and Terminal-Bench task folders
(:mod:`.terminal_bench`). :func:`load_tasks` picks the loader from what a path holds."""

from __future__ import annotations

import json
import os
from typing import Any

from compactrl.task import Task


def load_tasks(path: str, *, swebench: Any = None, terminal_bench: Any = None,
               instance_ids: list[str] | None = None) -> list[Task]:
    """Tasks from ``path``:

    * a ``.json``/``.jsonl`` file of SWE-bench rows (``instance_id``, ``test_patch``...), loaded
      with ``swebench`` (a :class:`~.swebench.SWEBenchConfig`, required for them);
    * a ``.json``/``.jsonl`` file of :class:`Task` records (``Task.to_json`` lines);
    * a Terminal-Bench task folder, or a folder of them, loaded with ``terminal_bench``
      (a :class:`~.terminal_bench.TerminalBenchConfig`).
    """
    if os.path.isdir(path):
        from compactrl.tasksets.terminal_bench.folders import load_terminal_bench

        return load_terminal_bench(path, terminal_bench)
    if not os.path.isfile(path):
        raise ValueError(f"tasks: {path!r} is neither a file nor a directory")
    from compactrl.tasksets.swebench.rows import load_swebench, read_rows

    rows = read_rows(path)
    kind = rows_kind(rows)
    if kind == "swebench":  # a row missing test_patch is reported by the loader
        if swebench is None:
            raise ValueError(f"{path}: SWE-bench rows need a SWEBenchConfig (repos_root or use_images)")
        return load_swebench(path, swebench, instance_ids=instance_ids)
    if kind == "records":
        return [Task.from_json(json.dumps(r)) for r in rows]
    raise ValueError(f"{path}: expected SWE-bench rows or Task records, got keys {sorted(rows[0]) if rows else []}")


def rows_kind(rows: list[dict[str, Any]]) -> str | None:
    """What the rows of a ``.json``/``.jsonl`` file are: ``swebench`` (rows with ``instance_id``),
    ``records`` (:class:`Task` records), or None (neither)."""
    if rows and "instance_id" in rows[0]:
        return "swebench"
    if rows and {"id", "kind", "instruction", "files"} <= set(rows[0]):
        return "records"
    return None


def task_kind(path: str | None) -> str | None:
    """What :func:`load_tasks` would load from ``path``, without loading it: ``terminal-bench`` (a
    folder), ``swebench`` or ``records`` (:func:`rows_kind`); None when ``path`` is not given, cannot be
    read, or holds neither (the loader then says why)."""
    if not path:
        return None
    if os.path.isdir(path):
        return "terminal-bench"
    from compactrl.tasksets.swebench.rows import read_rows

    try:
        return rows_kind(read_rows(path))
    except (OSError, ValueError):
        return None


__all__ = ["load_tasks", "rows_kind", "task_kind"]
