"""Registration of the Gymnasium ids and the one factory that builds them. Imported by ``compactrl/__init__``.

Lives at the top of the package (not in ``envs``) because the registered ids compose layers:
an env from ``envs`` wrapped in ``wrappers.ContextBudget``. :func:`make_env` is that composition;
``make_code_env``/``make_terminal_env`` are its entry points for ``CompactCode-v0`` and
``CompactTerminal-v0``. Env modules import nothing from here, so importing ``compactrl`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym

ENV_CLASSES: dict[str, str] = {
    "CompactCode-v0": "compactrl.envs.code_env:CodeRepoEnv",
    "CompactTerminal-v0": "compactrl.envs.terminal_env:TerminalEnv",
}
"""The inner env class behind each id (before context budgeting)."""


def make_env(env_id: str, *, context_budget: Any = True, tokenizer: Any = None, **kwargs: Any) -> gym.Env:
    """The env of ``env_id`` inside :class:`~compactrl.wrappers.ContextBudget`.

    Fields of :class:`~compactrl.wrappers.ContextBudgetConfig` given as keywords (``budget=4096``,
    ``reserve=...``, ``max_compactions=...``) override the wrapper's defaults; ``context_budget``
    may also be a ``ContextBudgetConfig``, or ``None``/``False`` for the bare env. ``tokenizer``:
    the wrapper's tokenizer (default: the process's shared one). Other keywords go to the env class.
    """
    if env_id not in ENV_CLASSES:
        raise ValueError(f"env_id: expected one of {sorted(ENV_CLASSES)}, got {env_id!r}")
    from compactrl.envs.spaces import register_torchrl_specs
    from compactrl.wrappers import ContextBudget, ContextBudgetConfig

    register_torchrl_specs(only_if_loaded=True)  # so TorchRL's GymEnv can convert the messages space
    overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in ContextBudgetConfig.__dataclass_fields__}
    module, name = ENV_CLASSES[env_id].split(":")
    env = getattr(importlib.import_module(module), name)(**kwargs)
    if context_budget is None or context_budget is False:
        if overrides:
            raise ValueError(f"context_budget: got None but also wrapper parameters {sorted(overrides)}")
        return env
    if not (context_budget is True or isinstance(context_budget, ContextBudgetConfig)):
        raise ValueError(f"context_budget: expected True, None, False or a ContextBudgetConfig, got {context_budget!r}")
    config = context_budget if isinstance(context_budget, ContextBudgetConfig) else None
    return ContextBudget(env, config, tokenizer=tokenizer, **overrides)


def make_code_env(**kwargs: Any) -> gym.Env:
    """Entry point of ``CompactCode-v0``: a :class:`~compactrl.envs.code_env.CodeRepoEnv` in
    :class:`~compactrl.wrappers.ContextBudget` (keywords: see :func:`make_env`)."""
    return make_env("CompactCode-v0", **kwargs)


def make_terminal_env(**kwargs: Any) -> gym.Env:
    """Entry point of ``CompactTerminal-v0``: a :class:`~compactrl.envs.terminal_env.TerminalEnv` in
    :class:`~compactrl.wrappers.ContextBudget` (keywords: see :func:`make_env`)."""
    return make_env("CompactTerminal-v0", **kwargs)


def _register(env_id: str, entry_point: str) -> None:
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=entry_point)


_register("CompactCode-v0", "compactrl.registration:make_code_env")
_register("CompactTerminal-v0", "compactrl.registration:make_terminal_env")
