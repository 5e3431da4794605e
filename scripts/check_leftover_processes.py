"""List the processes a run left alive, found by a marker in their environment; fail if there is one.

    python scripts/check_leftover_processes.py [--wait S] [--kill] PATTERN [PATTERN ...]

A process belongs to the run when one of its environment entries (``NAME=VALUE``) matches one of the
shell-style PATTERNs, e.g. ``COMPACTRL_TEST_RUN=1733370000-4242``: children inherit an exported
variable, and podman hands ``CONTAINERS_CONF`` to every conmon it starts, which otherwise leave the
process tree (they daemonise) and drop the rest of the environment. Only marked processes are looked
at, never a count over the host. This process and its ancestors (the script waiting for it) are not
the run's leftovers; zombies are dead and are left out.

Waits up to ``--wait`` seconds for the marked processes to end on their own, then prints one line per
survivor (pid, parent, age, command) and exits with status 1; with ``--kill`` the survivors are also
ended with SIGKILL. Exit status 0 when none is left.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import signal
import sys
import time

POLL_S = 0.2


def _read(pid: int, name: str) -> bytes | None:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:  # gone meanwhile, or not ours to read
        return None


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in clock ticks) from /proc/PID/stat."""
    raw = _read(pid, "stat")
    if raw is None:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1]), int(fields[19])


def _ancestors(pid: int) -> set[int]:
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        stat = _stat(pid)
        pid = stat[1] if stat else 0
    return seen


def marked_processes(patterns: list[str]) -> list[int]:
    """Live pids (not this process or its ancestors) whose environment matches one of ``patterns``."""
    mine = _ancestors(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        pid = int(entry)
        env, stat = _read(pid, "environ"), _stat(pid)
        if not env or stat is None or stat[0] in ("Z", "X"):
            continue
        entries = env.decode(errors="replace").split("\0")
        if any(fnmatch.fnmatchcase(e, p) for p in patterns for e in entries):
            found.append(pid)
    return sorted(found)


def describe(pid: int) -> str | None:
    """One line naming a live process, or None when it has ended (or is a zombie) by now."""
    stat = _stat(pid)
    cmd = (_read(pid, "cmdline") or b"").replace(b"\0", b" ").decode(errors="replace").strip()
    if stat is None or stat[0] in ("Z", "X") or _stat(pid) is None:  # ended while we read it
        return None
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    age = uptime - stat[2] / os.sysconf("SC_CLK_TCK")
    return f"pid {pid} (parent {stat[1]}, {age:.0f} s old): {cmd[:200]}"


def survivors(pids: list[int]) -> dict[int, str]:
    """The pids still alive now, each with its description: a process found at the last poll may
    have ended since, and one that ends as the wait runs out is not a leftover."""
    described = {pid: describe(pid) for pid in pids}
    return {pid: line for pid, line in described.items() if line is not None}


def wait_for_exit(patterns: list[str], timeout_s: float) -> list[int]:
    """Poll until no marked process is left or ``timeout_s`` has passed; the survivors."""
    deadline = time.monotonic() + timeout_s
    left = marked_processes(patterns)
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = marked_processes(patterns)
    return left


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("patterns", nargs="+", metavar="PATTERN", help="NAME=VALUE environment entry (shell glob)")
    parser.add_argument("--wait", type=float, default=0.0, help="seconds to let them end on their own")
    parser.add_argument("--kill", action="store_true", help="SIGKILL the survivors (still exits 1)")
    args = parser.parse_args(argv)
    bad = [p for p in args.patterns if "=" not in p]
    if bad:
        parser.error(f"PATTERN: expected NAME=VALUE, got {bad}")
    left = survivors(wait_for_exit(args.patterns, args.wait))
    if not left:
        return 0
    sys.stderr.write(f"{len(left)} process(es) of this run still alive after {args.wait:g} s:\n")
    for line in left.values():
        sys.stderr.write(f"  {line}\n")
    if args.kill:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        after_kill = survivors(wait_for_exit(args.patterns, 5.0))
        sys.stderr.write(f"killed them; {len(after_kill)} still alive\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
