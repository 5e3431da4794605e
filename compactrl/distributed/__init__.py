"""Rollouts on Ray: :class:`RayCollector` (rollout workers as actors behind the collector's API, with
optional shared engine actors, :mod:`compactrl.distributed.engines`), the start-up of a local or
remote Ray for a run (:mod:`compactrl.distributed.cluster`), experiment cells as Ray tasks
(:func:`run_on_ray`); and :class:`ThreadCollector`, the same asynchronous collection on a thread of the
trainer's process."""

from compactrl.distributed.cluster import connect, local_ray, ray_for_run
from compactrl.distributed.collector import RayCollector, RolloutWorker, ThreadCollector
from compactrl.distributed.engines import (
    EngineClient,
    EngineLost,
    InferenceEngine,
    served_engine,
    vllm_engine,
)
from compactrl.distributed.tasks import run_on_ray

__all__ = ["EngineClient", "EngineLost", "InferenceEngine", "RayCollector", "RolloutWorker", "ThreadCollector", "connect",
           "local_ray", "ray_for_run", "run_on_ray", "served_engine", "vllm_engine"]
