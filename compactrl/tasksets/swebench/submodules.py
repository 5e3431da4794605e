"""The git submodules a row's tree pins, supplied into its work tree before the install step.

A ``git worktree`` of the superproject leaves each submodule (a gitlink, mode 160000) an empty folder.
The harness's image build had a network, so a build that needs one (astropy 1.x-3.x's ``setup.py``
imports ``astropy_helpers``; its ``ah_bootstrap`` runs ``git submodule update --init``) cloned it at the
pinned commit. Here prepare supplies it, in this order, and records where it came from:

1. **the submodule's repository**, when ``repos_root`` holds it (``<owner>__<name>`` from the URL in
   ``.gitmodules``) with the pinned commit: that commit's files (``git archive``), exactly;
2. **a release of it**: its version read from the superproject's commit that set the pin (its subject,
   e.g. astropy's "Updating helpers to v3.0.1"), and its distribution named as the URL's repository
   (``astropy-helpers``). The release's source archive (``PKG-INFO`` naming that distribution and
   version) comes from the download cache, found by content, else from the package index (its sha256
   checked against the index's), kept in ``envs_root/submodules`` for the next prepare. The
   archive's top folder becomes the submodule's folder. A release is the files of its tag, plus what
   ``sdist`` adds (``PKG-INFO``, generated version files), less what its ``MANIFEST.in`` leaves out.

A submodule none of these supplies is a :class:`SubmoduleError` naming the path, the pinned commit and
what to supply.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable
from typing import Any

INDEX_URL = "https://pypi.org/simple"
"""The package index (``PIP_INDEX_URL`` wins), read through its JSON simple API."""
ARCHIVES = (".tar.gz", ".tgz", ".tar.bz2", ".zip")
_VERSION = re.compile(r"\bv?(\d+(?:\.\d+)+(?:(?:a|b|rc|\.post|\.dev)\d+)?)\b")


class SubmoduleError(ValueError):
    """A submodule the build needs that nothing here supplies."""


def _git(repo: str, *args: str) -> str:
    res = subprocess.run(["git", "-C", repo, *args], capture_output=True, timeout=300)
    if res.returncode != 0:
        raise SubmoduleError(f"git {' '.join(args[:2])} in {repo}: {res.stderr.decode(errors='replace').strip()}")
    return res.stdout.decode("utf-8", "replace")


def gitlinks(repo_path: str, commit: str) -> list[dict[str, str]]:
    """``{"path", "commit", "url"}`` of every submodule ``commit`` pins (``url`` from its ``.gitmodules``)."""
    links = []
    for item in _git(repo_path, "ls-tree", "-r", "-z", commit).split("\0"):
        meta, _, path = item.partition("\t")
        if meta.startswith("160000 commit "):
            links.append({"path": path, "commit": meta.split()[2]})
    if not links:
        return []
    try:
        modules = _git(repo_path, "config", "--blob", f"{commit}:.gitmodules", "--list")
    except SubmoduleError:
        modules = ""
    paths, urls = {}, {}
    for line in modules.splitlines():
        key, _, value = line.partition("=")
        m = re.match(r"submodule\.(.+)\.(path|url)$", key)
        if m:
            (paths if m.group(2) == "path" else urls)[m.group(1)] = value
    url_of = {paths[name]: urls.get(name, "") for name in paths}
    return [{**link, "url": url_of.get(link["path"], "")} for link in links]


def repo_name(url: str) -> tuple[str, str]:
    """``(owner, name)`` of a submodule URL (``https://github.com/astropy/astropy-helpers.git``,
    ``git@host:owner/name``, a relative ``../name.git``)."""
    parts = [p for p in re.split(r"[/:]", url.rstrip("/")) if p]
    name = parts[-1].removesuffix(".git") if parts else ""
    owner = parts[-2] if len(parts) > 1 and parts[-2] not in ("..", ".") else ""
    return owner, name


def pinned_version(repo_path: str, commit: str, path: str) -> tuple[str, str] | None:
    """``(version, subject)`` read from the superproject's commit that last set ``path``'s pin, or None."""
    subject = _git(repo_path, "log", "-1", "--format=%s", commit, "--", path).strip()
    m = _VERSION.search(subject)
    return (m.group(1), subject) if m else None


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pkg_info(path: str) -> tuple[str, str] | None:
    """``(name, version)`` of a source archive's top-level ``PKG-INFO``, or None."""
    try:
        if path.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                info = next((n for n in z.namelist() if n.count("/") == 1 and n.endswith("/PKG-INFO")), None)
                text = z.read(info).decode("utf-8", "replace") if info else ""
        else:
            with tarfile.open(path) as t:
                info = next((m for m in t if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")), None)
                text = t.extractfile(info).read().decode("utf-8", "replace") if info else ""  # type: ignore[union-attr]
    except (OSError, tarfile.TarError, zipfile.BadZipFile, EOFError):
        return None
    fields = dict(re.findall(r"^(Name|Version): *(.+?)\s*$", text, flags=re.MULTILINE))
    return (fields["Name"], fields["Version"]) if "Name" in fields and "Version" in fields else None


def cached_release(folder: str | None, dist: str, version: str) -> str | None:
    """A source archive of ``dist`` ``version`` in ``folder`` (any name: read from its ``PKG-INFO``)."""
    for base, _, names in os.walk(folder) if folder and os.path.isdir(folder) else ():
        for name in sorted(names):
            info = _pkg_info(os.path.join(base, name)) if name.endswith(ARCHIVES) else None
            if info and _norm(info[0]) == _norm(dist) and info[1] == version:
                return os.path.join(base, name)
    return None


def index_release(dist: str, version: str, dest: str, opener: Callable[..., Any] = urllib.request.urlopen) -> str:
    """The source archive of ``dist`` ``version`` from the package index, into ``dest``; its sha256 is the
    index's. A SubmoduleError when the index has none."""
    index = os.environ.get("PIP_INDEX_URL", INDEX_URL).rstrip("/")
    request = urllib.request.Request(f"{index}/{_norm(dist)}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with opener(request, timeout=60) as resp:
            files = json.loads(resp.read().decode())["files"]
    except (OSError, ValueError, KeyError) as exc:
        raise SubmoduleError(f"the package index has no listing of {dist} ({index}: {exc})") from None
    stems = {f"{_norm(dist)}-{version}", f"{_norm(dist).replace('-', '_')}-{version}"}
    wanted = [f for f in files if any(f["filename"].lower() == s + ext for s in stems for ext in ARCHIVES)]
    if not wanted:
        raise SubmoduleError(f"the package index has no source archive of {dist} {version}")
    file = wanted[0]
    target = os.path.join(dest, file["filename"])
    if not os.path.isfile(target) or _sha256(target) != file["hashes"].get("sha256"):
        os.makedirs(dest, exist_ok=True)
        with opener(file["url"], timeout=300) as resp, tempfile.NamedTemporaryFile(dir=dest, delete=False) as tmp:
            shutil.copyfileobj(resp, tmp)
        if _sha256(tmp.name) != file["hashes"].get("sha256"):
            os.unlink(tmp.name)
            raise SubmoduleError(f"{file['filename']}: its sha256 is not the package index's")
        os.replace(tmp.name, target)
    return target


def _sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _extract_top(archive: str, dest: str) -> None:
    """The archive's single top folder's contents into ``dest`` (links and paths out of it refused)."""
    with tempfile.TemporaryDirectory(dir=os.path.dirname(dest)) as tmp:
        if archive.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
        else:
            with tarfile.open(archive) as t:
                t.extractall(tmp, filter="data")
        tops = os.listdir(tmp)
        if len(tops) != 1 or not os.path.isdir(os.path.join(tmp, tops[0])):
            raise SubmoduleError(f"{archive}: expected one top folder, got {sorted(tops)[:5]}")
        for name in os.listdir(os.path.join(tmp, tops[0])):
            shutil.move(os.path.join(tmp, tops[0], name), os.path.join(dest, name))


def supply(repo_path: str, commit: str, tree: str, *, repos_root: str | None, cache: str | None, keep: str,
           opener: Callable[..., Any] = urllib.request.urlopen) -> list[dict[str, Any]]:
    """Fill every empty submodule folder of the work tree ``tree`` (at ``commit``) as the module
    docstring says; what was supplied, per submodule (path, pinned commit, source, version, archive)."""
    done = []
    for link in gitlinks(repo_path, commit):
        folder = os.path.join(tree, link["path"])
        if os.path.isdir(folder) and os.listdir(folder):
            continue
        os.makedirs(folder, exist_ok=True)
        owner, name = repo_name(link["url"])
        record: dict[str, Any] = {"path": link["path"], "commit": link["commit"], "url": link["url"]}
        sub = os.path.join(repos_root, f"{owner}__{name}") if repos_root and owner else None
        if sub and os.path.isdir(sub) and subprocess.run(
                ["git", "-C", sub, "cat-file", "-e", f"{link['commit']}^{{commit}}"], capture_output=True).returncode == 0:
            data = subprocess.run(["git", "-C", sub, "archive", "--format=tar", link["commit"]], capture_output=True,
                                  check=True, timeout=600).stdout
            with tarfile.open(fileobj=io.BytesIO(data)) as t:
                t.extractall(folder, filter="data")
            done.append({**record, "source": f"repository {sub} at the pinned commit"})
            continue
        pinned = pinned_version(repo_path, commit, link["path"])
        if pinned is None:
            raise SubmoduleError(
                f"submodule {link['path']} (pinned at {link['commit'][:12]}, {link['url']}): no repository "
                f"{owner}__{name} under --repos-root holds the commit, and the superproject's commit that pinned it "
                "names no version; clone the submodule's repository there")
        version, subject = pinned
        archive = cached_release(cache, name, version)
        source = "download cache"
        if archive is None:
            archive, source = index_release(name, version, keep, opener), "package index"
        _extract_top(archive, folder)
        done.append({**record, "source": f"release {name} {version} from the {source}", "version": version,
                     "pinned_by": subject, "archive": archive, "archive_sha256": _sha256(archive)})
    return done
