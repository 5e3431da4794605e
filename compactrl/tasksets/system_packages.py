"""Host system packages, shared by the task sets: what this machine has (:func:`host_has_package`), what apt
would install (:func:`apt_decision`), installing it at prepare time (:func:`install_system_packages`, root only,
each command recorded), and the folders installed packages own (:func:`package_dirs`). The Terminal-Bench
loader names the packages a task's Dockerfile or reference solution installs (``Task.build.system_packages``,
:func:`install_for_tasks`); SWE-bench's prepare those its rows' install steps name."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time

from compactrl.sandbox.local import BASE_PATH_DIRS, host_toolchains

INSTALL_HINT = "; `compactrl tasks validate --install-system-packages` installs them here"
GO_PACKAGES = re.compile(r"^(golang|golang-go|golang-\d+\.\d+(-go)?)$")


def host_has_package(name: str) -> bool:
    """Installed here: by dpkg, or as a command of that name on PATH or in the toolchains the local
    sandbox mounts (``npm`` with Node's own install, ``rustc`` through rustup)."""
    # a Go toolchain package (golang-go, golang-1.22-go): any `go` the sandbox gets (its version is
    # checked against the task's separately)
    command = "go" if GO_PACKAGES.match(name) else name
    if shutil.which(command, path=":".join([*BASE_PATH_DIRS, *host_toolchains()[1]])):
        return True
    try:
        res = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", name], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0 and res.stdout.strip() == "installed"


def apt_decision(packages: list[str], has=None, candidate=None) -> dict[str, str]:
    """Per package: ``"installed"`` (here already), ``"installable"`` (apt has a candidate: ``--install-
    system-packages`` installs it at prepare) or ``"unavailable"`` (no candidate in this machine's apt
    sources: the task needs its image). ``has``/``candidate`` default to dpkg and ``apt-cache policy``."""
    has = has or host_has_package
    candidate = candidate or apt_candidate
    return {p: "installed" if has(p) else ("installable" if candidate(p) else "unavailable") for p in packages}


def apt_candidate(name: str) -> str | None:
    """The version apt would install (``apt-cache policy``), or None."""
    try:
        res = subprocess.run(["apt-cache", "policy", name], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Candidate:\s*(\S+)", res.stdout)
    return m.group(1) if m and m.group(1) != "(none)" else None


def install_system_packages(packages: list[str], record: str | None = None, echo=print) -> list[str]:
    """``apt-get install -y --no-install-recommends`` the packages (after one ``apt-get update``): at
    prepare time, never during an episode. Needs root. Each command is printed and appended, with
    its result, to ``record`` (JSON lines). Returns what is installed afterwards; raises
    ``RuntimeError`` with apt's last lines when apt fails."""
    if not packages:
        return []
    if os.geteuid() != 0:
        raise RuntimeError(f"installing system packages ({' '.join(packages)}) needs root: run as root, or "
                           f"`apt-get install {' '.join(packages)}` yourself")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *packages]):
        echo("$ " + shlex.join(cmd))
        started = time.monotonic()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
        if record:
            os.makedirs(os.path.dirname(os.path.abspath(record)), exist_ok=True)
            with open(record, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": cmd,
                                     "exit_code": res.returncode, "seconds": round(time.monotonic() - started, 1),
                                     "tail": (res.stdout + res.stderr).strip().splitlines()[-5:]}) + "\n")
        if res.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)} failed ({res.returncode}): "
                               + " | ".join((res.stdout + res.stderr).strip().splitlines()[-3:]))
    return [p for p in packages if host_has_package(p)]


SYSTEM_PACKAGES_RECORD = os.path.join(os.path.expanduser("~"), ".cache", "compactrl", "system-packages.jsonl")


def install_for_tasks(tasks, echo=print, record: str | None = None) -> list[str]:
    """Install (apt) the system packages that tasks' Dockerfiles or reference solutions install and
    this machine lacks (``Task.build.system_packages``, set by the Terminal-Bench loader), when apt
    has them; prints what it does and what apt lacks. Returns the packages installed (the caller loads
    the tasks again: they are then planned with the packages present)."""
    wanted: list[str] = []
    for task in tasks:
        error = (task.build.error if task.build else None) or ""
        if error and INSTALL_HINT not in error:
            continue  # something else stops it (network, its image): the packages would not help
        wanted += [p for p in (task.build.system_packages if task.build else ()) if p not in wanted]
    if not wanted:
        echo("system packages: every package the tasks install is on this machine")
        return []
    decision = apt_decision(wanted)
    unavailable = [p for p, d in decision.items() if d == "unavailable"]
    if unavailable:
        echo(f"system packages apt has no candidate for (those tasks stay not gradable): {' '.join(unavailable)}")
    todo = [p for p, d in decision.items() if d == "installable"]
    if not todo:
        return []
    echo(f"installing system packages for {sum(bool(t.build and t.build.system_packages) for t in tasks)} task(s): "
         f"{' '.join(todo)} (recorded in {record or SYSTEM_PACKAGES_RECORD})")
    return install_system_packages(todo, record or SYSTEM_PACKAGES_RECORD, echo)


_PACKAGE_DIRS = re.compile(r"^/var/(?:lib|log|spool|cache|www)/[^/]+$|^/var/www$")


def package_dirs(packages: list[str]) -> list[str]:
    """The folders under ``/var`` that these installed packages, and the packages of the same source they
    depend on, own (``/var/lib/nginx``, ``/var/log/nginx`` of nginx-common for ``nginx``): where the image
    has them once the package is installed; the local sandbox has no ``/var`` of this machine's."""
    out: list[str] = []
    for name in packages:
        source, _, depends = _dpkg_query("-W", "-f=${source:Package}\n${Depends}", name).partition("\n")
        if not source:
            continue
        deps = sorted({d.strip().split()[0].split(":")[0] for d in re.split(r"[,|]", depends) if d.strip()} - {name})
        # one query for every dependency's source package (a package apt does not have is left out of its output)
        sources = dict(line.split("\t", 1) for line in _dpkg_query(
            "-W", "-f=${Package}\t${source:Package}\n", *deps).splitlines() if "\t" in line) if deps else {}
        same = [name] + [d for d in deps if sources.get(d) == source]
        out += [p for p in _dpkg_query("-L", *same).splitlines() if _PACKAGE_DIRS.match(p) and os.path.isdir(p)]
    return list(dict.fromkeys(out))


def _dpkg_query(*args: str) -> str:
    """``dpkg-query``'s output ('' where it cannot run); a package it does not know is left out of it."""
    try:
        return subprocess.run(["dpkg-query", *args], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
