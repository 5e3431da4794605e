"""Starting and stopping Ray for a run.

:func:`local_ray` starts a private single-machine Ray and tears it down on exit: bound to the
loopback interface (Ray's daemons listen on every interface unless told otherwise), no dashboard,
no usage statistics, an object store of a stated size (Ray's default is 30% of RAM in /dev/shm)
and a temp dir of its own that is removed afterwards. :func:`connect` joins an existing cluster
(``ray start --head`` on the head node); leaving it disconnects and leaves the cluster running.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

log = logging.getLogger(__name__)

MAX_TEMP_ROOT = 24
"""Longest temp root Ray's socket paths fit under (``<root>/crl-ray-XXXXXXXX/session_<date>_<time>_<us>_<pid>/
sockets/plasma_store`` must stay within the 107 bytes of a unix socket path)."""

DEFAULT_OBJECT_STORE_BYTES = 512 * 1024**2
"""Object store of a local Ray: one batch of traces and one copy of a small model's weights fit many
times over, and /dev/shm is left for the sandboxes."""


@contextlib.contextmanager
def local_ray(num_cpus: int | None = None, *, object_store_bytes: int = DEFAULT_OBJECT_STORE_BYTES,
              temp_root: str | None = None) -> Iterator[str]:
    """A private local Ray for the ``with`` block; yields its temp dir.

    ``num_cpus`` defaults to the machine's. The temp dir is made under ``temp_root`` (default
    TMPDIR, or ``/tmp`` when TMPDIR is longer than :data:`MAX_TEMP_ROOT` characters): Ray puts unix
    sockets there, ~80 characters below the root, and a socket path may not exceed 107 bytes.
    """
    import ray

    if ray.is_initialized():
        raise RuntimeError("a Ray session is already running in this process; use it or shut it down first")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # read by ray.init and the daemons it starts
    # Ray takes the node's address from this flag (off: 127.0.0.1, as on a laptop) rather than from
    # init arguments, which turn 127.0.0.1 into the routable address
    saved = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), ray._private.ray_constants.ENABLE_RAY_CLUSTER
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False
    root = temp_root or tempfile.gettempdir()
    if len(root) > MAX_TEMP_ROOT:
        log.info("Ray's temp dir goes under /tmp: %s is too long for its socket paths", root)
        root = "/tmp"
    temp_dir = tempfile.mkdtemp(prefix="crl-ray-", dir=root)
    try:
        ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False,
                 object_store_memory=object_store_bytes, _temp_dir=temp_dir, log_to_driver=False,
                 configure_logging=False)
        yield temp_dir
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        # a later connect() in this process must see a routable address again
        if saved[0] is None:
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = saved[0]
        ray._private.ray_constants.ENABLE_RAY_CLUSTER = saved[1]


@contextlib.contextmanager
def connect(address: str) -> Iterator[None]:
    """Join the running cluster at ``address`` (e.g. ``10.0.0.1:6379`` or ``auto``) for the block."""
    import ray

    if not address:
        raise ValueError("ray.address: expected a cluster address (host:port or 'auto'), got ''")
    ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@contextlib.contextmanager
def ray_for_run(address: str = "", num_cpus: int | None = None) -> Iterator[None]:
    """``connect(address)`` when given, else :func:`local_ray`; nothing when Ray already runs here."""
    import ray

    if ray.is_initialized():
        yield
    elif address:
        with connect(address):
            yield
    else:
        with local_ray(num_cpus):
            yield


WAIT_RETRIES = 3
"""Times :func:`wait_one` repeats a ``ray.wait`` that raised ``SystemError``."""


def wait_one(refs, *, retries: int = WAIT_RETRIES, timeout: float | None = None):
    """The first of ``refs`` to finish (``ray.wait(refs, num_returns=1)``); None when ``timeout`` seconds pass
    first.

    Ray's ``CoreWorker.wait`` was seen raising ``SystemError`` ("returned a result with an exception
    set") in the driver while an actor it waited on was dying (once, under the test suite at load
    ~4). A wait consumes nothing, so a failed one is repeated, ``retries`` times, before the error
    propagates; the dead actor's call then shows up as ready and its ``ray.get`` raises the
    ``RayActorError`` the callers handle.
    """
    import ray

    for attempt in range(retries + 1):
        try:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=timeout)
            return ready[0] if ready else None
        except SystemError as exc:
            if attempt == retries:
                raise
            log.warning("ray.wait raised %r; waiting again (%d of %d)", exc, attempt + 1, retries)
    raise AssertionError("unreachable")
