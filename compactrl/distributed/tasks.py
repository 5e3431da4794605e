"""Independent jobs (an experiment's cells: arm x seed x regime) as Ray tasks with bounded concurrency.

:func:`run_on_ray` is the Ray counterpart of running ``fn(spec)`` for each spec in a process pool:
at most ``max_concurrency`` tasks are in flight (each reserving ``num_cpus``), a spec that
``done(spec)`` reports finished is never started (so a resumed experiment skips its finished cells),
and the results come back in the specs' order. ``fn`` must write its own result atomically (a temp
file, then a rename), which is what makes ``done`` trustworthy after a crash; a task whose worker
dies is retried once by Ray, and a task that raises stops the run with its error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from compactrl.distributed.cluster import wait_one

log = logging.getLogger(__name__)


def run_on_ray(fn: Callable[[dict], Any], specs: Sequence[dict], *, max_concurrency: int,
               done: Callable[[dict], bool] = lambda spec: False, num_cpus: float = 1.0) -> list[Any]:
    """``fn(spec)`` for every spec not ``done``, at most ``max_concurrency`` at once; None for skipped specs."""
    import ray

    if max_concurrency < 1:
        raise ValueError(f"max_concurrency: expected >= 1, got {max_concurrency}")
    if not ray.is_initialized():
        raise RuntimeError("Ray is not running: start it with compactrl.distributed.local_ray() or connect()")
    remote = ray.remote(num_cpus=num_cpus, max_retries=1)(fn)
    todo = [i for i, spec in enumerate(specs) if not done(spec)]
    log.info("%d jobs, %d to run (%d finished)", len(specs), len(todo), len(specs) - len(todo))
    results: list[Any] = [None] * len(specs)
    in_flight: dict[Any, int] = {}
    while todo or in_flight:
        while todo and len(in_flight) < max_concurrency:
            i = todo.pop(0)
            in_flight[remote.remote(specs[i])] = i
        ready = wait_one(in_flight)
        i = in_flight.pop(ready)
        results[i] = ray.get(ready)  # a job's error stops the run, as a process pool's would
    return results
