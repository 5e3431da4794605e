"""Environments: the tool-using text envs over a sandbox (the task record is :mod:`compactrl.task`, the tool
language :mod:`compactrl.tools`, the sandboxes :mod:`compactrl.sandbox`).

Names resolve lazily, so ``import compactrl.envs`` stays cheap.
"""

from __future__ import annotations

from compactrl.lazy import lazy_exports

_EXPORTS = {
    "ToolEnv": "compactrl.envs.code_env",
    "CodeRepoEnv": "compactrl.envs.code_env",
    "TerminalEnv": "compactrl.envs.terminal_env",
    "TaskSampler": "compactrl.envs.code_env",
    "TaskList": "compactrl.envs.code_env",
    "ChatMessages": "compactrl.envs.spaces",
    "UnicodeText": "compactrl.envs.spaces",
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
