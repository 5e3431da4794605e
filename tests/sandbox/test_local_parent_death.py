"""A process holding a started local sandbox that is killed outright (SIGKILL: no ``close()``, no
``finally``) takes the sandbox's shell and everything it runs with it, even while the shell is busy
with a command (it reads no end of input then). Before the fix, a SIGKILLed ``compactrl tasks
validate`` or ``eval --backend local`` left the shells (uid nobody) and their commands running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from sandbox_helpers import local_unavailable

pytestmark = pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))

_HOLDER = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from sandbox_helpers import small_task
from compactrl.sandbox.local import LocalSandbox

sb = LocalSandbox(isolation=sys.argv[1], timeout_s=600)
sb.start(small_task())
print(json.dumps({"ns": sb.pid_namespace, "outer": sb._proc.pid, "shell": sb._shell_pid,
                  "session": sb.session_dir}), flush=True)
sb.exec("sleep 600 & sleep 601", timeout_s=600)  # busy until killed
"""


def _isolations() -> list[str]:
    from compactrl.sandbox.local import _probe

    return [kind for kind in ("bwrap", "unshare") if _probe(kind, 65534) is None]


def _stat(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()


def _alive(pid: int, started: bytes | None) -> bool:
    """Process ``pid`` runs and is the one that started at ``started`` (a pid alone may be reused)."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in (b"Z", b"X") and fields[19] == started


def _commands(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append(f"{pid}: {cmd[:80]}")
    return out


@pytest.mark.parametrize("isolation", _isolations())
def test_a_sigkilled_holder_leaves_no_sandbox_process(isolation, tmp_path):
    from compactrl.sandbox.local import _ns_processes, _rmtree

    here = os.path.dirname(os.path.abspath(__file__))
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, isolation, here], stdout=subprocess.PIPE,
                              stderr=(tmp_path / "holder.err").open("wb"), text=True)
    info: dict = {}
    outer: tuple[int, bytes | None] = (0, None)  # the outer process: pid and start time
    try:
        line = holder.stdout.readline()
        assert line, f"the holder did not start its sandbox: {(tmp_path / 'holder.err').read_text()[-2000:]}"
        info = json.loads(line)
        outer = (info["outer"], (_stat(info["outer"]) or [None] * 20)[19])
        deadline = time.monotonic() + 60
        # the command runs (both sleeps started) before the holder is killed
        while sum("sleep 60" in c for c in _commands(_ns_processes(info["ns"]))) < 2:
            assert holder.poll() is None, (tmp_path / "holder.err").read_text()[-2000:]
            assert time.monotonic() < deadline, _commands(_ns_processes(info["ns"]))
            time.sleep(0.05)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        deadline = time.monotonic() + 20
        while (_ns_processes(info["ns"]) or _alive(*outer)) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _ns_processes(info["ns"])
        assert not left, f"{isolation}: the sandbox's processes outlived their holder: {_commands(left)}"
        assert not _alive(*outer), f"{isolation}: the sandbox's outer process {info['outer']} outlived its holder"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdout.close()
        if info:  # whatever survived (a failed check) is killed here, then the session's files removed
            for pid in _ns_processes(info["ns"]) + ([outer[0]] if _alive(*outer) else []):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while (_ns_processes(info["ns"]) or _alive(*outer)) and time.monotonic() < deadline:
                time.sleep(0.05)
            if info.get("session") and os.path.isdir(info["session"]):
                _rmtree(info["session"])
