"""Installers a reference solution fetches, served offline to the episode (astral.sh's uv installer), and
uv projects the solution builds itself, installed from the task's wheelhouse: the rules that decide
it, and the episode's real ``curl``/``wget`` commands that answer the installer's URL."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from loader_helpers import write_tb_task

from compactrl.tasksets.terminal_bench import local_build as tlb
from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig, load_task_dir

URL = "https://astral.sh/uv/0.7.13/install.sh"
UV_SOLUTION = f"curl -LsSf {URL} | sh\nsource $HOME/.local/bin/env\nuv init\nuv add pandas pyarrow\nuv run convert.py\n"


def test_the_uv_installer_is_served_and_a_uv_project_the_solution_creates_is_offline() -> None:
    assert tlb.served_installers(UV_SOLUTION) == {URL: "uv==0.7.13"}
    assert tlb.served_installers("wget -qO- https://astral.sh/uv/install.sh | sh") == {
        "https://astral.sh/uv/install.sh": "uv"}
    assert tlb.solution_network(UV_SOLUTION) is None
    assert tlb.uv_added_requirements(UV_SOLUTION) == ["pandas", "pyarrow"]
    # a project the task ships (its dependencies are not in the wheelhouse), or none created: network
    assert tlb.solution_network(UV_SOLUTION, has_project=True) == "uv init (a project environment from the network)"
    assert tlb.solution_network("uv add flask\n") == "uv add (a project environment from the network)"
    # what the wheelhouse cannot hold is fetched from where it says
    for add in ("uv add -r requirements.txt", "uv add git+https://github.com/a/b", "uv add --index-url https://x/ y",
                "uv add https://x.org/p-1.0-py3-none-any.whl"):
        assert tlb.solution_network(f"uv init\n{add}\n") is not None, add
    assert tlb.solution_network("uv init\nuv --directory /app add flask\nuv run --with numpy x.py\n") is None
    # any other installer piped to a shell still needs the network
    assert tlb.solution_network("curl -fsSL https://example.com/install.sh | sh\n").startswith("curl")


def test_the_plan_prepares_the_tool_and_names_what_it_serves() -> None:
    plan, why = tlb.plan([], {}, "", "/app", "k", solution_served={URL: "uv==0.7.13"})
    assert why is None and plan.tools == ["uv==0.7.13"] and plan.to_json()["served"] == {URL: "uv==0.7.13"}
    assert any("curl and wget serve the installer offline" in note for note in plan.mapped)


def test_a_task_whose_solution_installs_uv_and_builds_a_uv_project_is_gradable(tmp_path: Path) -> None:
    folder = write_tb_task(tmp_path / "uv-task", instruction="Convert data.csv to data.parquet.",
                           dockerfile="FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\nWORKDIR /app\n",
                           solution=UV_SOLUTION, tests="def test_ok():\n    assert True\n")
    task = load_task_dir(folder, TerminalBenchConfig(backend="local"))
    assert not task.grading.not_gradable
    build = task.build.plan
    assert build["served"] == {URL: "uv==0.7.13"} and build["tools"] == ["uv==0.7.13"]
    assert build["wheelhouse"] == ["pandas", "pyarrow"]
    assert task.runtime.env["PATH"].startswith("__SITE__/../pybin:") and task.runtime.env["UV_OFFLINE"] == "1"
    # the same solution in a task whose image has a project of its own needs the network
    (Path(folder) / "pyproject.toml").write_text("[project]\nname = 'x'\nversion = '0'\ndependencies = ['numpy']\n")
    with open(Path(folder) / "Dockerfile", "a") as fh:
        fh.write("COPY pyproject.toml /app/\n")
    shipped = load_task_dir(folder, TerminalBenchConfig(backend="local"))
    assert shipped.grading.not_gradable.startswith("needs network: the reference solution runs uv init")


def _state(tmp_path: Path) -> Path:
    """A prepared state's ``pybin`` (what prepare writes) and ``tools/uv-0.7.13`` (a stand-in ``uv``: the
    wheel itself comes from PyPI at prepare time, which tests do not reach)."""
    state = tmp_path / "state"
    bin_dir = state / "tools" / "uv-0.7.13" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("uv", "uvx"):
        (bin_dir / name).write_text(f"#!/bin/sh\necho {name} 0.7.13 \"$@\"\n")
        (bin_dir / name).chmod(0o755)
    tlb.write_served(str(state / "pybin"), {URL: "uv==0.7.13"})
    return state


def _sh(state: Path, home: Path, script: str) -> subprocess.CompletedProcess:
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "PATH": f"{state / 'pybin'}:/usr/local/bin:/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", script], cwd=home, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("fetch", [f"curl -LsSf {URL}", f"wget -qO- {URL}", f"curl -fsSL -o - {URL}"])
def test_the_episode_curl_and_wget_serve_the_installer_which_installs_where_the_published_one_does(
        tmp_path: Path, fetch: str) -> None:
    state = _state(tmp_path)
    got = _sh(state, tmp_path / "home", f"{fetch} | sh && source $HOME/.local/bin/env && uv --version && which uvx")
    assert got.returncode == 0, got.stderr
    assert "uv 0.7.13 --version" in got.stdout
    assert got.stdout.strip().endswith(str(tmp_path / "home" / ".local" / "bin" / "uvx"))


def test_the_served_installer_honours_the_install_folder_and_output_files(tmp_path: Path) -> None:
    state = _state(tmp_path)
    got = _sh(state, tmp_path / "home", f"curl -LsSf {URL} | env UV_INSTALL_DIR=$HOME/tools sh && ls $HOME/tools")
    assert got.returncode == 0 and got.stdout.split()[-3:] == ["env", "uv", "uvx"], got
    # saved to a file first: curl -o FILE, curl -O, wget's default name
    for fetch, saved in ((f"curl -sSfo inst.sh {URL}", "inst.sh"), (f"curl -sSLO {URL}", "install.sh"),
                         (f"wget -q {URL}", "install.sh"), (f"wget -q -O inst.sh {URL}", "inst.sh")):
        home = tmp_path / saved.replace(".", "_") / fetch.split()[0]
        home.mkdir(parents=True)
        got = _sh(state, home, f"{fetch} && sh {saved} && $HOME/.local/bin/uv self version")
        assert got.returncode == 0 and "uv 0.7.13 self version" in got.stdout, (fetch, got)


@pytest.mark.skipif(shutil.which("curl") is None, reason="the machine has no curl")
def test_other_calls_go_to_the_machine_curl(tmp_path: Path) -> None:
    state = _state(tmp_path)
    got = _sh(state, tmp_path / "home", "curl --version")
    assert got.returncode == 0 and got.stdout.startswith("curl "), got
    # an address nothing serves: the real curl's own error (here on a closed loopback port)
    got = _sh(state, tmp_path / "home", "curl -sS http://127.0.0.1:9/x")
    assert got.returncode == 7 and "curl" in got.stderr
    assert os.access(state / "pybin" / "wget", os.X_OK)


def test_a_command_the_machine_lacks_is_not_found_as_the_shell_says(tmp_path: Path) -> None:
    state = _state(tmp_path)
    bare = tmp_path / "bare-bin"  # what the shim itself needs, and no curl
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    (bare / "dirname").symlink_to(shutil.which("dirname"))
    env = {"HOME": str(tmp_path), "PATH": f"{state / 'pybin'}:{bare}"}
    got = subprocess.run([str(state / "pybin" / "curl"), "http://127.0.0.1:9/x"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 127 and got.stderr.strip() == "curl: command not found"


def test_a_build_script_that_installs_uv_and_builds_a_uv_project_runs_as_written(tmp_path: Path) -> None:
    # the official 1.x pattern: `COPY install.sh /app` then `RUN bash /app/install.sh`
    (tmp_path / "install.sh").write_text(
        f"apt-get update\napt-get install -y curl\ncurl -LsSf {URL} | sh\nsource $HOME/.local/bin/env\n"
        "uv init\nuv add pytest==8.4.1\nuv pip install pillow==11.2.1 numpy==2.3.1\n")
    seg = tlb.classify("bash /app/install.sh", {}, str(tmp_path))
    assert seg.action == "script" and seg.detail == {
        "script": "install.sh", "served": {URL: "uv==0.7.13"}, "wheels": ["pytest==8.4.1", "pillow==11.2.1", "numpy==2.3.1"]}
    steps = [{"op": "run", "command": "bash /app/install.sh", "workdir": "/app"}]
    plan, why = tlb.plan(steps, {}, str(tmp_path), "/app", "k")
    assert why is None and plan.served == {URL: "uv==0.7.13"} and plan.tools == ["uv==0.7.13"]
    assert plan.wheelhouse == ["pytest==8.4.1", "pillow==11.2.1", "numpy==2.3.1"]
    # the tests run in that project (`uv run pytest`), so what it has is where the tests look too
    assert set(plan.pip) == {r for r in plan.wheelhouse if not tlb._satisfied(r)}
    assert plan.steps[-1]["command"] == "bash /app/install.sh"  # run as written
    # a build script that fetches anything else still needs its image
    (tmp_path / "install.sh").write_text(f"curl -LsSf {URL} | sh\nuv init\nuv add -r requirements.txt\n")
    assert tlb.classify("bash /app/install.sh", {}, str(tmp_path)).action == "image"
    (tmp_path / "install.sh").write_text("curl -fsSL https://example.com/x.sh | sh\n")
    assert tlb.classify("bash /app/install.sh", {}, str(tmp_path)).action == "image"
