"""Release archives a Dockerfile step downloads from a host this machine cannot reach, rebuilt at
prepare time from the same release published in a registry it can reach.

A ``RUN curl -fsSL <url> -o <file>`` (``wget -O``, ``wget -P``) of a URL in :data:`RELEASES` is replayed
as a copy of that file, made once and cached: ``<cache>/<file name>`` with a ``<file name>.json``
record (the URL it stands for, where it came from, the package's and the file's sha256). The rest of
the step (``unzip -q /tmp/kotlinc.zip -d /opt``) runs as written. Default cache:
``$COMPACTRL_DOWNLOADS`` or ``~/.cache/compactrl/downloads``; episodes never download.

The table holds what the published task sets need and a registry reachable here publishes:

* Kotlin's compiler, ``github.com/JetBrains/kotlin/releases/download/v<V>/kotlin-compiler-<V>.zip``
  (18 of the 87 tasks of one 2.x set): JetBrains publishes the same distribution on npm as
  ``kotlin-compiler@<V>`` (``bin/``, ``lib/``, ``license/``, ``build.txt``). The zip is rebuilt with
  the release's layout (everything under ``kotlinc/``, file modes kept) and ``build.txt`` checked
  against the version. The bytes of the zip differ from GitHub's; its files are npm's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "compactrl", "downloads")


class DownloadError(RuntimeError):
    """A release could not be rebuilt here; the message says why."""


@dataclass(frozen=True)
class Release:
    pattern: re.Pattern
    """The URL it stands for; its group ``v`` is the version."""
    source: str
    """Where the same release is fetched from, as a template (``npm:kotlin-compiler@{v}``)."""
    build: Callable[[str, str, str], None]
    """``build(package file, version, destination)`` writes the release's file."""


def cache_root(cache: str | None = None) -> str:
    return cache or os.environ.get("COMPACTRL_DOWNLOADS") or DEFAULT_CACHE


def _npm_pack(spec: str, dest: str, timeout_s: float) -> str:
    """``npm pack <spec>`` into ``dest`` (the registry's tarball, unchanged); its path."""
    if shutil.which("npm") is None:
        raise DownloadError(f"npm pack {spec}: npm is not installed here")
    try:
        res = subprocess.run(["npm", "pack", spec, "--silent", "--pack-destination", dest], capture_output=True,
                             text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DownloadError(f"npm pack {spec} timed out after {timeout_s:g}s") from None
    names = [n for n in res.stdout.split() if n.endswith(".tgz")]
    if res.returncode != 0 or not names or not os.path.isfile(os.path.join(dest, names[-1])):
        tail = " | ".join((res.stdout + res.stderr).strip().splitlines()[-2:])[-300:]
        raise DownloadError(f"npm pack {spec} failed: {tail}")
    return os.path.join(dest, names[-1])


def _kotlin_zip(tgz: str, version: str, dest: str) -> None:
    """npm's ``kotlin-compiler`` tarball (``package/...``) as the release zip (``kotlinc/...``)."""
    with tarfile.open(tgz) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith("package/") and (m.isfile() or m.isdir())]
        build = next((m for m in members if m.name == "package/build.txt"), None)
        if build is None or not any(m.name == "package/bin/kotlinc" for m in members):
            raise DownloadError(f"{os.path.basename(tgz)}: not Kotlin's compiler distribution (no bin/kotlinc, build.txt)")
        found = tf.extractfile(build).read().decode(errors="replace").strip()
        if not found.startswith(version):
            raise DownloadError(f"{os.path.basename(tgz)}: build.txt says {found!r}, expected {version}")
        with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
            for m in members:
                rel = m.name[len("package/"):]
                if not rel or ".." in rel.split("/") or rel == "package.json":
                    continue
                info = zipfile.ZipInfo("kotlinc/" + rel + ("/" if m.isdir() else ""),
                                       date_time=time.gmtime(max(m.mtime, 315532800))[:6])
                mode = m.mode or (0o755 if m.isdir() else 0o644)
                if rel.startswith("bin/") and m.isfile():
                    mode |= 0o755  # the release's launchers are executable
                info.external_attr = ((0o040000 if m.isdir() else 0o100000) | mode) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, b"" if m.isdir() else tf.extractfile(m).read())


RELEASES: tuple[Release, ...] = (
    Release(re.compile(r"https://github\.com/JetBrains/kotlin/releases/download/v(?P<v>\d+\.\d+\.\d+)/"
                       r"kotlin-compiler-(?P=v)\.zip"), "npm:kotlin-compiler@{v}", _kotlin_zip),
)


def release_for(url: str) -> tuple[Release, str] | None:
    """The table's entry for ``url`` and the release's version, or None."""
    for rel in RELEASES:
        m = rel.pattern.fullmatch(url)
        if m:
            return rel, m.group("v")
    return None


def cached(url: str, cache: str | None = None) -> str | None:
    """The file standing for ``url`` in the cache (its record present), or None. Never downloads."""
    path = os.path.join(cache_root(cache), os.path.basename(url))
    if not (os.path.isfile(path) and os.path.isfile(path + ".json")):
        return None
    with open(path + ".json", encoding="utf-8") as fh:
        return path if json.load(fh).get("url") == url else None


def fetch(url: str, cache: str | None = None, timeout_s: float = 900.0, echo=None) -> str:
    """The file standing for ``url``, rebuilt now from its registry when not cached (prepare time
    only). Raises :class:`DownloadError` (not in the table, the registry failed, not the release)."""
    have = cached(url, cache)
    if have:
        return have
    found = release_for(url)
    if found is None:
        raise DownloadError(f"{url}: no reachable source for it is known")
    rel, version = found
    source = rel.source.format(v=version)
    kind, spec = source.split(":", 1)
    root = cache_root(cache)
    os.makedirs(root, exist_ok=True)
    started = time.monotonic()
    if echo:
        echo(f"download: {url} rebuilt from {source}")
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
        if kind != "npm":
            raise DownloadError(f"{source}: unknown registry {kind!r}")
        package = _npm_pack(spec, tmp, timeout_s)
        out = os.path.join(tmp, os.path.basename(url))
        rel.build(package, version, out)
        dest = os.path.join(root, os.path.basename(url))
        os.chmod(out, 0o644)
        os.replace(out, dest)
        record = {"url": url, "source": source, "package": os.path.basename(package),
                  "package_sha256": _sha256(package), "sha256": _sha256(dest), "bytes": os.path.getsize(dest),
                  "fetched": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "seconds": round(time.monotonic() - started, 1)}
    with open(dest + ".json", "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1)
    return dest


def _sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


# curl/wget options that take a value, and those that name where the file goes
_CURL_VALUES = {"-H", "--header", "-A", "--user-agent", "-e", "--referer", "-u", "--user", "-X", "--request", "-d",
                "--data", "--retry", "--retry-delay", "--max-time", "-m", "--connect-timeout", "-w", "--write-out",
                "-x", "--proxy", "-b", "--cookie", "-c", "--cookie-jar", "--cacert", "-r", "--range", "-C",
                "--continue-at", "--retry-max-time", "-T", "--upload-file", "-K", "--config"}
_WGET_VALUES = {"-t", "--tries", "-T", "--timeout", "-U", "--user-agent", "--header", "-o", "--output-file", "-a",
                "--append-output", "-e", "--execute", "--wait", "-w", "--user", "--password"}


def download_target(words: list[str], workdir: str) -> tuple[str, str] | None:
    """``(url, destination path)`` of a ``curl``/``wget`` command that saves one URL to a file, else None
    (piped to a shell, several URLs, no file named)."""
    if not words or os.path.basename(words[0]) not in ("curl", "wget"):
        return None
    curl = os.path.basename(words[0]) == "curl"
    urls, dest, folder, remote_name, i = [], None, None, False, 1
    while i < len(words):
        w = words[i]
        if curl and w in ("-o", "--output") and i + 1 < len(words):
            dest, i = words[i + 1], i + 2
            continue
        if curl and re.fullmatch(r"-[a-zA-Z]{2,}", w):  # combined short flags: -fsSLo FILE, -LO
            remote_name = remote_name or "O" in w
            if w.endswith("o") and i + 1 < len(words):
                dest, i = words[i + 1], i + 2
                continue
        elif curl and w in ("-O", "--remote-name"):
            remote_name = True
        elif not curl and w in ("-O", "--output-document") and i + 1 < len(words):
            dest, i = words[i + 1], i + 2
            continue
        elif not curl and w.startswith("--output-document="):
            dest = w.split("=", 1)[1]
        elif not curl and w in ("-P", "--directory-prefix") and i + 1 < len(words):
            folder, i = words[i + 1], i + 2
            continue
        elif w.startswith("-"):
            i += 2 if w in (_CURL_VALUES if curl else _WGET_VALUES) else 1
            continue
        else:
            urls.append(w)
        i += 1
    if len(urls) != 1 or dest == "-":
        return None
    url = urls[0]
    if dest is None and (remote_name or not curl):
        dest = os.path.join(folder or ".", os.path.basename(url))
    if dest is None:
        return None
    return url, dest if dest.startswith("/") else os.path.normpath(os.path.join(workdir, dest))


__all__ = ["DEFAULT_CACHE", "RELEASES", "DownloadError", "Release", "cache_root", "cached", "download_target",
           "fetch", "release_for"]
