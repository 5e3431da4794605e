"""Registration of the Gymnasium ids. Imported by ``compactrl/__init__``.

Lives at the top of the package (not in ``envs``) because the registered ids compose layers:
an env from ``envs`` wrapped in ``wrappers.ContextBudget``.
"""

from __future__ import annotations

import gymnasium as gym


def _register(env_id: str, entry_point: str) -> None:
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=entry_point)


_register("CompactCode-v0", "compactrl.envs.code_env:make_code_env")
_register("CompactTerminal-v0", "compactrl.envs.terminal_env:make_terminal_env")
