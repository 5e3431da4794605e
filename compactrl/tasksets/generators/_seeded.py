"""What every seeded task generator shares: splits as seed sets, task labels, a cache, a sampler.

The generators differ only in their presets and in the pure function ``(config, label, seed) ->
Task`` that builds a task; keeping the rest here means every generator splits, labels and caches
its tasks the same way, so a seed means the same split whichever kind of task it draws.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any, Generic, TypeVar

import numpy as np

from compactrl.task import Task

SPLITS = ("train", "val", "test")

ConfigT = TypeVar("ConfigT")


def task_seed_for(split: str, index: int) -> int:
    """Seed of task ``index`` of ``split``; the splits' seed sets are disjoint (``index*3 + k``)."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
    if index < 0:
        raise ValueError(f"index: expected >= 0, got {index}")
    return index * len(SPLITS) + SPLITS.index(split)


def split_of_seed(seed: int) -> str:
    """Inverse of :func:`task_seed_for` for the split."""
    return SPLITS[seed % len(SPLITS)]


def config_record(config: Any, run_time_fields: tuple[str, ...]) -> dict[str, Any]:
    """``config``'s fields as JSON-ready values, each of ``run_time_fields`` only when it differs from
    its default: tasks of configs that leave those knobs off serialise, and are labelled, exactly as
    before the knobs existed."""
    out = json.loads(json.dumps(asdict(config)))
    for name in run_time_fields:
        if out[name] == getattr(type(config), name):
            del out[name]
    return out


def resolve_preset(
    difficulty: str | ConfigT, presets: Mapping[str, ConfigT], config_type: type[ConfigT]
) -> ConfigT:
    """The config of a preset name, or ``difficulty`` itself when it is already a config."""
    if isinstance(difficulty, config_type):
        return difficulty
    if difficulty not in presets:
        raise ValueError(
            f"difficulty: expected one of {sorted(presets)} or a {config_type.__name__}, got {difficulty!r}"
        )
    return presets[difficulty]


class SeededGenerator(Generic[ConfigT]):
    """``generate(seed) -> Task``, pure and reproducible, with an LRU cache of recent tasks.

    ``config`` is a frozen dataclass with a ``name``; ``build(config, label, seed)`` makes the task.
    A preset's tasks are labelled by its name, any other config's by its name and a 32-bit digest
    of its fields (of ``config.record()`` where the config has one), so tasks of two custom configs that share a name still get distinct ids. The
    cache spares rebuilding a task whose seed comes back (a fixed eval index, a reset to a task).
    """

    def __init__(
        self,
        config: ConfigT,
        presets: Mapping[str, ConfigT],
        build: Callable[[ConfigT, str, int], Task],
        cache_size: int,
    ) -> None:
        self.config = config
        record = config.record() if hasattr(config, "record") else asdict(config)
        digest = hashlib.blake2b(json.dumps(record, sort_keys=True).encode(), digest_size=4)
        self.label = config.name if config in presets.values() else f"{config.name}-{digest.hexdigest()}"
        self._build, self._cache_size = build, cache_size
        self._cache: OrderedDict[int, Task] = OrderedDict()

    def generate(self, seed: int) -> Task:
        seed = int(seed)
        task = self._cache.get(seed)
        if task is None:
            task = self._build(self.config, self.label, seed)
            self._cache[seed] = task
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return task


class GeneratedTasks:
    """A task sampler over one split of a generator (the envs' default task source)."""

    def __init__(self, generator: SeededGenerator[Any], split: str = "train") -> None:
        task_seed_for(split, 0)  # validates the split name
        self.generator, self.split = generator, split

    def sample(self, rng: np.random.Generator) -> Task:
        return self.task(int(rng.integers(0, 2**31 - 1)))

    def task(self, index: int) -> Task:
        return self.generator.generate(task_seed_for(self.split, index))
