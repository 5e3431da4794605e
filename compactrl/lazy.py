"""Lazy package exports: a package lists ``{name: module}`` and each name is imported on first use, so that
importing the package stays cheap (``import compactrl.training`` does not import torch)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` for ``package``: the sorted names of ``exports``, and a module-level
    ``__getattr__`` that imports ``exports[name]`` and returns its ``name``."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return sorted(exports), __getattr__


__all__ = ["lazy_exports"]
