"""Fixtures of the loader tests: the SWE-bench fixture repository built in a temp dir, and which
real backends this machine can run (local needs bubblewrap or unshare; docker needs an engine
holding the default image: ``bash scripts/ci_docker.sh``)."""

from __future__ import annotations

import pytest
from loader_helpers import build_module, docker_unavailable, local_unavailable


@pytest.fixture(scope="session")
def swebench_build():
    return build_module()


@pytest.fixture(scope="session")
def repos_root(tmp_path_factory, swebench_build) -> str:
    """A folder with the fixture checkout ``mathkit-dev__mathkit`` at the row's base commit."""
    root = str(tmp_path_factory.mktemp("repos"))
    commit = swebench_build.build_repo(root)
    assert commit == swebench_build.BASE_COMMIT
    return root


@pytest.fixture(params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request) -> str:
    why = local_unavailable() if request.param == "local" else docker_unavailable()
    if why:
        pytest.skip(why)
    return request.param


@pytest.fixture
def cache(tmp_path, monkeypatch) -> str:
    """A fresh cache of Terminal-Bench tasks' prepared local states (the default one lives in
    ~/.cache), for the tests of ``tb_local_build``; it stands in for pytest's own ``cache`` here."""
    path = str(tmp_path / "tb-local")
    monkeypatch.setenv("COMPACTRL_TB_LOCAL_CACHE", path)
    return path
