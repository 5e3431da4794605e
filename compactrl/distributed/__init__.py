"""Rollouts on Ray: :class:`RayCollector` (rollout workers as actors behind the collector's API) and
the start-up of a local or remote Ray for a run (:mod:`compactrl.distributed.cluster`)."""

from compactrl.distributed.cluster import connect, local_ray, ray_for_run
from compactrl.distributed.collector import RayCollector, RolloutWorker

__all__ = ["RayCollector", "RolloutWorker", "connect", "local_ray", "ray_for_run"]
