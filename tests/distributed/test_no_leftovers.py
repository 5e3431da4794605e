"""A Ray started for a run leaves nothing behind: no process of its session, no temp dir, no /dev/shm object.

Each test runs Ray in a child process with TMPDIR set to a fresh short directory: every Ray daemon
of that session names the directory on its command line, so the test finds exactly its own
processes (never the session fixture's or anyone else's).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]

COLLECT = """
import sys
from compactrl.algos import trainer as T
from compactrl.algos.config import preset
from compactrl.distributed import RayCollector, local_ray
from compactrl.policies.scripted import OraclePolicy

with local_ray(num_cpus=1, object_store_bytes=128 * 1024**2) as temp_dir:
    print(temp_dir, flush=True)
    rc = RayCollector(T.make_env_fns(preset("smoke").env, split="train", count=1), lambda i: OraclePolicy(),
                      num_workers=1, episodes_per_batch=2)
    batch = rc.next()
    rc.shutdown()
    assert batch is not None and rc.last_batch_stats["episodes"] == 2
"""


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:  # the process ended while we looked
                continue
            if text.encode() in cmdline:
                found.append(int(entry.name))
    return found


def _wait_gone(text: str, timeout_s: float = 15.0) -> list[int]:
    """Ray's daemons exit asynchronously after shutdown: poll until none is left or time runs out."""
    deadline = time.monotonic() + timeout_s
    while (left := _processes_naming(text)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _shm() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if "plasma" in n or "ray" in n} if os.path.isdir("/dev/shm") else set()


def _run(args: list[str], tmp: str) -> subprocess.CompletedProcess:
    # a child of a fresh shell: not the address switch that the session's own local Ray (the ray_cluster
    # fixture, when another test file started it first) has set in this process's environment
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"} | {"TMPDIR": tmp}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)


def _check_nothing_left(tmp: str, shm_before: set[str]) -> None:
    assert _wait_gone(tmp) == [], "Ray processes of the run are still alive"
    assert not [p for p in Path(tmp).iterdir() if p.name.startswith("crl-ray-")], "Ray's temp dir is left"
    assert _shm() <= shm_before, "Ray left objects in /dev/shm"


def _short_tmp() -> str:
    """A fresh directory short enough for Ray's socket paths (a test runner's TMPDIR may not be)."""
    return tempfile.mkdtemp(prefix="crlt", dir="/tmp")


def test_local_ray_and_a_collector_leave_nothing_behind():
    tmp = _short_tmp()
    shm_before = _shm()
    out = _run([sys.executable, "-c", COLLECT], tmp)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[0].startswith(tmp)
    _check_nothing_left(tmp, shm_before)
    shutil.rmtree(tmp)


@pytest.mark.slow
@pytest.mark.parametrize("workers,engines", [(2, 0), (1, 1)], ids=["workers", "worker+engine"])
def test_train_with_ray_runs_the_rollouts_on_workers_and_leaves_nothing_behind(workers, engines):
    import json

    tmp = _short_tmp()
    shm_before = _shm()
    out = _run([sys.executable, "-m", "compactrl.cli", "train", "--preset", "smoke", "--ray",
                "--distributed.num_rollout_workers", str(workers), "--distributed.envs_per_worker", "1",
                "--distributed.num_engines", str(engines), "--rl.iterations", "1", "--out", f"{tmp}/run",
                "--no-progress"], tmp)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["train/rollout_workers"] == workers and rows[-1]["train/episodes"] >= 1
    assert rows[-1].get("train/engines", 0.0) == engines
    _check_nothing_left(tmp, shm_before)
    shutil.rmtree(tmp)


def test_train_refuses_workers_without_a_ray(tmp_path, capsys):
    import argparse

    from compactrl.algos import train_cli

    def run(*argv):
        parser = argparse.ArgumentParser()
        train_cli.add_arguments(parser)
        return train_cli.run(parser.parse_args(["--preset", "smoke", "--out", str(tmp_path / "run"), *argv]))

    assert run("--distributed.num_rollout_workers", "2") == 2
    assert "needs a Ray: add --ray" in capsys.readouterr().out
    assert run("--ray") == 2
    assert "distributed.num_rollout_workers: expected >= 1" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()


LISTENERS = """
import os, ray
from pathlib import Path
from compactrl.distributed import local_ray

def listening(pids):
    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        inodes |= {l[8:-1] for l in links if l.startswith("socket:[")}
    addrs = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # state LISTEN, owned by a Ray process
                addrs.append(f[1].split(":")[0])
    return addrs

with local_ray(num_cpus=1, object_store_bytes=128 * 1024**2) as temp_dir:
    print(ray.util.get_node_ip_address())
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
            and temp_dir.encode() in (p / "cmdline").read_bytes()] + [os.getpid()]
    print(",".join(sorted(set(listening(pids)))))
print(os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), ray._private.ray_constants.ENABLE_RAY_CLUSTER)
"""

LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
"""127.0.0.1 and ::ffff:127.0.0.1 / ::1 as /proc/net/tcp{,6} write them."""


def test_local_ray_listens_on_loopback_only_and_restores_the_address_switch():
    tmp = _short_tmp()
    out = _run([sys.executable, "-c", LISTENERS], tmp)
    assert out.returncode == 0, out.stderr[-3000:]
    node, listeners, env, switch = out.stdout.split()
    assert node == "127.0.0.1" and (env, switch) == ("None", "True")
    assert listeners and set(listeners.split(",")) <= LOOPBACK, f"Ray listens beyond loopback: {listeners}"
    _check_nothing_left(tmp, _shm())
    shutil.rmtree(tmp)
