"""Base images of task Dockerfiles, mapped per family to substitutes built without a registry.

Terminal-Bench task images start ``FROM`` public bases (``ghcr.io/laude-institute/t-bench/...``,
``python:3.12-slim``, ``ubuntu:24.04``, ``golang:1.22-bookworm``...). Where no container registry can
be reached, the docker backend builds each base's **family substitute** instead and builds the
task's own Dockerfile on top of it (:func:`substitute_for`, used by
:func:`compactrl.tasksets.terminal_bench.image_build.build_task_image`). A substitute is made of:

* an **OS root**: Debian or Ubuntu, bootstrapped with ``debootstrap --variant=minbase`` from the
  distribution's mirror (the only network it needs) and imported into the engine
  (``compactrl-root/<distro>-<suite>``); Ubuntu's archive key is checked against its published
  fingerprint before anything is trusted;
* what the family promises on top: the **CPython version** of the tag, copied from an interpreter of
  that version on this machine (``pyenv`` or ``uv`` installs, same distribution and libc) into
  ``/usr/local`` as the official ``python`` images have it, else the distribution's python3 (noted);
  build tools (``gcc``, ``buildpack-deps``), a **Go toolchain** of the tag's line (Ubuntu 24.04's
  builds, 1.21 to 1.26, copied from a build stage), Node.js, a JDK; the family's
  ``WORKDIR`` and environment;
* this machine's CA bundle, added to the image's trusted certificates (``update-ca-certificates``
  keeps it when a task installs ``ca-certificates``), so a ``pip install`` or ``apt-get`` in the
  task's Dockerfile trusts what the machine's own clients trust (a proxy with its own CA).

Substitutes are cached in the engine under a tag carrying the digest of their recipe and inputs, so
each is built once. :data:`FAMILIES` lists every family with what its substitute matches and does
not match (docs/task_formats.md, "Base images"); ``python -m compactrl.tasksets.terminal_bench.base_images``
lists them, surveys the bases of a set of task folders, and builds substitutes ahead of time.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import hashlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request

from compactrl.sandbox.docker import GRADER_DEPS_DIR, GRADER_DIR, GRADER_PYTHON_DIR

log = logging.getLogger(__name__)

ROOT_REPO = "compactrl-root"
ROOT_LAYOUT = "2"
"""Version of what :func:`build_root` puts in a root (a cached root of another version is rebuilt)."""
SUBSTITUTE_REPO = "compactrl-base"
GRADER_PIP_DIR = "/opt/compactrl/grader-pip"
"""The grader's pip, apart from :data:`GRADER_DIR` (which is on the tests' ``PYTHONPATH``): a test that
imports pip must see the image's (broken-python's image has none)."""
_GRADER_PY = f'"$(command -v python3 || echo {GRADER_PYTHON_DIR}/bin/python3)"'
GRADER_PYTHON_VERSIONS = ("3.12", "3.13", "3.11")
"""A CPython for the tests of an image without one, the first of these this machine has."""
CACHE_DIR = os.environ.get("COMPACTRL_CACHE", "/var/cache/compactrl")
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Ubuntu Archive Automatic Signing Key (2018) <ftpmaster@ubuntu.com>: the key that signs the
# archive's Release files since 18.04; a keyring without it is refused.
UBUNTU_ARCHIVE_KEY = "F6ECB3762474EDA9D21B7022871920D1991BC93C"


def dockerfile_bases(text: str) -> list[tuple[int, str]]:
    """``(line index, image)`` of each ``FROM`` naming an image (not an earlier stage, not ``scratch``)."""
    out, stages = [], {"scratch"}
    for i, line in enumerate(text.splitlines()):
        words = line.split()
        if len(words) < 2 or words[0].upper() != "FROM":
            continue
        words = [w for w in words[1:] if not w.startswith("--")]
        if len(words) >= 3 and words[1].upper() == "AS":
            stages.add(words[2].lower())
        if words and words[0].lower() not in stages:
            out.append((i, words[0]))
    return out


# ------------------------------------------------------------------------------ OS roots
@dataclasses.dataclass(frozen=True)
class Root:
    """An OS root file system that ``debootstrap`` makes from a distribution's mirror."""

    distro: str
    suite: str
    mirror: str
    script: str | None = None
    """debootstrap script to use (Ubuntu suites newer than the host's debootstrap: ``gutsy``)."""

    @property
    def name(self) -> str:
        return f"{self.distro}-{self.suite}"

    @property
    def tag(self) -> str:
        return f"{ROOT_REPO}/{self.name}:minbase"

    def sources(self) -> tuple[str, str]:
        """``(path, text)`` of the apt sources the official image of this release ships: the release,
        its updates and security suites (Ubuntu: and backports; main, restricted, universe,
        multiverse), from this root's mirror (security from the distribution's security host unless
        a mirror was set)."""
        if self.distro == "debian":
            security = self.mirror.rstrip("/") + "-security"
            suites = [(self.mirror, f"{self.suite} {self.suite}-updates"), (security, f"{self.suite}-security")]
            comps, keyring = "main", "/usr/share/keyrings/debian-archive-keyring.gpg"
        else:
            security = self.mirror if os.environ.get("COMPACTRL_UBUNTU_MIRROR") else "http://security.ubuntu.com/ubuntu"
            suites = [(self.mirror, f"{self.suite} {self.suite}-updates {self.suite}-backports"),
                      (security, f"{self.suite}-security")]
            comps, keyring = "main restricted universe multiverse", "/usr/share/keyrings/ubuntu-archive-keyring.gpg"
        if self.suite in ("bookworm", "noble"):  # deb822, as those images have it
            path = f"etc/apt/sources.list.d/{self.distro}.sources"
            text = "\n".join(f"Types: deb\nURIs: {uri}\nSuites: {s}\nComponents: {comps}\nSigned-By: {keyring}\n"
                             for uri, s in suites)
        else:
            path = "etc/apt/sources.list"
            text = "".join(f"deb {uri} {suite} {comps}\n" for uri, ss in suites for suite in ss.split())
        return path, text


def _mirror(distro: str, default: str) -> str:
    return os.environ.get(f"COMPACTRL_{distro.upper()}_MIRROR", default)


ROOTS = {
    r.name: r for r in (
        Root("debian", "bookworm", _mirror("debian", "http://deb.debian.org/debian")),
        Root("debian", "bullseye", _mirror("debian", "http://deb.debian.org/debian")),
        Root("ubuntu", "noble", _mirror("ubuntu", "http://archive.ubuntu.com/ubuntu"), script="gutsy"),
        Root("ubuntu", "jammy", _mirror("ubuntu", "http://archive.ubuntu.com/ubuntu"), script="gutsy"),
        Root("ubuntu", "focal", _mirror("ubuntu", "http://archive.ubuntu.com/ubuntu"), script="gutsy"),
    )
}


def _run(argv: list[str], what: str, timeout: float = 3600, **kw) -> str:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    except FileNotFoundError:
        raise RuntimeError(f"{what}: {argv[0]} is not installed on this machine") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what}: {argv[0]} ran past {timeout:.0f} s") from None
    if res.returncode != 0:
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{what}: {' '.join(argv[:3])}... exited {res.returncode}:\n{tail}")
    return res.stdout


def ubuntu_keyring(cache_dir: str = CACHE_DIR, mirror: str | None = None) -> str:
    """A keyring holding Ubuntu's archive key alone (checked by fingerprint), for debootstrap.

    Taken from ``/usr/share/keyrings/ubuntu-archive-keyring.gpg`` when the machine has it, else from
    the ``ubuntu-keyring`` package on the mirror; the key with :data:`UBUNTU_ARCHIVE_KEY`'s
    fingerprint is exported alone, so nothing else in that package is trusted."""
    out = os.path.join(cache_dir, "ubuntu-archive-2018.gpg")
    if os.path.isfile(out):
        return out
    os.makedirs(cache_dir, exist_ok=True)
    mirror = mirror or ROOTS["ubuntu-noble"].mirror
    with tempfile.TemporaryDirectory() as tmp:
        source = "/usr/share/keyrings/ubuntu-archive-keyring.gpg"
        if not os.path.isfile(source):
            index = _fetch(f"{mirror}/dists/noble/main/binary-amd64/Packages.xz")
            import lzma

            text = lzma.decompress(index).decode("utf-8", "replace")
            block = re.search(r"^Package: ubuntu-keyring\n(?:.+\n)*?Filename: (\S+)", text, re.M)
            if not block:
                raise RuntimeError(f"no ubuntu-keyring package in {mirror}'s noble index")
            deb = os.path.join(tmp, "keyring.deb")
            with open(deb, "wb") as fh:
                fh.write(_fetch(f"{mirror}/{block.group(1)}"))
            _run(["dpkg-deb", "-x", deb, os.path.join(tmp, "x")], "unpacking ubuntu-keyring")
            source = os.path.join(tmp, "x", "usr/share/keyrings/ubuntu-archive-keyring.gpg")
        home = os.path.join(tmp, "gnupg")
        os.makedirs(home, mode=0o700)
        gpg = ["gpg", "--batch", "--quiet", "--homedir", home]
        _run([*gpg, "--import", source], "reading Ubuntu's keyring")
        listed = _run([*gpg, "--with-colons", "--list-keys"], "reading Ubuntu's keyring")
        if f"fpr:::::::::{UBUNTU_ARCHIVE_KEY}:" not in listed:
            raise RuntimeError(f"Ubuntu's keyring ({source}) lacks the archive key {UBUNTU_ARCHIVE_KEY}")
        key = subprocess.run([*gpg, "--export", UBUNTU_ARCHIVE_KEY], capture_output=True, check=True).stdout
    with open(out + ".tmp", "wb") as fh:
        fh.write(key)
    os.replace(out + ".tmp", out)
    return out


def _fetch(url: str, timeout: float = 120) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (http(s) mirrors only)
        return resp.read()


def build_root(client, root: Root, cache_dir: str = CACHE_DIR) -> str:
    """The engine's tag of ``root``, bootstrapped and imported if the engine lacks it.

    Needs root and ``debootstrap`` on this machine and the distribution's mirror."""
    try:
        client.images.get(root.tag)
        return root.tag
    except Exception:
        pass
    if os.geteuid() != 0:
        raise RuntimeError(f"building the OS root {root.name} needs root (debootstrap); run as root or "
                           f"import an image tagged {root.tag}")
    target = os.path.join(cache_dir, f"root-{root.name}")
    started = time.monotonic()
    marker = os.path.join(target, ".compactrl-complete")
    if not (os.path.isfile(marker) and open(marker).read().split()[-1:] == [ROOT_LAYOUT]):
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(cache_dir, exist_ok=True)
        argv = ["debootstrap", "--variant=minbase"]
        if root.distro == "ubuntu":
            argv.append(f"--keyring={ubuntu_keyring(cache_dir)}")
        argv += [root.suite, target, root.mirror]
        if root.script:
            argv.append(f"/usr/share/debootstrap/scripts/{root.script}")
        log.info("debootstrap %s from %s", root.name, root.mirror)
        _run(argv, f"bootstrapping {root.name}")
        path, text = root.sources()
        if path.endswith(".sources"):  # the one-line list debootstrap wrote would repeat the release
            with open(os.path.join(target, "etc/apt/sources.list"), "w") as fh:
                fh.write(f"# {root.distro} sources: /{path}\n")
        with open(os.path.join(target, path), "w") as fh:
            fh.write(text)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in glob.glob(os.path.join(target, junk, "*")):
                if os.path.isfile(path):
                    os.remove(path)
        with open(os.path.join(target, ".compactrl-complete"), "w") as fh:
            fh.write(f"{root.mirror} {root.suite} {ROOT_LAYOUT}\n")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in sorted(os.listdir(target)):
            if name != ".compactrl-complete":
                tar.add(os.path.join(target, name), arcname=name)
    repo, tag = root.tag.split(":")
    reply = client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=tag, changes=['CMD ["/bin/bash"]'])
    # Docker answers with the id in a status line, Podman with the id alone; Podman also ignores the tag
    ids = re.findall(r"(?:sha256:)?([0-9a-f]{64})", str(reply))
    if not ids:
        raise RuntimeError(f"importing {root.name} into the engine gave no image id: {str(reply)[:300]}")
    client.images.get(ids[-1]).tag(repo, tag)
    client.images.get(root.tag)
    log.info("OS root %s imported in %.0f s", root.tag, time.monotonic() - started)
    return root.tag


# ------------------------------------------------------------------------------ host interpreters
def host_python(version: str) -> str | None:
    """Prefix of a CPython ``version`` ("3.12") installed on this machine as a self-contained tree
    (pyenv or uv), built for this machine's libc: the newest patch release found, or None."""
    roots = [os.path.join(os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv")), "versions"),
             os.path.expanduser("~/.local/share/uv/python")]
    found = []
    for base in roots:
        for prefix in glob.glob(os.path.join(base, "*")):
            m = re.fullmatch(r"(?:cpython-)?(\d+)\.(\d+)\.(\d+)(?:-linux-x86_64-gnu)?", os.path.basename(prefix))
            if m and f"{m[1]}.{m[2]}" == version and os.path.isfile(os.path.join(prefix, "bin", f"python{version}")):
                found.append(((int(m[3])), prefix))
    return max(found)[1] if found else None


_SKIP_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "__pycache__", "lib2to3"}
_KEEP_SITE = re.compile(r"^(pip|setuptools|wheel|_distutils_hack|pkg_resources|distutils-precedence\.pth)")


def _python_tree(prefix: str, version: str) -> list[tuple[str, str]]:
    """``(host path, path under /usr/local)`` of what a runtime of ``prefix`` needs: the interpreter,
    its shared library, the standard library (no tests, no IDLE/Tk) and of site-packages only pip,
    setuptools and wheel (the packages installed on this machine stay out)."""
    out = []
    for rel in (f"bin/python{version}",):
        out.append((os.path.join(prefix, rel), rel))
    for path in sorted(glob.glob(os.path.join(prefix, "lib", "libpython*"))):
        out.append((path, os.path.relpath(path, prefix)))
    for sub in (f"include/python{version}",):
        for dirpath, dirnames, filenames in os.walk(os.path.join(prefix, sub)):
            dirnames.sort()
            out += [(os.path.join(dirpath, f), os.path.relpath(os.path.join(dirpath, f), prefix)) for f in sorted(filenames)]
    stdlib = os.path.join(prefix, "lib", f"python{version}")
    for dirpath, dirnames, filenames in os.walk(stdlib):
        rel_dir = os.path.relpath(dirpath, stdlib)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in _SKIP_STDLIB]
        elif rel_dir == "site-packages":
            dirnames[:] = [d for d in dirnames if _KEEP_SITE.match(d)]
            filenames = [f for f in filenames if _KEEP_SITE.match(f)]
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if not f.endswith(".pyc"):
                full = os.path.join(dirpath, f)
                out.append((full, os.path.relpath(full, prefix)))
    return out


# ------------------------------------------------------------------------------ families
@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to build one substitute: its OS root and the lines of the Dockerfile on top of it."""

    family: str
    root: str
    steps: tuple[str, ...]
    python: str | None = None
    """CPython version copied from this machine (``None``: none copied)."""
    python_prefix: str | None = None
    notes: tuple[str, ...] = ()
    """How this substitute differs from the base it stands for."""
    grader_python: str | None = None
    """Version of the image's ``python3`` (None: it has none): pytest for it goes to :data:`GRADER_DIR`."""
    grader_prefix: str | None = None
    """For an image with no python3: this machine's CPython copied to :data:`GRADER_PYTHON_DIR` to
    run the tests with (the harness's test scripts bring their own Python with uv)."""
    stages: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    """Build stages before the image: ``(root, stage name, steps)``, for ``COPY --from=<stage name>``."""


@dataclasses.dataclass(frozen=True)
class Family:
    """Images of one kind (``python:3.X[-slim][-suite]``, ``golang:1.X``...) and their substitute."""

    name: str
    matches: str
    """What the family covers (image references)."""
    promises: str
    """What its images provide, that the substitute reproduces."""
    differs: str
    """What the substitute does not match."""
    recipe: object
    """``recipe(name, tag) -> Recipe | None`` (None: the tag is not one this family knows)."""


_APT = "RUN apt-get update && apt-get install -y --no-install-recommends {} && rm -rf /var/lib/apt/lists/*"
_ARG = "ARG DEBIAN_FRONTEND=noninteractive"
_CA_STEPS = (
    "COPY host-ca.crt /usr/local/share/ca-certificates/compactrl-host-ca.crt",
    # without the ca-certificates package (minbase roots) the bundle file itself carries the CA
    "RUN if command -v update-ca-certificates >/dev/null; then update-ca-certificates >/dev/null 2>&1;"
    " else mkdir -p /etc/ssl/certs && cp /usr/local/share/ca-certificates/compactrl-host-ca.crt"
    " /etc/ssl/certs/ca-certificates.crt; fi",
)
_BUILD_TOOLS = "build-essential curl wget git ca-certificates gnupg netbase procps unzip xz-utils"
_BUILDPACK_DEV = ("autoconf automake libtool pkg-config file bzip2 libssl-dev zlib1g-dev libffi-dev libbz2-dev "
                  "libreadline-dev libsqlite3-dev liblzma-dev libncurses-dev libxml2-dev libxslt1-dev libyaml-dev "
                  "libcurl4-openssl-dev libgdbm-dev libdb-dev libjpeg-dev libpng-dev libpq-dev libmariadb-dev "
                  "default-libmysqlclient-dev libkrb5-dev libmagickwand-dev libglib2.0-dev libevent-dev "
                  "libgmp-dev libldap2-dev libsasl2-dev libxxhash-dev subversion mercurial openssh-client")
# shared libraries a pyenv/uv CPython built on Debian 12 links against
_PY_RUNTIME = ("ca-certificates libssl3 libffi8 libsqlite3-0 zlib1g libbz2-1.0 liblzma5 libreadline8 libncursesw6 "
               "libtinfo6 libgdbm6 libgdbm-compat4 libuuid1 libexpat1 tzdata netbase")
_SUITE_ROOT = {"bookworm": "debian-bookworm", "bullseye": "debian-bullseye", "noble": "ubuntu-noble",
               "jammy": "ubuntu-jammy", "focal": "ubuntu-focal", "12": "debian-bookworm", "11": "debian-bullseye",
               "24.04": "ubuntu-noble", "22.04": "ubuntu-jammy", "20.04": "ubuntu-focal", "latest": "ubuntu-noble",
               "stable": "debian-bookworm", "oldstable": "debian-bullseye"}


def _python_steps(version: str, root: str, notes: list[str]) -> tuple[list[str], str | None]:
    """Steps that put CPython ``version`` in /usr/local (from this machine) or, failing that, the
    distribution's python3 with pip and venv; and the host prefix copied (None if none)."""
    prefix = host_python(version) if root == "debian-bookworm" else None
    if prefix:
        patch = os.path.basename(prefix).replace("cpython-", "").split("-")[0]
        notes.append(f"CPython {patch} from this machine for {version} (patch release may differ)")
        return [_APT.format(_PY_RUNTIME), "COPY python/ /usr/local/",
                "RUN ldconfig && cd /usr/local/bin"
                f" && ln -sf python{version} python3 && ln -sf python{version} python"
                f" && for p in pip pip3 pip{version}; do printf '#!/bin/sh\\nexec /usr/local/bin/python{version} -m pip \"$@\"\\n'"
                " > $p && chmod 755 $p; done"
                f" && python{version} -c 'import ssl, sqlite3, ctypes, zlib, lzma, bz2'",
                "ENV LANG=C.UTF-8"], prefix
    notes.append(f"no CPython {version} on this machine for this root: the distribution's python3 instead")
    return [_APT.format("python3 python3-pip python3-venv python3-dev python-is-python3 ca-certificates"),
            "ENV PIP_BREAK_SYSTEM_PACKAGES=1 LANG=C.UTF-8"], None


def _tbench_python(name: str, tag: str) -> Recipe | None:
    notes: list[str] = []
    steps, prefix = _python_steps("3.13", "debian-bookworm", notes)
    return Recipe("t-bench/python-3-13", "debian-bookworm",
                  (_ARG, *steps, _APT.format("tmux asciinema"), "WORKDIR /app"), "3.13", prefix, tuple(notes),
                  grader_python="3.13" if prefix else "3.11")


def _tbench_ubuntu(name: str, tag: str) -> Recipe | None:
    return Recipe("t-bench/ubuntu-24-04", "ubuntu-noble", (_ARG, _APT.format("tmux asciinema"), "WORKDIR /app"),
                  grader_python="3.12")


def _python(name: str, tag: str) -> Recipe | None:
    m = re.fullmatch(r"(3)(?:\.(\d+))?(?:\.\d+)?(-slim)?(?:-(bookworm|bullseye|trixie))?(-slim)?", tag)
    if not m:
        return None
    minor = m[2] or "12"
    version, slim, suite = f"3.{minor}", bool(m[3] or m[5]), m[4] or "bookworm"
    notes = [] if suite == "bookworm" else [f"Debian bookworm in place of {suite}"]
    steps, prefix = _python_steps(version, "debian-bookworm", notes)
    extra = [] if slim else [_APT.format(f"{_BUILD_TOOLS} {_BUILDPACK_DEV}")]
    return Recipe("python", "debian-bookworm", (_ARG, *steps, *extra, 'CMD ["python3"]'),
                  version, prefix, tuple(notes), grader_python=version if prefix else "3.11")


def _distro(name: str, tag: str) -> Recipe | None:
    suite = re.sub(r"-slim$", "", tag)
    root = _SUITE_ROOT.get(suite)
    if root is None or root.split("-")[0] != name:
        return None
    return Recipe(name, root, ())


def _buildpack(name: str, tag: str) -> Recipe | None:
    m = re.fullmatch(r"(\w+)(-curl|-scm)?", tag)
    root = _SUITE_ROOT.get(m[1]) if m else None
    if root is None:
        return None
    pkgs = "ca-certificates curl wget gnupg netbase" + ("" if m[2] == "-curl" else " git mercurial openssh-client subversion procps")
    if not m[2]:
        pkgs += f" {_BUILD_TOOLS} {_BUILDPACK_DEV}"
    return Recipe("buildpack-deps", root, (_ARG, _APT.format(" ".join(sorted(set(pkgs.split()))))))


def _gcc(name: str, tag: str) -> Recipe | None:
    m = re.fullmatch(r"(\d+)(?:\.[\d.]+)?(?:-(bookworm|bullseye))?", tag)
    if not m:
        return None
    return Recipe("gcc", "debian-bookworm", (_ARG, _APT.format(f"{_BUILD_TOOLS} {_BUILDPACK_DEV}")),
                  notes=(f"Debian 12's GCC 12 in place of GCC {m[1]}",) if m[1] != "12" else ())


# Go lines Ubuntu 24.04 ships (noble and noble-updates: golang-1.X-go); golang.org's downloads and the
# Go module proxy are not reachable here. A Go toolchain is self-contained: it is copied from an
# Ubuntu build stage into the Debian 12 image the golang images are.
GO_LINES = ("1.21", "1.22", "1.23", "1.24", "1.25", "1.26")


def _golang(name: str, tag: str) -> Recipe | None:
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?(?:-(bookworm|bullseye))?", tag)
    if not m:
        return None
    minor = min(GO_LINES, key=lambda v: (abs(int(v.split(".")[1]) - int(m[2])), v))
    notes = [f"Ubuntu 24.04's Go {minor} build in place of Go {tag.split('-')[0]} (its own patch release)"
             + (" (a go.mod asking for a newer go line fails: no toolchain download)"
                if int(minor.split(".")[1]) < int(m[2]) else "")]
    if m[3] not in (None, "bookworm"):
        notes.append(f"Debian bookworm in place of {m[3]}")
    return Recipe("golang", "debian-bookworm", (
        _ARG, _APT.format(_BUILD_TOOLS),
        "COPY --from=go /opt/go /usr/local/go",
        "RUN /usr/local/go/bin/go version",
        "ENV GOTOOLCHAIN=local GOPATH=/go",
        "ENV PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "RUN mkdir -p /go/src /go/bin && chmod -R 1777 /go", "WORKDIR /go"), notes=tuple(notes),
        # Ubuntu links src/ and other parts to /usr/share/go-1.X: copied dereferenced
        stages=(("ubuntu-noble", "go", (_ARG, _APT.format(f"golang-{minor}-go"),
                                        f"RUN cp -rL /usr/lib/go-{minor} /opt/go")),))


# Rust lines Ubuntu 24.04's updates ship as rustc-1.X / cargo-1.X (rustup's servers are not reachable).
RUST_LINES = ("1.77", "1.78", "1.79", "1.80", "1.81", "1.82", "1.83", "1.84", "1.85", "1.89", "1.91", "1.97")


def _rust(name: str, tag: str) -> Recipe | None:
    m = re.fullmatch(r"(1)\.(\d+)(?:\.\d+)?(?:-(?:slim-)?(bookworm|bullseye|slim))?|latest|slim|bookworm", tag)
    if not m:
        return None
    wanted = int(m[2]) if m[2] else 97
    line = min(RUST_LINES, key=lambda v: (abs(int(v.split(".")[1]) - wanted), v))
    cargo = "/usr/local/cargo/bin"
    return Recipe("rust", "ubuntu-noble", (
        _ARG, _APT.format(f"rustc-{line} cargo-{line} {_BUILD_TOOLS}"),
        f"RUN mkdir -p {cargo} && ln -s /usr/bin/rustc-{line} {cargo}/rustc && ln -s /usr/bin/cargo-{line} {cargo}/cargo"
        f" && {cargo}/rustc --version",
        "ENV CARGO_HOME=/usr/local/cargo RUSTUP_HOME=/usr/local/rustup",
        f"ENV PATH={cargo}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
        notes=(f"Ubuntu 24.04 with its Rust {line} build in place of Debian with rustup's Rust "
               f"{tag.split('-')[0]} (no rustup; crates.io reachable only if the machine reaches it)",))


def _openjdk(name: str, tag: str) -> Recipe | None:
    m = re.fullmatch(r"(11|17|21)(?:[.\d]*)(?:-jdk)?(?:-(slim|bookworm|bullseye|jammy|slim-bookworm))?", tag)
    if not m:
        return None
    java = f"/usr/lib/jvm/java-{m[1]}-openjdk-amd64"
    return Recipe("openjdk", "ubuntu-jammy", (
        _ARG, _APT.format(f"openjdk-{m[1]}-jdk-headless ca-certificates curl"),
        f"ENV JAVA_HOME={java} LANG=C.UTF-8"),
        notes=(f"Ubuntu 22.04's OpenJDK {m[1]} in place of the openjdk image's build and distribution",))


def _node(name: str, tag: str) -> Recipe | None:
    m = re.fullmatch(r"(\d+)(?:\.[\d.]+)?(?:-(bookworm|bullseye|slim|bookworm-slim|alpine[\d.]*))?", tag)
    if not m:
        return None
    return Recipe("node", "debian-bookworm", (_ARG, _APT.format(f"nodejs npm {_BUILD_TOOLS}"),
                                                "ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt"),
                  notes=(f"Debian 12's Node.js 18 and npm 9 in place of Node.js {m[1]}",))


def _temurin(name: str, tag: str) -> Recipe | None:
    m = re.fullmatch(r"(\d+)(?:[._\w]*?)-jdk(?:-(jammy|noble|focal))?", tag)
    if not m or m[1] not in ("11", "17", "21"):
        return None
    root = _SUITE_ROOT[m[2] or "jammy"]
    java = f"/usr/lib/jvm/java-{m[1]}-openjdk-amd64"
    return Recipe("eclipse-temurin", root, (
        _ARG, _APT.format(f"openjdk-{m[1]}-jdk-headless ca-certificates curl wget unzip fontconfig"),
        f"RUN mkdir -p /opt/java && ln -s {java} /opt/java/openjdk",
        "ENV JAVA_HOME=/opt/java/openjdk LANG=C.UTF-8"),
        notes=(f"the distribution's OpenJDK {m[1]} in place of Eclipse Temurin {m[1]} (same major version)",))


def _none(reason: str):
    def recipe(name: str, tag: str) -> Recipe | None:
        raise NoSubstitute(reason)
    return recipe


class NoSubstitute(Exception):
    """The base belongs to a family with no substitute here (the reason says why)."""


FAMILIES: tuple[Family, ...] = (
    Family("t-bench/python-3-13", "ghcr.io/laude-institute/t-bench/python-3-13:*",
           "python:3.13-slim-bookworm with tmux and asciinema, WORKDIR /app",
           "CPython 3.13 is this machine's (patch release may differ); Debian's python3 3.11 also present "
           "(asciinema depends on it), as in the original", _tbench_python),
    Family("t-bench/ubuntu-24-04", "ghcr.io/laude-institute/t-bench/ubuntu-24-04:*",
           "ubuntu:24.04 with tmux and asciinema (so Ubuntu's python3 3.12), WORKDIR /app",
           "same distribution and suite, bootstrapped today (package versions: the archive's current ones)",
           _tbench_ubuntu),
    Family("python", "python:3.X[.Y][-slim][-bookworm|-bullseye] (also docker.io/library/, public.ecr.aws/docker/library/)",
           "CPython 3.X in /usr/local on Debian (python, python3, pip, pip3); the non-slim tags add buildpack-deps",
           "CPython from this machine's pyenv/uv installs (patch release may differ; without one, Debian's 3.11); "
           "bullseye tags get bookworm (this machine's interpreters need its libc)", _python),
    Family("ubuntu", "ubuntu:24.04|noble|latest, ubuntu:22.04|jammy, ubuntu:20.04|focal",
           "the Ubuntu release's minimal root", "debootstrap minbase: a few packages of the image's own "
           "selection (e.g. unminimize tools) absent, a few present", _distro),
    Family("debian", "debian:bookworm|12|stable[-slim], debian:bullseye|11|oldstable[-slim]",
           "the Debian release's minimal root", "debootstrap minbase (close to -slim)", _distro),
    Family("buildpack-deps", "buildpack-deps:<suite>[-curl|-scm]",
           "the suite with curl/wget/CA (-curl), plus VCS tools (-scm), plus compilers and common -dev libraries",
           "the -dev library list is ours (the common ones), not the image's exact one", _buildpack),
    Family("gcc", "gcc:N[.M.P][-bookworm]", "GCC N on buildpack-deps:bookworm",
           "Debian 12's GCC 12 whatever N is", _gcc),
    Family("golang", "golang:1.X[.Y][-bookworm] (also public.ecr.aws/docker/library/golang)",
           "Go 1.X.Y in /usr/local/go, GOPATH=/go, GOTOOLCHAIN=local, WORKDIR /go, on buildpack-deps",
           "Ubuntu 24.04's Go build of the tag's line (1.21-1.26; its own patch release; golang.org and the module "
           "proxy are not reachable, so no other toolchain and no `go mod download`); build tools, not the full -dev set",
           _golang),
    Family("node", "node:N[-bookworm|-slim|-alpine] (also public.ecr.aws/docker/library/node)",
           "Node.js N with npm", "Debian 12's Node.js 18 and npm 9 whatever N is (nodejs.org is not reachable); "
           "alpine tags get Debian", _node),
    Family("eclipse-temurin", "eclipse-temurin:11|17|21[...]-jdk[-jammy|-noble|-focal]",
           "a JDK of that major version in /opt/java/openjdk on Ubuntu", "the distribution's OpenJDK build of the "
           "same major version (JAVA_HOME=/opt/java/openjdk links to it)", _temurin),
    Family("rust", "rust:1.X[.Y][-slim][-bookworm]", "Rust 1.X with cargo under /usr/local/cargo (rustup) on Debian",
           "Ubuntu 24.04's rustc-1.X/cargo-1.X build of the nearest line (1.77-1.97) on an Ubuntu root; no rustup",
           _rust),
    Family("openjdk", "openjdk:11|17|21[...][-jdk][-slim]", "an OpenJDK of that major version",
           "Ubuntu 22.04's OpenJDK build of the same major version", _openjdk),
    Family("t-bench/deveval", "ghcr.io/laude-institute/t-bench/deveval:*", "DevEval's toolchains",
           "no substitute: what the image holds is not published with the tasks",
           _none("the image's contents are not published with the tasks")),
    Family("alpine", "alpine:*, node:*-alpine handled above", "musl libc and apk",
           "no substitute: apk packages cannot be installed from the mirrors reachable here",
           _none("Alpine's apk mirrors are not among the reachable registries")),
    Family("dotnet", "mcr.microsoft.com/dotnet/sdk:*", ".NET SDK",
           "no substitute: .NET is in neither Debian nor Ubuntu's main archive",
           _none(".NET SDK packages come from Microsoft's feed, not reachable here")),
    Family("localstack", "localstack/localstack:*", "a LocalStack service image",
           "no substitute: an application image", _none("an application image, not a base")),
    Family("swebench", "swebench/sweb.eval.*", "a SWE-bench instance image",
           "no substitute here: SWE-bench rows are prepared by `compactrl tasks prepare`",
           _none("a SWE-bench instance image (prepare the row with `compactrl tasks prepare`)")),
)
_BY_NAME = {
    "ghcr.io/laude-institute/t-bench/python-3-13": FAMILIES[0],
    "ghcr.io/laude-institute/t-bench/ubuntu-24-04": FAMILIES[1],
    "python": FAMILIES[2], "ubuntu": FAMILIES[3], "debian": FAMILIES[4], "buildpack-deps": FAMILIES[5],
    "gcc": FAMILIES[6], "golang": FAMILIES[7], "node": FAMILIES[8], "eclipse-temurin": FAMILIES[9],
}
_BY_NAME.update({"rust": FAMILIES[10], "openjdk": FAMILIES[11], "ghcr.io/laude-institute/t-bench/deveval": FAMILIES[12],
                 "alpine": FAMILIES[13], "mcr.microsoft.com/dotnet/sdk": FAMILIES[14],
                 "localstack/localstack": FAMILIES[15]})
_REGISTRY_ALIASES = ("docker.io/library/", "docker.io/", "index.docker.io/library/", "registry-1.docker.io/library/",
                     "public.ecr.aws/docker/library/", "library/")


def parse_reference(image: str) -> tuple[str, str]:
    """``(name, tag)`` of an image reference, Docker Hub's aliases and any digest removed."""
    ref = image.split("@", 1)[0]
    for alias in _REGISTRY_ALIASES:
        if ref.startswith(alias):
            ref = ref[len(alias):]
            break
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:  # no tag (a registry port is not a tag)
        name, tag = ref, "latest"
    return name, tag


def family_of(image: str) -> Family | None:
    name, _ = parse_reference(image)
    if name.startswith("swebench/sweb.eval."):
        return FAMILIES[16]
    return _BY_NAME.get(name)


def recipe_for(image: str) -> Recipe:
    """The substitute recipe for ``image``; :class:`NoSubstitute` (with the reason) when its family has
    none or the family does not know the tag."""
    family = family_of(image)
    if family is None:
        raise NoSubstitute("no known family (see docs/task_formats.md, 'Base images')")
    name, tag = parse_reference(image)
    recipe = family.recipe(name, tag)
    if recipe is None:
        raise NoSubstitute(f"the {family.name} family has no substitute for the tag {tag!r}")
    if recipe.grader_python is None and recipe.root in ("debian-bookworm", "ubuntu-noble"):
        # the machine's interpreters are built for Debian 12's libc (Ubuntu 24.04's is newer)
        found = next(((v, p) for v in GRADER_PYTHON_VERSIONS if (p := host_python(v))), None)
        if found:
            recipe = dataclasses.replace(recipe, grader_python=found[0], grader_prefix=found[1])
    return recipe


# ------------------------------------------------------------------------------ building
_locks: dict[str, threading.Lock] = collections.defaultdict(threading.Lock)


_INSTALL = re.compile(r"(?:^|[;&|(]|\bthen|\bdo)\s*(?:uv\s+add|uv\s+pip\s+install|python3?\s+-m\s+pip\s+install|pip3?\s+install)"
                      r"\s+([^;&|\n#]*)", re.M)
_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?((==|>=|<=|~=|!=|>|<)[A-Za-z0-9.*+!,<>=~-]+)?")


def test_requirements(scripts: list[str]) -> list[str]:
    """The packages a task's test scripts install at test time (``uv add``, ``uv pip install``, ``pip
    install``), pytest left out (the grader has the harness's): what the harness's test run has and an
    offline sandbox can only have if it is installed when the image is built."""
    out: list[str] = []
    for text in scripts:
        # uvx --with numpy --with pytest==8.4.1 pytest ...: the packages the tool's run gets
        for m in re.finditer(r"--with[= ]+(['\"]?)([^\s;&|'\"]+)\1", text):
            w = m.group(2)
            if _REQUIREMENT.fullmatch(w) and not re.match(r"pytest([=<>~!\[]|$)", w) and w not in out:
                out.append(w)
        for m in _INSTALL.finditer(text):
            words = m.group(1).split()
            skip = False
            for w in words:
                if skip:
                    skip = False
                    continue
                if w.startswith("-"):
                    skip = w in ("-r", "-c", "-e", "-i", "--index-url", "--extra-index-url", "-f", "--find-links",
                                 "--target", "-t", "--python", "-p")
                    continue
                w = w.strip("'\"")
                if not _REQUIREMENT.fullmatch(w) or re.match(r"pytest([=<>~!\[]|$)", w):
                    continue
                if w not in out:
                    out.append(w)
    return out


def grader_layer(requirements: list[str], user: str | None) -> list[str]:
    """Dockerfile lines that install ``requirements`` for the image's python3 into
    :data:`GRADER_DEPS_DIR` with the grader's pip (:data:`GRADER_PIP_DIR`; only where the image has the grader: a family
    substitute), trusting the build machine's CA; the image's ``USER`` is restored after."""
    if not requirements:
        return []
    import shlex

    reqs = " ".join(shlex.quote(r) for r in requirements)
    lines = ["USER root",
             f"RUN if [ -d {GRADER_PIP_DIR}/pip ]; then PYTHONPATH={GRADER_PIP_DIR} PIP_CERT=/etc/ssl/certs/ca-certificates.crt"
             f" {_GRADER_PY} -m pip install --quiet --no-cache-dir --disable-pip-version-check --target {GRADER_DEPS_DIR}"
             f" {reqs}; fi"]
    return lines + ([f"USER {user}"] if user else [])


def grader_wheels(python: str, cache_dir: str = CACHE_DIR) -> list[str]:
    """Wheels of pytest and its dependencies for CPython ``python`` ("3.12"), downloaded once with this
    machine's pip into the cache: pytest 8.4.1 as the harness installs it (8.3.5 for 3.8), and pip
    (so that a task's test requirements can be installed next to it, :func:`grader_layer`)."""
    pin = "pytest==8.3.5" if python in ("3.8",) else "pytest==8.4.1"
    # pip evaluates pytest's markers for the running interpreter, not --python-version: name the
    # dependencies that only older Pythons need
    extra = ["exceptiongroup>=1.0.0rc8", "tomli>=1"] if int(python.split(".")[1]) < 11 else []
    wanted = [pin, "pip", *extra]
    target = os.path.join(cache_dir, "grader-wheels",
                          f"{python}-{hashlib.sha256(' '.join(wanted).encode()).hexdigest()[:12]}")
    if not os.path.isfile(os.path.join(target, ".complete")):
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version", python,
              "--implementation", "cp", "--dest", target, *wanted], f"downloading {pin} for Python {python}", timeout=600)
        open(os.path.join(target, ".complete"), "w").close()
    return sorted(glob.glob(os.path.join(target, "*.whl")))


def _recipe_context(recipe: Recipe, root_name: str, root_id: str,
                    stage_roots: dict[str, tuple[str, str]] | None = None) -> tuple[bytes, str]:
    """The build context (Dockerfile, CA bundle, CPython tree) and the digest naming the substitute
    (the root's image id included: a root bootstrapped again makes new substitutes). ``stage_roots``:
    ``{root: (engine name, image id)}`` of the roots its build stages start from."""
    stage_roots = stage_roots or {}
    grader = []
    if recipe.grader_prefix:
        v = recipe.grader_python
        grader = [f"COPY grader-python/ {GRADER_PYTHON_DIR}/",
                  f"RUN printf '#!/bin/sh\\nLD_LIBRARY_PATH={GRADER_PYTHON_DIR}/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
                  f" exec {GRADER_PYTHON_DIR}/bin/python{v} \"$@\"\\n' > {GRADER_PYTHON_DIR}/bin/python3"
                  f" && chmod 755 {GRADER_PYTHON_DIR}/bin/python3 && {GRADER_PYTHON_DIR}/bin/python3 -c 'import sys'"]
    if recipe.grader_python:
        grader += ["COPY grader-wheels/ /tmp/grader-wheels/",
                   f"RUN for w in /tmp/grader-wheels/*.whl; do case \"${{w##*/}}\" in pip-*) d={GRADER_PIP_DIR};;"
                   f" *) d={GRADER_DIR};; esac; {_GRADER_PY} -m zipfile -e \"$w\" $d || exit 1; done"
                   f" && rm -rf /tmp/grader-wheels && find {GRADER_DIR} {GRADER_PIP_DIR} -name '*.dist-info' -prune -o"
                   " -type d -exec chmod 755 {} +"
                   f" && PYTHONPATH={GRADER_DIR} {_GRADER_PY} -m pytest --version"]
    stages = [line for root, stage, steps in recipe.stages
              for line in (f"FROM {stage_roots[root][0]} AS {stage}", *_CA_STEPS, *steps)]
    dockerfile = "\n".join([*stages, f"FROM {root_name}", *_CA_STEPS, *recipe.steps, *grader]) + "\n"
    digest = hashlib.sha256(f"{root_id}\0{sorted(v[1] for v in stage_roots.values())}\0{dockerfile}".encode())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(arcname: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(arcname)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        add("Dockerfile", dockerfile.encode())
        ca = open(HOST_CA_BUNDLE, "rb").read() if os.path.isfile(HOST_CA_BUNDLE) else b""
        digest.update(ca)
        add("host-ca.crt", ca)
        if recipe.grader_python:
            for path in grader_wheels(recipe.grader_python):
                with open(path, "rb") as fh:
                    data = fh.read()
                digest.update(os.path.basename(path).encode() + hashlib.sha256(data).digest())
                add("grader-wheels/" + os.path.basename(path), data)
        trees = [("python/", recipe.python_prefix, recipe.python), ("grader-python/", recipe.grader_prefix,
                                                                      recipe.grader_python)]
        for top, prefix, version in trees:
            if not prefix:
                continue
            for host, rel in _python_tree(prefix, version):
                if os.path.islink(host):
                    info = tarfile.TarInfo(top + rel)
                    info.type, info.linkname = tarfile.SYMTYPE, os.readlink(host)
                    tar.addfile(info)
                    digest.update(f"{top}{rel}->{info.linkname}".encode())
                    continue
                with open(host, "rb") as fh:
                    data = fh.read()
                digest.update(f"{top}{rel}".encode() + b"\0" + hashlib.sha256(data).digest())
                add(top + rel, data, os.stat(host).st_mode & 0o777)
    return buf.getvalue(), digest.hexdigest()


def substitute_tag(recipe: Recipe, digest: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", recipe.family.lower()).strip("-.")
    return f"{SUBSTITUTE_REPO}/{slug}:{digest[:20]}"


def substitute_for(client, image: str, *, cache_dir: str = CACHE_DIR, build_timeout_s: float = 3600) -> tuple[str, Recipe]:
    """The engine's tag of ``image``'s family substitute (built, with its OS root, if missing) and its
    recipe. :class:`NoSubstitute` when there is none; ``RuntimeError`` when building fails."""
    recipe = recipe_for(image)
    names: dict[str, tuple[str, str]] = {}
    for key in sorted({recipe.root, *(r for r, _, _ in recipe.stages)}):  # sorted: the digest must not vary
        root = ROOTS[key]
        with _locks[root.name]:
            build_root(client, root, cache_dir)
        root_image = client.images.get(root.tag)
        # the engine's own full name (Podman: docker.io/...), so the build asks no registry
        names[key] = (next((t for t in root_image.tags if t == root.tag or t.endswith("/" + root.tag)), root.tag),
                      root_image.id)
    with _locks[f"{recipe}"]:
        data, digest = _recipe_context(recipe, *names[recipe.root], names)
        tag = substitute_tag(recipe, digest)
        try:
            client.images.get(tag)
            return tag, recipe
        except Exception:
            pass
        started = time.monotonic()
        tail: collections.deque[str] = collections.deque(maxlen=30)
        error = None
        for chunk in client.api.build(fileobj=io.BytesIO(data), custom_context=True, tag=tag, rm=True, forcerm=True,
                                      pull=False, decode=True, timeout=int(build_timeout_s)):
            if chunk.get("stream"):
                tail.extend(line for line in chunk["stream"].splitlines() if line.strip())
            if chunk.get("error"):
                error = chunk["error"].strip()
        if error:
            raise RuntimeError(f"building the substitute for {image} ({recipe.family}) failed: {error}\n" + "\n".join(tail))
        client.images.get(tag)
        log.info("built substitute %s for %s in %.0f s", tag, image, time.monotonic() - started)
    return tag, recipe


# ------------------------------------------------------------------------------ survey and CLI
def survey(folders: list[str]) -> dict[str, collections.Counter]:
    """Bases named by the Dockerfiles under ``folders``, counted per family (``"(none)"``: no family)."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for folder in folders:
        for dirpath, dirnames, filenames in os.walk(folder):
            dirnames[:] = [d for d in dirnames if d != ".git"]
            for f in filenames:
                if f == "Dockerfile" or f.endswith(".Dockerfile"):
                    with open(os.path.join(dirpath, f), encoding="utf-8", errors="replace") as fh:
                        for _, base in dockerfile_bases(fh.read()):
                            family = family_of(base)
                            out[family.name if family else "(none)"][base] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compactrl.tasksets.terminal_bench.base_images", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="the families, what each promises and what its substitute does not match")
    s = sub.add_parser("survey", help="count the bases of the Dockerfiles under FOLDER... per family")
    s.add_argument("folders", nargs="+")
    s.add_argument("--json", action="store_true")
    b = sub.add_parser("build", help="build the substitutes of IMAGE... on the engine (DOCKER_HOST)")
    b.add_argument("images", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "list":
        for f in FAMILIES:
            print(f"{f.name}\n  matches:  {f.matches}\n  promises: {f.promises}\n  differs:  {f.differs}")
        return 0
    if args.cmd == "survey":
        counts = survey(args.folders)
        if args.json:
            print(json.dumps({k: dict(v) for k, v in counts.items()}, indent=1))
            return 0
        for family, bases in sorted(counts.items(), key=lambda kv: -sum(kv[1].values())):
            print(f"{sum(bases.values()):6d}  {family}: " + ", ".join(f"{b} ({n})" for b, n in bases.most_common()))
        return 0
    import docker

    client = docker.from_env(timeout=3600)
    rc = 0
    for image in args.images:
        started = time.monotonic()
        try:
            tag, recipe = substitute_for(client, image)
            print(f"{image} -> {tag} ({time.monotonic() - started:.0f} s)" + "".join(f"; {n}" for n in recipe.notes))
        except (NoSubstitute, RuntimeError) as e:
            print(f"{image}: {e}", file=sys.stderr)
            rc = 1
    return rc


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
