"""The download cache's rule for a library release a build downloads and checks by sha256 (matplotlib's
FreeType): when the cache lacks that exact file but holds the same release in another archive
(``freetype-<ver>.tar.{gz,bz2,xz}``, or a Debian/Ubuntu ``.orig`` tarball holding it), prepare
extracts the release's sources where the build uses them when present (``build/freetype-<ver>``),
and records which archive (and its sha256) it used; another release is never used. Offline: every
archive is written here."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from compactrl.tasksets.swebench import prepare as sp

pytestmark = pytest.mark.timeout(300)

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
WANTED_SHA = "a1" * 32  # the sha256 the tree's setupext names for freetype-2.6.1.tar.gz (not in any cache here)
ORIG_URL = "http://archive.example.invalid/pool/main/f/freetype/freetype_2.6.1.orig.tar.gz"

# A setupext.py of the shape the rule reads (written for this test): a version table with hashes, the
# non-Windows version, and a fetch helper that skips the download when build/<dirname> exists. Run as
# a script it "builds": it fails as the real one does when the sources are neither there nor cached.
SETUPEXT = f'''import os, sys
from pathlib import Path

_freetype_hashes = {{
    '2.6.1':
        '{WANTED_SHA}',
    '2.6.2':
        '{"b2" * 32}',
}}
TESTING_VERSION_OF_FREETYPE = '2.6.1'
if sys.platform.startswith('win'):
    LOCAL_FREETYPE_VERSION = '2.11.1'
else:
    LOCAL_FREETYPE_VERSION = TESTING_VERSION_OF_FREETYPE


def get_and_extract_tarball(urls, sha, dirname):
    toplevel = Path("build", dirname)
    if not toplevel.exists():
        raise IOError(f"Failed to download any of the following: {{urls}}")
    return toplevel


if __name__ == "__main__":
    src = get_and_extract_tarball(["https://example.invalid/freetype-2.6.1.tar.gz"], _freetype_hashes['2.6.1'],
                                  "freetype-" + LOCAL_FREETYPE_VERSION)
    print("building freetype from", src, open(src / "include/freetype/freetype.h").read().split()[2])
'''


def _tar(members: dict[str, bytes], mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _release(version: str, mode: str = "w:bz2", header_version: str | None = None) -> bytes:
    """A FreeType-like release archive: ``freetype-<version>/`` with a header that defines its version."""
    major, minor, patch = (header_version or version).split(".")
    header = (f"#define FREETYPE_MAJOR  {major}\n#define FREETYPE_MINOR  {minor}\n"
              f"#define FREETYPE_PATCH  {patch}\n").encode()
    top = f"freetype-{version}"
    return _tar({f"{top}/include/freetype/freetype.h": header, f"{top}/builds/unix/configure": b"#!/bin/sh\n",
                 f"{top}/README": b"release sources\n"}, mode)


def _orig(version: str) -> bytes:
    """The Debian/Ubuntu multi-tarball orig layout: the release as .tar.bz2 beside the docs."""
    return _tar({f"freetype-{version}/freetype-{version}.tar.bz2": _release(version),
                 f"freetype-{version}/freetype-doc-{version}.tar.bz2": _tar({"docs/x": b"x"}, "w:bz2")}, "w:gz")


def _tree(tmp_path, text: str = SETUPEXT) -> str:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setupext.py").write_text(text)
    return str(tree)


def _cache_with(tmp_path, files: dict[str, bytes], urls: dict[str, str] | None = None) -> str:
    cache = tmp_path / "cache"
    cache.mkdir()
    for name, data in files.items():
        (cache / name).write_bytes(data)
    if urls:
        (cache / "urls.txt").write_text("".join(f"{hashlib.sha256(files[n]).hexdigest()} {u}\n" for n, u in urls.items()))
    return str(cache)


def test_the_tree_names_the_version_and_hash_its_build_checks(tmp_path) -> None:
    tree = _tree(tmp_path)
    assert sp.freetype_wanted(tree) == {"library": "freetype", "version": "2.6.1", "sha256": WANTED_SHA,
                                        "file": "freetype-2.6.1.tar.gz", "into": "build/freetype-2.6.1"}
    # a setupext that does not skip its download for extracted sources: the rule does not apply
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "setupext.py").write_text("LOCAL_FREETYPE_VERSION = '2.6.1'\n")
    assert sp.freetype_wanted(str(tmp_path / "old")) is None
    assert sp.freetype_wanted(str(tmp_path)) is None  # no setupext.py


def test_an_orig_tarball_holding_the_release_is_extracted_and_recorded(tmp_path) -> None:
    orig = _orig("2.6.1")
    sha = hashlib.sha256(orig).hexdigest()
    cache = _cache_with(tmp_path, {sha: orig}, {sha: ORIG_URL})  # kept under its sha256, named by its URL
    tree = _tree(tmp_path)
    done = sp.pre_extract_sources(tree, cache, "rows:1")
    header = os.path.join(tree, "build", "freetype-2.6.1", "include", "freetype", "freetype.h")
    assert "FREETYPE_MINOR  6" in open(header).read()
    inner = _release("2.6.1")
    assert len(done) == 1
    rec = done[0]
    assert rec["version"] == "2.6.1" and rec["into"] == "build/freetype-2.6.1" and rec["wanted_sha256"] == WANTED_SHA
    assert rec["archive"] == os.path.join(cache, sha) and rec["archive_sha256"] == sha
    assert rec["member"] == "freetype-2.6.1/freetype-2.6.1.tar.bz2"
    assert rec["member_sha256"] == hashlib.sha256(inner).hexdigest()
    assert "bytes differ" in rec["note"]
    assert not os.path.exists(os.path.join(tree, "build", "freetype-doc-2.6.1"))  # only the release
    # the folder is there now: nothing is done again
    assert sp.pre_extract_sources(tree, cache, "rows:1") == []


@pytest.mark.parametrize("name,mode", [("freetype-2.6.1.tar.xz", "w:xz"), ("freetype-2.6.1.tar.bz2", "w:bz2"),
                                       ("freetype-2.6.1.tar.gz", "w:gz")])
def test_the_release_in_any_archive_format_is_used(tmp_path, name, mode) -> None:
    data = _release("2.6.1", mode)
    cache = _cache_with(tmp_path, {name: data})
    tree = _tree(tmp_path)
    rec = sp.pre_extract_sources(tree, cache, "rows:1")
    assert [(r["archive"], r["archive_sha256"], r["member"]) for r in rec] == \
        [(os.path.join(cache, name), hashlib.sha256(data).hexdigest(), None)]
    assert os.path.isfile(os.path.join(tree, "build", "freetype-2.6.1", "builds", "unix", "configure"))


def test_a_wrong_release_is_not_used(tmp_path) -> None:
    # another version under its own name, and a file named as the wanted version whose header says otherwise
    cache = _cache_with(tmp_path, {"freetype-2.6.2.tar.bz2": _release("2.6.2"),
                                   "freetype_2.6.1.orig.tar.gz": _tar({"freetype-2.6.1/freetype-2.6.1.tar.bz2":
                                                                      _release("2.6.1", header_version="2.6.2")},
                                                                     "w:gz")})
    tree = _tree(tmp_path)
    assert sp.find_release(cache, "freetype", "2.6.1") is None
    assert sp.pre_extract_sources(tree, cache, "rows:1") == []
    assert not os.path.exists(os.path.join(tree, "build"))


def test_the_exact_file_in_the_cache_wins(tmp_path, monkeypatch) -> None:
    exact = _release("2.6.1", "w:gz")
    sha = hashlib.sha256(exact).hexdigest()
    cache = _cache_with(tmp_path, {"freetype-2.6.1.tar.bz2": _release("2.6.1"), sha: exact})
    tree = _tree(tmp_path, SETUPEXT.replace(WANTED_SHA, sha))
    # the build reads the exact file from the seeded cache (seed_download_cache); nothing is pre-extracted
    assert sp.pre_extract_sources(tree, cache, "rows:1") == []


def test_an_archive_member_leaving_the_release_is_refused(tmp_path) -> None:
    bad = _tar({"freetype-2.6.1/include/freetype/freetype.h":
                b"#define FREETYPE_MAJOR 2\n#define FREETYPE_MINOR 6\n#define FREETYPE_PATCH 1\n",
                "freetype-2.6.1/../../escape.txt": b"x"}, "w:bz2")
    cache = _cache_with(tmp_path, {"freetype-2.6.1.tar.bz2": bad})
    tree = _tree(tmp_path)
    with pytest.raises(sp.PrepareError, match="unsafe archive member"):
        sp.pre_extract_sources(tree, cache, "rows:1")
    assert not os.path.exists(tmp_path / "escape.txt")


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout.strip()


def test_prepare_pre_extracts_before_the_install_step_and_records_it(tmp_path) -> None:
    """A row whose install step runs the tree's setupext: it fails without the sources and the exact
    tarball; with the release's orig tarball in the download cache it builds, and the manifest says
    which archive was used."""
    repos = tmp_path / "repos"
    repo = repos / "demo__plotlib"
    repo.mkdir(parents=True)
    _git(str(repo), "init", "-q")
    (repo / "setupext.py").write_text(SETUPEXT)
    _git(str(repo), "add", "setupext.py")
    _git(str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "setupext")
    commit = _git(str(repo), "rev-parse", "HEAD")
    row = {"instance_id": "demo__plotlib-1", "repo": "demo/plotlib", "base_commit": commit, "version": "1.0",
           "environment_setup_commit": commit, "patch": "", "test_patch": "", "FAIL_TO_PASS": "[]",
           "PASS_TO_PASS": "[]", "problem_statement": "x"}
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    harness = tmp_path / "harness.json"
    harness.write_text(json.dumps({"specs": {"demo/plotlib": {"1.0": {
        "python": VERSION, "test_cmd": "pytest -rA", "install": "python setupext.py"}}}, "reqs_paths": {}}))
    orig = _orig("2.6.1")
    sha = hashlib.sha256(orig).hexdigest()
    cache = _cache_with(tmp_path, {sha: orig}, {sha: ORIG_URL})

    def config(name: str, **kw) -> sp.PrepareConfig:
        return sp.PrepareConfig(repos_root=str(repos), envs_root=str(tmp_path / name), harness_specs=str(harness), **kw)

    without = sp.prepare(str(rows), config("bare"))
    assert "Failed to download" in without.failed["demo__plotlib-1"]
    report = sp.prepare(str(rows), config("cached", download_cache=cache))
    assert report.failed == {}, report.failed
    rec = json.load(open(report.manifest_path))["instances"]["demo__plotlib-1"]
    assert [(s["into"], s["archive_sha256"], s["member"]) for s in rec["sources_from_download_cache"]] == \
        [("build/freetype-2.6.1", sha, "freetype-2.6.1/freetype-2.6.1.tar.bz2")]
    assert "building freetype from build/freetype-2.6.1 2" in open(rec["log"]).read()
    assert not any(f.startswith("build/") for f in rec["generated_files"])


def test_the_system_packages_a_spec_installs_are_listed() -> None:
    spec = {"pre_install": ["apt-get -y update && apt-get -y upgrade && DEBIAN_FRONTEND=noninteractive apt-get "
                            "install -y imagemagick ffmpeg dvipng", 'QHULL_URL="http://x.invalid/q.tgz"'],
            "install": "python -m pip install -e ."}
    other = {"pre_install": ["apt-get install -y --no-install-recommends ffmpeg ghostscript"]}
    assert sp.system_packages_wanted([spec, other, {}]) == ["imagemagick", "ffmpeg", "dvipng", "ghostscript"]


def test_an_environment_stamped_under_another_date_bound_is_built_again(tmp_path) -> None:
    """uv environments record the date bound they were installed under: one asked under another bound
    is built again; one whose stamp predates the record is reused and marked 'not recorded'."""
    repo = str(tmp_path / "repos" / "demo__plotlib")
    os.makedirs(repo)
    row = {"instance_id": "demo__plotlib-1", "repo": "demo/plotlib", "base_commit": "0" * 40, "version": "1.0"}
    spec = {"python": VERSION, "test_cmd": "pytest -rA"}  # no packages: the venv alone, offline
    config = sp.PrepareConfig(repos_root=str(tmp_path / "repos"), envs_root=str(tmp_path / "p"),
                              exclude_newer="2024-08-13")
    env_dir = os.path.join(str(tmp_path / "p"), "envs", "demo__plotlib@1.0")

    def stamp(**fields) -> None:
        os.makedirs(env_dir, exist_ok=True)
        record = {"python": sys.executable, "python_version": VERSION, "build_tool_caps": [], "installer": "uv",
                  "env_dir": env_dir, "commands": [], "bytecode": True, **fields}
        with open(os.path.join(env_dir, sp.STAMP), "w") as fh:
            json.dump(record, fh)

    harness = {"specs": {}, "reqs_paths": {}}
    stamp(exclude_newer="2024-08-13")
    assert sp.build_env(row, spec, harness, repo, config, "w")["reused"] is True
    stamp()  # stamped before prepare recorded its bound
    legacy = sp.build_env(row, spec, harness, repo, config, "w")
    assert legacy["reused"] is True and legacy["exclude_newer"] == "not recorded"
    stamp(exclude_newer="2021-01-01")
    assert sp.build_env(row, spec, harness, repo, config, "w")["reused"] is False
    stamp(exclude_newer="2021-01-01", installer="pip")  # pip applies no bound: nothing to compare
    assert sp.build_env(row, spec, harness, repo, config, "w")["reused"] is True
    # uv compiles no bytecode unless told (pip does): a uv environment stamped without it is built again,
    # and the new one records it
    stamp(exclude_newer="2024-08-13", bytecode=False)
    rebuilt = sp.build_env(row, spec, harness, repo, config, "w")
    assert rebuilt["reused"] is False and rebuilt["bytecode"] is True
    stamp(exclude_newer="2024-08-13", bytecode=False, installer="pip")
    assert sp.build_env(row, spec, harness, repo, config, "w")["reused"] is True


def test_every_prepare_step_runs_with_uv_compiling_bytecode(tmp_path) -> None:
    """The harness's pip writes each module's bytecode at install; the sandbox's venv is read-only, so a
    module without it compiles at import, where ``filterwarnings = error`` turns a compile warning into
    a failed collection (flask 2.2's blinker 1.4). uv is told to compile, in every step."""
    out = tmp_path / "env.txt"
    sp._run(["sh", "-c", f"echo $UV_COMPILE_BYTECODE > {out}"], str(tmp_path), str(tmp_path), 60.0, "probe",
            str(tmp_path / "log.txt"), None)
    assert out.read_text().strip() == "1"


def test_install_system_packages_asks_apt_for_what_is_missing_and_records_it(tmp_path, monkeypatch) -> None:
    """The wiring of ``--install-system-packages`` (apt itself replaced: it needs root and changes the
    machine): only the packages the specs name, this machine lacks and apt has are installed, and the
    manifest records what was wanted, installed and unavailable."""
    from compactrl.tasksets import system_packages

    asked: list[list[str]] = []
    monkeypatch.setattr(sp, "_dpkg_installed", lambda p: p == "dvipng")
    monkeypatch.setattr(system_packages, "apt_candidate", lambda p: None if p == "nosuchpkg" else "1.0")
    monkeypatch.setattr(system_packages, "host_has_package", lambda p: p == "dvipng")
    monkeypatch.setattr(system_packages, "install_system_packages",
                        lambda packages, record=None, echo=print: asked.append(list(packages)) or list(packages))
    specs = [{"pre_install": ["apt-get update && apt-get install -y ghostscript dvipng nosuchpkg"]}]
    got = sp.install_system_packages_for(specs)
    assert asked == [["ghostscript"]]
    assert got["wanted"] == ["ghostscript", "dvipng", "nosuchpkg"] and got["installed"] == ["ghostscript"]
    assert got["unavailable"] == ["nosuchpkg"]
