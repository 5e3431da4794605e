"""Environments: tasks, generators, sandboxes and the tool-using text envs.

Names resolve lazily, so ``import compactrl.envs`` stays cheap.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "ToolEnv": "compactrl.envs.code_env",
    "CodeRepoEnv": "compactrl.envs.code_env",
    "TaskSampler": "compactrl.envs.code_env",
    "TaskList": "compactrl.envs.code_env",
    "ChatMessages": "compactrl.envs.spaces",
    "UnicodeText": "compactrl.envs.spaces",
    "ToolCall": "compactrl.tools",
    "FormatError": "compactrl.tools",
    "parse_action": "compactrl.tools",
    "format_call": "compactrl.tools",
    "Task": "compactrl.task",
    "Check": "compactrl.task",
    "make_sandbox": "compactrl.sandbox",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'compactrl.envs' has no attribute {name!r}")
