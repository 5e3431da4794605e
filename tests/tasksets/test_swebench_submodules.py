"""Submodules a row's tree pins (astropy 1.x's astropy_helpers) are supplied into its work tree before the
install step: the pinned commit from the submodule's repository, else the release the superproject's
pinning commit names, from the download cache (found by content) or the package index (sha256 checked);
nothing here touches a network (the index is a stand-in opener)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile

import pytest

from compactrl.tasksets.swebench import submodules as sm

pytestmark = pytest.mark.timeout(60)
URL = "https://github.com/astro/helpers-lib.git"


def git(cwd, *args) -> str:
    return subprocess.run(["git", "-C", str(cwd), "-c", "user.email=a@b", "-c", "user.name=a", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repos(tmp_path):
    """A submodule repository (two commits) and a superproject pinning its first, "Updating helpers to v1.2.3"."""
    root = tmp_path / "repos"
    sub = root / "astro__helpers-lib"
    (sub / "helpers_lib").mkdir(parents=True)
    (sub / "setup.py").write_text("VERSION = '1.2.3'\n")
    (sub / "helpers_lib" / "__init__.py").write_text("x = 1\n")
    git(sub, "init", "-q")
    git(sub, "add", "-A")
    git(sub, "commit", "-q", "-m", "1.2.3")
    pinned = git(sub, "rev-parse", "HEAD")
    (sub / "helpers_lib" / "__init__.py").write_text("x = 2\n")
    git(sub, "commit", "-q", "-am", "later")
    sup = root / "astro__main"
    sup.mkdir()
    (sup / "setup.py").write_text("import helpers_lib\n")
    (sup / ".gitmodules").write_text(f'[submodule "helpers_lib"]\n\tpath = helpers_lib\n\turl = {URL}\n')
    git(sup, "init", "-q")
    git(sup, "add", "-A")
    git(sup, "update-index", "--add", "--cacheinfo", f"160000,{pinned},helpers_lib")
    git(sup, "commit", "-q", "-m", "Updating helpers to v1.2.3")
    base = git(sup, "rev-parse", "HEAD")
    (sup / "README").write_text("later\n")
    git(sup, "add", "README")
    git(sup, "commit", "-q", "-m", "docs")  # the pin's version is read from the commit that set it
    return root, sup, git(sup, "rev-parse", "HEAD"), pinned, base


def worktree(sup, commit, dest) -> str:
    git(sup, "worktree", "add", "-q", "--detach", str(dest), commit)
    assert os.listdir(dest / "helpers_lib") == []  # what prepare's checkout leaves: an empty folder
    return str(dest)


def sdist(path, name="helpers-lib", version="1.2.3", init="x = 1\n") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for rel, text in {"PKG-INFO": f"Metadata-Version: 1.0\nName: {name}\nVersion: {version}\n",
                          "setup.py": f"VERSION = '{version}'\n", "helpers_lib/__init__.py": init}.items():
            info = tarfile.TarInfo(f"{name}-{version}/{rel}")
            info.size = len(text.encode())
            t.addfile(info, io.BytesIO(text.encode()))
    data = buf.getvalue()
    if path is not None:
        path.write_bytes(data)
    return data


def test_gitlinks_and_the_version_the_pin_names(repos) -> None:
    root, sup, head, pinned, _ = repos
    assert sm.gitlinks(str(sup), head) == [{"path": "helpers_lib", "commit": pinned, "url": URL}]
    assert sm.pinned_version(str(sup), head, "helpers_lib") == ("1.2.3", "Updating helpers to v1.2.3")
    assert sm.repo_name(URL) == ("astro", "helpers-lib")
    assert sm.repo_name("git@github.com:astro/helpers-lib") == ("astro", "helpers-lib")


def test_the_submodules_repository_gives_the_pinned_commit_exactly(repos, tmp_path) -> None:
    root, sup, head, pinned, _ = repos
    tree = worktree(sup, head, tmp_path / "tree")
    done = sm.supply(str(sup), head, tree, repos_root=str(root), cache=None, keep=str(tmp_path / "keep"))
    assert done[0]["source"].startswith("repository ") and done[0]["commit"] == pinned
    assert open(os.path.join(tree, "helpers_lib", "helpers_lib", "__init__.py")).read() == "x = 1\n"  # not "later"
    assert sm.supply(str(sup), head, tree, repos_root=str(root), cache=None, keep="") == []  # filled: left alone


def test_a_release_from_the_download_cache_found_by_content(repos, tmp_path) -> None:
    root, sup, head, pinned, _ = repos
    os.rename(root / "astro__helpers-lib", tmp_path / "elsewhere")
    cache = tmp_path / "cache"
    cache.mkdir()
    sdist(cache / "a.tgz", version="1.2.2", init="old\n")  # another release: never used
    sdist(cache / "whatever-name.tar.gz")
    tree = worktree(sup, head, tmp_path / "tree")
    done = sm.supply(str(sup), head, tree, repos_root=str(root), cache=str(cache), keep=str(tmp_path / "keep"))
    assert done[0]["source"] == "release helpers-lib 1.2.3 from the download cache"
    assert done[0]["archive"].endswith("whatever-name.tar.gz") and done[0]["pinned_by"] == "Updating helpers to v1.2.3"
    assert open(os.path.join(tree, "helpers_lib", "helpers_lib", "__init__.py")).read() == "x = 1\n"


class FakeIndex:
    """The index's JSON listing and its files, as an opener (no network)."""

    def __init__(self, data: bytes, sha: str) -> None:
        self.data, self.sha, self.urls = data, sha, []

    def __call__(self, request, timeout=None):
        url = getattr(request, "full_url", request)
        self.urls.append(url)
        if url.endswith("/helpers-lib/"):
            body = json.dumps({"files": [
                {"filename": "helpers_lib-1.2.3-py3-none-any.whl", "url": "u/w", "hashes": {"sha256": "0"}},
                {"filename": "helpers-lib-1.2.3.tar.gz", "url": "u/s", "hashes": {"sha256": self.sha}}]}).encode()
        else:
            body = self.data
        return io.BytesIO(body)


def test_a_release_from_the_package_index_with_its_sha256_checked(repos, tmp_path, monkeypatch) -> None:
    root, sup, head, pinned, _ = repos
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    os.rename(root / "astro__helpers-lib", tmp_path / "elsewhere")
    data = sdist(None)
    tree = worktree(sup, head, tmp_path / "tree")
    with pytest.raises(sm.SubmoduleError, match="sha256 is not the package index's"):
        sm.supply(str(sup), head, tree, repos_root=str(root), cache=None, keep=str(tmp_path / "keep"),
                  opener=FakeIndex(data, "f" * 64))
    os.rmdir(os.path.join(tree, "helpers_lib"))
    index = FakeIndex(data, hashlib.sha256(data).hexdigest())
    done = sm.supply(str(sup), head, tree, repos_root=str(root), cache=None, keep=str(tmp_path / "keep"), opener=index)
    assert done[0]["source"] == "release helpers-lib 1.2.3 from the package index"
    assert index.urls == ["http://127.0.0.1:9/simple/helpers-lib/", "u/s"]  # the sdist, not the wheel
    assert sorted(os.listdir(os.path.join(tree, "helpers_lib"))) == ["PKG-INFO", "helpers_lib", "setup.py"]
    assert os.path.isfile(tmp_path / "keep" / "helpers-lib-1.2.3.tar.gz")  # kept for the next prepare


def test_a_pin_nothing_supplies_is_an_error_naming_it(repos, tmp_path) -> None:
    root, sup, head, pinned, base = repos
    os.rename(root / "astro__helpers-lib", tmp_path / "elsewhere")
    (sup / "x").write_text("1")
    git(sup, "update-index", "--add", "--cacheinfo", f"160000,{'a' * 40},helpers_lib")
    git(sup, "commit", "-q", "-m", "bump helpers")
    head2 = git(sup, "rev-parse", "HEAD")
    tree = tmp_path / "tree"
    git(sup, "worktree", "add", "-q", "--detach", str(tree), head2)
    with pytest.raises(sm.SubmoduleError, match=rf"submodule helpers_lib \(pinned at {'a' * 12}, {URL}\): no repository "
                                                r"astro__helpers-lib under --repos-root"):
        sm.supply(str(sup), head2, str(tree), repos_root=str(root), cache=None, keep=str(tmp_path / "keep"))
