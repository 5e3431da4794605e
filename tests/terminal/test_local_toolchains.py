"""The local sandbox runs what real Terminal-Bench tasks build with: recursive make (and so CMake's
compiler check) and the host's toolchains (C/C++, Rust through rustup, Node) when present."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from compactrl.sandbox.local import LocalSandbox
from compactrl.task import Check, Task

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tasksets"))
from loader_helpers import local_unavailable  # noqa: E402

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))]

FILES = {
    "Makefile": "all:\n\t$(MAKE) -f sub.mk inner\n",
    "sub.mk": "inner:\n\t@echo from-the-sub-make\n",
    "CMakeLists.txt": "cmake_minimum_required(VERSION 3.10)\nproject(p C CXX)\nadd_executable(hello hello.cpp)\n",
    "hello.cpp": "#include <iostream>\nint main() { std::cout << \"hello-cmake\" << std::endl; }\n",
    "r/Cargo.toml": "[package]\nname = \"r\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    "r/src/main.rs": "fn main() { println!(\"hello-rust\"); }\n",
}


@pytest.fixture(scope="module", params=["bwrap", "unshare"])
def sandbox(request):
    sb = LocalSandbox(isolation=request.param)
    sb.start(Task(id="tools", kind="terminal", instruction="-", files=FILES, check=Check(kind="script", command="true")))
    try:
        yield sb
    finally:
        sb.close()


def test_recursive_make(sandbox):
    res = sandbox.exec("make")
    assert res.exit_code == 0, res.output
    assert "from-the-sub-make" in res.output and "Invalid argument" not in res.output


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("c++") is None, reason="no cmake / c++ here")
def test_cmake_compiler_check_and_build(sandbox):
    res = sandbox.exec("mkdir -p /tmp/b && cd /tmp/b && cmake $OLDPWD >/dev/null && make && ./hello", timeout_s=240)
    assert res.exit_code == 0, res.output
    assert res.output.rstrip().endswith("hello-cmake")


@pytest.mark.skipif(shutil.which("cargo") is None, reason="no cargo here")
def test_cargo_builds_offline(sandbox):
    res = sandbox.exec("cd /workspace/r && cargo run --offline -q", timeout_s=240)
    assert res.exit_code == 0, res.output
    assert "hello-rust" in res.output


@pytest.mark.skipif(shutil.which("node") is None, reason="no node here")
def test_node_runs(sandbox):
    res = sandbox.exec("node -e 'console.log(6 * 7)'")
    assert (res.exit_code, res.output.strip()) == (0, "42")
