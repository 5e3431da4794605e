"""What ``compactrl tasks prepare`` supplies that a real row's environment cannot fetch or resolve
here, offline: the build-tool caps of old interpreters (a constraints file on every package install,
recorded, and a stamped environment built without them built again), blobs a checkout lacks (named
with how to supply them, then taken from the download cache by their git blob id) and files a build
step downloads (served by ``wget``/``curl`` from the cache by URL, seeded by sha256 where a build's
own download cache looks, every hash checked)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile

import pytest
from loader_helpers import SWEBENCH_ROWS

from compactrl.tasksets.swebench import prepare as sp
from compactrl.tasksets.swebench.rows import read_rows

pytestmark = pytest.mark.timeout(300)

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
IID = "mathkit-dev__mathkit-17"


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout.strip()


def _wheel(folder, name: str, version: str) -> None:
    """A minimal pure-Python wheel (what an index would serve), written by hand: offline."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},,\n" for path in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(os.path.join(folder, f"{name}-{version}-py3-none-any.whl"), "w") as zf:
        for path, text in {**files, f"{dist}/RECORD": record}.items():
            zf.writestr(path, text)


# ============================================================================ build-tool caps
def test_the_caps_table_covers_the_interpreters_conda_never_built_cython_3_for() -> None:
    for old in ("3.5", "3.6", "3.7"):
        assert sp.build_tool_caps(old) == ("cython<3",)
    for new in ("3.8", "3.9", "3.11"):
        assert sp.build_tool_caps(new) == ()


def test_build_env_applies_the_caps_to_every_install_and_records_them(tmp_path, repos_root, monkeypatch) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("0.9", "1.0"):
        _wheel(str(wheels), "capdemo", version)
    monkeypatch.setitem(sp.BUILD_TOOL_CAPS, VERSION, ("capdemo<1",))
    row = read_rows(SWEBENCH_ROWS)[0]
    spec = {"python": VERSION, "packages": "capdemo", "test_cmd": "pytest -rA"}
    config = sp.PrepareConfig(repos_root=repos_root, envs_root=str(tmp_path / "prepared"), exclude_newer=None,
                              pip_args=("--no-index", "--find-links", str(wheels)))
    repo_path = os.path.join(repos_root, "mathkit-dev__mathkit")
    env = sp.build_env(row, spec, {"specs": {}, "reqs_paths": {}}, repo_path, config, "rows:1")
    assert env["build_tool_caps"] == ["capdemo<1"] and env["reused"] is False
    got = subprocess.run([env["python"], "-c", "import capdemo; print(capdemo.VERSION)"], capture_output=True, text=True)
    assert got.stdout.strip() == "0.9", got.stderr  # without the cap the newest, 1.0, is taken
    with open(env["log"], encoding="utf-8") as fh:
        assert "build-tool-caps.txt" in fh.read()
    assert sp.build_env(row, spec, {"specs": {}, "reqs_paths": {}}, repo_path, config, "rows:1")["reused"] is True
    # an environment stamped without the caps its Python needs (built before they were known) is rebuilt
    monkeypatch.setitem(sp.BUILD_TOOL_CAPS, VERSION, ("capdemo<0.95",))
    again = sp.build_env(row, spec, {"specs": {}, "reqs_paths": {}}, repo_path, config, "rows:1")
    assert again["reused"] is False and again["build_tool_caps"] == ["capdemo<0.95"]


# ============================================================================ blobs a checkout lacks
@pytest.fixture()
def thin_repo(tmp_path):
    """A repository whose commit names a blob it does not hold (as a snapshot without its largest files)."""
    repo = str(tmp_path / "thin")
    os.makedirs(os.path.join(repo, "data"))
    subprocess.run(["git", "init", "-q", repo], check=True)
    with open(os.path.join(repo, "README"), "w") as fh:
        fh.write("small\n")
    payload = b"1962 1 1 0 37665.00 -0.012700 0.213000\n" * 50
    with open(os.path.join(repo, "data", "eop.dat"), "wb") as fh:
        fh.write(payload)
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "data")
    commit = _git(repo, "rev-parse", "HEAD")
    blob = _git(repo, "rev-parse", f"{commit}:data/eop.dat")
    os.unlink(os.path.join(repo, ".git", "objects", blob[:2], blob[2:]))
    return repo, commit, blob, payload


def test_a_missing_blob_is_named_with_how_to_supply_it(tmp_path, thin_repo) -> None:
    repo, commit, blob, _ = thin_repo
    assert sp.missing_blobs(repo, commit) == [("data/eop.dat", blob)]
    with pytest.raises(sp.PrepareError) as err:
        sp.checkout(repo, commit, str(tmp_path / "tree"), "rows.jsonl:3: x__y-1")
    text = str(err.value)
    assert "rows.jsonl:3: x__y-1" in text and "data/eop.dat" in text and blob in text
    assert "--download-cache" in text and "hash-object -w" in text
    empty = tmp_path / "cache"
    empty.mkdir()
    with pytest.raises(sp.PrepareError, match="1 file"):
        sp.checkout(repo, commit, str(tmp_path / "tree"), "w", str(empty))


def test_the_download_cache_supplies_a_missing_blob_by_its_id(tmp_path, thin_repo) -> None:
    repo, commit, blob, payload = thin_repo
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / blob).write_bytes(payload)
    added = sp.checkout(repo, commit, str(tmp_path / "tree"), "w", str(cache))
    assert added == [{"path": "data/eop.dat", "blob": blob, "file": str(cache / blob)}]
    assert (tmp_path / "tree" / "data" / "eop.dat").read_bytes() == payload
    assert sp.missing_blobs(repo, commit) == []


def test_a_cache_file_named_by_a_hash_it_does_not_have_is_refused(tmp_path, thin_repo) -> None:
    repo, commit, blob, payload = thin_repo
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / blob).write_bytes(payload + b"edited\n")
    with pytest.raises(ValueError, match="named by a git blob id"):
        sp.checkout(repo, commit, str(tmp_path / "tree"), "w", str(cache))
    (cache / blob).unlink()
    (cache / ("0" * 64)).write_bytes(payload)
    with pytest.raises(ValueError, match="named by a sha256"):
        sp.download_cache_index(str(cache))


# ============================================================================ files a build downloads
def _tarball(top: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        data = b"int qh_version = 2020;\n"
        info = tarfile.TarInfo(f"{top}/src/libqhull_r/qhull_ra.h")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


URL = "http://www.example.invalid/download/qhull-2020-src-8.0.2.tgz"


def _cache(tmp_path) -> tuple[str, str, bytes]:
    cache = tmp_path / "cache"
    cache.mkdir()
    data = _tarball("qhull-2020.2")
    sha = hashlib.sha256(data).hexdigest()
    (cache / "qhull_2020.2.orig.tar.gz").write_bytes(data)  # any name: found by content
    (cache / "urls.txt").write_text(f"# from the Debian archive\n{sha} {URL}\n")
    return str(cache), sha, data


def test_the_cache_index_and_its_urls_are_checked(tmp_path) -> None:
    cache, sha, data = _cache(tmp_path)
    index = sp.download_cache_index(cache)
    assert index["sha256"] == {sha: os.path.join(cache, "qhull_2020.2.orig.tar.gz")} and index["urls"] == {URL: sha}
    with open(os.path.join(cache, "urls.txt"), "a") as fh:
        fh.write(f"{'1' * 64} http://elsewhere.invalid/x.tgz\n")
    with pytest.raises(ValueError, match=r"urls.txt:3: no file .* has sha256 1111"):
        sp.download_cache_index(cache)


def test_seeding_serves_urls_to_wget_and_fills_a_builds_sha256_cache(tmp_path) -> None:
    cache, sha, data = _cache(tmp_path)
    env = sp.seed_download_cache(cache, str(tmp_path / "seeded"), ["matplotlib"])
    # where matplotlib's setupext reads before downloading: $XDG_CACHE_HOME/matplotlib/<sha256>
    assert open(os.path.join(env["XDG_CACHE_HOME"], "matplotlib", sha), "rb").read() == data
    run_env = {**os.environ, "PATH": f"{env['PATH_PREFIX']}:{os.environ['PATH']}"}
    out = tmp_path / "got.tgz"
    res = subprocess.run(["wget", "-O", str(out), URL], env=run_env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert out.read_bytes() == data and "from the download cache" in res.stderr
    res = subprocess.run(["curl", "-sSL", URL, "-o", str(tmp_path / "c.tgz")], env=run_env, capture_output=True, text=True)
    assert res.returncode == 0 and (tmp_path / "c.tgz").read_bytes() == data
    # a cached file changed after seeding is refused, not served
    with open(os.path.join(cache, "qhull_2020.2.orig.tar.gz"), "ab") as fh:
        fh.write(b"x")
    res = subprocess.run(["wget", "-O", str(tmp_path / "bad.tgz"), URL], env=run_env, capture_output=True, text=True)
    assert res.returncode == 1 and "no longer has sha256" in res.stderr


def test_prepare_runs_a_pre_install_download_from_the_cache(tmp_path, repos_root) -> None:
    cache, sha, data = _cache(tmp_path)
    spec = {"python": VERSION, "test_cmd": "pytest -rA",
            "pre_install": [f'QHULL_URL="{URL}"', 'QHULL_TAR="/tmp/qhull-$$.tgz"', 'QHULL_BUILD_DIR="/testbed/build"',
                            'wget -O "$QHULL_TAR" "$QHULL_URL"', 'mkdir -p "$QHULL_BUILD_DIR"',
                            'tar -xzf "$QHULL_TAR" -C "$QHULL_BUILD_DIR"', 'rm "$QHULL_TAR"']}
    harness = tmp_path / "harness.json"
    harness.write_text(json.dumps({"specs": {"mathkit-dev/mathkit": {"0.3": spec}}, "reqs_paths": {}}))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(read_rows(SWEBENCH_ROWS)[0]) + "\n")
    config = sp.PrepareConfig(repos_root=repos_root, envs_root=str(tmp_path / "prepared"), harness_specs=str(harness),
                              download_cache=cache)
    report = sp.prepare(str(rows), config)
    assert report.failed == {}, report.failed
    rec = report.prepared[IID]
    tree = rec["checkout"]
    assert open(os.path.join(tree, "build", "qhull-2020.2", "src", "libqhull_r", "qhull_ra.h")).read() == \
        "int qh_version = 2020;\n"
    assert rec["download_cache"]["folder"] == os.path.abspath(cache)
    manifest = json.load(open(report.manifest_path))
    assert manifest["instances"][IID]["download_cache"]["folder"] == os.path.abspath(cache)
    with pytest.raises(ValueError, match="PrepareConfig.download_cache"):
        sp.PrepareConfig(repos_root=repos_root, envs_root=str(tmp_path / "p"), download_cache=str(tmp_path / "nope"))


# ============================================================================ the install step's dependencies
def test_bounded_dependencies_keep_what_the_environment_holds(tmp_path) -> None:
    """Resolving the project's dependencies under the date bound keeps the versions the environment
    already has where the project allows them (as pip's ``install -e .`` does) and adds the missing."""
    if sp._find_uv() is None:
        pytest.skip("uv is not installed (the tasks extra)")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name, version in (("capdemo", "0.9"), ("capdemo", "1.0"), ("capextra", "2.0")):
        _wheel(str(wheels), name, version)
    venv = str(tmp_path / "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    offline = ["--no-index", "--find-links", str(wheels)]
    subprocess.run([*sp._find_uv(), "pip", "install", "--python", python, *offline, "capdemo==0.9"], check=True,
                   capture_output=True)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pyproject.toml").write_text('[project]\nname = "proj"\nversion = "1"\n'
                                         'dependencies = ["capdemo>=0.5", "capextra"]\n')
    config = sp.PrepareConfig(repos_root=str(tmp_path), envs_root=str(tmp_path / "p"), exclude_newer="2099-01-01",
                              pip_args=tuple(offline))
    done = sp._bounded_dependencies(str(tree), venv, "python -m pip install -e .", config, "w",
                                    str(tmp_path / "log"), None)
    assert done is True, open(tmp_path / "log").read()
    got = subprocess.run([python, "-c", "import capdemo, capextra; print(capdemo.VERSION, capextra.VERSION)"],
                         capture_output=True, text=True)
    assert got.stdout.split() == ["0.9", "2.0"], got.stderr  # not upgraded to 1.0; the missing one added


def test_a_row_prepare_could_not_prepare_is_flagged_with_the_reason(tmp_path, repos_root) -> None:
    from compactrl.tasksets.swebench.rows import SWEBenchConfig, load_swebench

    spec = {"python": VERSION, "test_cmd": "pytest -rA", "install": "echo 'error: no wheel for qhull' >&2; exit 3"}
    harness = tmp_path / "harness.json"
    harness.write_text(json.dumps({"specs": {"mathkit-dev/mathkit": {"0.3": spec}}, "reqs_paths": {}}))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(read_rows(SWEBENCH_ROWS)[0]) + "\n")
    config = sp.PrepareConfig(repos_root=repos_root, envs_root=str(tmp_path / "prepared"), harness_specs=str(harness))
    report = sp.prepare(str(rows), config)
    assert list(report.failed) == [IID]
    specs = json.load(open(report.specs_path))
    assert specs[IID]["not_gradable"].startswith("not prepared: ") and "error: no wheel for qhull" in specs[IID]["not_gradable"]
    task = load_swebench(str(rows), SWEBenchConfig(repos_root=repos_root, specs=report.specs_path))[0]
    assert task.grading.not_gradable == specs[IID]["not_gradable"] and task.files == {}


def test_environment_yml_optional_test_dependencies_are_installed_best_effort(tmp_path) -> None:
    repo = str(tmp_path / "r")
    os.makedirs(os.path.join(repo, "ci"))
    subprocess.run(["git", "init", "-q", repo], check=True)
    with open(os.path.join(repo, "ci", "environment.yml"), "w") as fh:
        fh.write("name: t\ndependencies:\n  - numpy=1.23\n  - sparse\n  - pint>=0.15\n  - hdf5\n  - pip:\n    - foo==1\n")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-q", "-m", "env")
    skipped, optional = [], []
    lines = sp.environment_yml_requirements(repo, "HEAD", ["ci/environment.yml"], "w", skipped, optional)
    assert lines == ["numpy==1.23", "foo==1"] and skipped == ["hdf5"] and optional == ["sparse", "pint>=0.15"]
