"""A Ray started for a run leaves nothing behind: no process of its session, no temp dir, no /dev/shm object.

Each test runs Ray in a child process with TMPDIR set to a fresh short directory: every Ray daemon
of that session names the directory on its command line, so the test finds exactly its own
processes (never the session fixture's or anyone else's).
"""

from __future__ import annotations

import json
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
from compactrl.training import rollouts as T
from compactrl.training.config import preset
from compactrl.distributed import RayCollector, local_ray
from compactrl.policies.scripted.code import OraclePolicy

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


def _shm_in_use() -> set[str]:
    """The /dev/shm objects a live process holds open or mapped: another Ray's (a parallel test worker,
    another job on the machine), not leftovers of the run checked."""
    held = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:  # the process may end between the listing and the reads
            with open(f"/proc/{entry}/maps", "rb") as f:
                held.update(line.split(b"/dev/shm/", 1)[1].split()[0] for line in f if b"/dev/shm/" in line)
            for fd in os.listdir(f"/proc/{entry}/fd"):
                link = os.readlink(f"/proc/{entry}/fd/{fd}")
                if link.startswith("/dev/shm/"):
                    held.add(link[9:].split()[0].encode())
        except OSError:
            continue
    return {h.decode(errors="replace") for h in held}


def _run(args: list[str], tmp: str) -> subprocess.CompletedProcess:
    # a child of a fresh shell: not the address switch that the session's own local Ray (the ray_cluster
    # fixture, when another test file started it first) has set in this process's environment
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"} | {"TMPDIR": tmp}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)


def _check_nothing_left(tmp: str, shm_before: set[str]) -> None:
    assert _wait_gone(tmp) == [], "Ray processes of the run are still alive"
    assert not [p for p in Path(tmp).iterdir() if p.name.startswith("crl-ray-")], "Ray's temp dir is left"
    left = _shm() - shm_before
    assert not left - _shm_in_use(), f"Ray left objects in /dev/shm: {sorted(left - _shm_in_use())}"


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


def _train_with_ray(tmp: str, *argv: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = _run([sys.executable, "-m", "compactrl.cli", "train", "--preset", "smoke", *argv, "--rl.iterations", "1",
                "--out", f"{tmp}/run", "--no-progress"], tmp)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    rows = [json.loads(line) for line in Path(f"{tmp}/run/metrics.jsonl").read_text().splitlines()]
    return out, rows


def test_train_with_ray_alone_picks_a_worker_per_cpu_says_so_and_leaves_nothing_behind():
    """``compactrl train --preset smoke --ray`` with no worker count: one worker per CPU Ray sees."""
    tmp = _short_tmp()
    shm_before = _shm()
    out, rows = _train_with_ray(tmp, "--ray")
    cpus = os.cpu_count() or 1  # what the local Ray is started with
    assert f"distributed.num_rollout_workers={cpus} (Ray sees {cpus} CPU(s); set " in out.stdout, out.stdout[-2000:]
    assert rows[-1]["train/rollout_workers"] == cpus and rows[-1]["train/episodes"] >= 1
    assert json.loads(Path(f"{tmp}/run/config.json").read_text())["distributed"]["num_rollout_workers"] == cpus
    _check_nothing_left(tmp, shm_before)
    shutil.rmtree(tmp)


@pytest.mark.slow
@pytest.mark.parametrize("workers,engines", [(2, 0), (1, 1)], ids=["workers", "worker+engine"])
def test_train_with_ray_runs_the_rollouts_on_workers_and_leaves_nothing_behind(workers, engines):
    tmp = _short_tmp()
    shm_before = _shm()
    _, rows = _train_with_ray(tmp, "--ray", "--distributed.num_rollout_workers", str(workers),
                              "--distributed.envs_per_worker", "1", "--distributed.num_engines", str(engines))
    assert rows[-1]["train/rollout_workers"] == workers and rows[-1]["train/episodes"] >= 1
    assert rows[-1].get("train/engines", 0.0) == engines
    _check_nothing_left(tmp, shm_before)
    shutil.rmtree(tmp)


@pytest.mark.slow
def test_train_with_workers_alone_starts_a_local_ray_and_says_so():
    tmp = _short_tmp()
    shm_before = _shm()
    out, rows = _train_with_ray(tmp, "--distributed.num_rollout_workers", "1")
    assert "distributed.num_rollout_workers=1: starting a local Ray" in out.stdout
    assert rows[-1]["train/rollout_workers"] == 1
    _check_nothing_left(tmp, shm_before)
    shutil.rmtree(tmp)


def test_the_default_worker_count_leaves_the_engines_their_cpus():
    from compactrl.training.cli import choose_workers

    assert [choose_workers(2, 0), choose_workers(2.0, 1), choose_workers(16, 4)] == [2, 1, 12]
    with pytest.raises(ValueError, match=r"distributed.num_rollout_workers: Ray sees 1 CPU\(s\) and "
                                         r"distributed.num_engines=1"):
        choose_workers(1, 1)


def test_train_ray_flags_that_cannot_work_are_refused_before_anything_starts(tmp_path, capsys):
    import argparse

    from compactrl.training import cli as train_cli

    def run(*argv):
        parser = argparse.ArgumentParser()
        train_cli.add_arguments(parser)
        return train_cli.run(parser.parse_args(["--preset", "smoke", "--out", str(tmp_path / "run"), *argv]))

    assert run("--ray", "--ray-address", "auto") == 2
    assert "give one of them" in capsys.readouterr().out
    assert run("--ray", "--rollout.source", "mini_swe_agent", "--env.backend", "local") == 2
    assert "drop --ray" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()


def test_config_from_args_with_ray_validates_engines_before_the_worker_count_is_chosen():
    import argparse

    from compactrl.training import cli as train_cli

    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    cfg = train_cli.config_from_args(parser.parse_args(["--preset", "smoke", "--ray", "--distributed.num_engines", "1"]))
    assert cfg.distributed.num_engines == 1 and cfg.distributed.num_rollout_workers >= 1
    given = train_cli.config_from_args(parser.parse_args(["--preset", "smoke", "--ray",
                                                          "--distributed.num_rollout_workers", "3"]))
    assert given.distributed.num_rollout_workers == 3


LISTENERS = """
import os, ray
from pathlib import Path
from compactrl.distributed import local_ray

def read(path, reader):
    # any process, and any of its fds, may end between the listing and the read
    try:
        return reader(path)
    except OSError:
        return None

def listening(pids):
    inodes = set()
    for pid in pids:
        for fd in read(f"/proc/{pid}/fd", os.listdir) or ():
            link = read(f"/proc/{pid}/fd/{fd}", os.readlink) or ""
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    addrs = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # state LISTEN, owned by a Ray process
                addrs.append(f[1].split(":")[0])
    return addrs

with local_ray(num_cpus=1, object_store_bytes=128 * 1024**2) as temp_dir:
    print(ray.util.get_node_ip_address())
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()
            and temp_dir.encode() in (read(f"/proc/{p}/cmdline", lambda f: Path(f).read_bytes()) or b"")]
    pids.append(os.getpid())
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
