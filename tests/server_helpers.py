"""Helpers for tests that start `compactrl serve|gateway` processes (imported by name: pytest puts
the tests folder on sys.path through its conftest)."""

import queue
import re
import subprocess
import threading


def server_url(proc: subprocess.Popen, timeout: float = 120.0) -> tuple[str, list[str]]:
    """The URL a ``compactrl serve|gateway --port 0`` process prints once its socket is bound, and
    the list its output keeps going into (read on a thread, so the server never blocks on a full pipe).

    Port 0 lets the kernel pick a free port that the server holds from then on; probing for a free
    port and passing it races with every other process on the host (bind, release, then someone
    else's bind)."""
    lines: list[str] = []
    found: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.append(line)
            if (m := re.search(r" on (http://[^/\s]+)/v1", line)) is not None:
                found.put(m.group(1))
        found.put(None)

    threading.Thread(target=pump, daemon=True).start()
    try:
        url = found.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"no address printed within {timeout} s: {''.join(lines)[-3000:]}") from None
    if url is None:
        raise RuntimeError(f"server exited with {proc.wait()}: {''.join(lines)[-3000:]}")
    return url, lines
