"""Release archives rebuilt from a reachable registry (tb_downloads) and verifiers' ``uvx ... pytest``
run offline (offline_uvx): the URL table and the curl/wget parsing, the Kotlin zip rebuilt from an
npm-shaped package with the release's layout and modes, the cache read without downloading, and a 2.x
task whose image downloads a compiler and whose verifier builds with it before ``uvx pytest``, graded
by its own script in the real local sandbox. The package is a fixture made here (a ``kotlinc`` that
"compiles" by copying): no download, no JVM needed."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import zipfile

import pytest
from loader_helpers import local_unavailable

from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.tasksets.terminal_bench import downloads as td
from compactrl.tasksets.terminal_bench import local_build as tlb
from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig, load_task_dir, offline_uvx

URL = "https://github.com/JetBrains/kotlin/releases/download/v1.9.22/kotlin-compiler-1.9.22.zip"
# "compiles" the first argument into the file after -d when it has a main function
FAKE_KOTLINC = """#!/bin/sh
src=$1; shift
while [ $# -gt 0 ]; do [ "$1" = -d ] && out=$2; shift; done
grep -q 'fun main' "$src" || { echo "error: no main in $src" >&2; exit 1; }
cp "$src" "$out"
"""


def _npm_package(folder, build: str = "1.9.22-release-704") -> str:
    """A tarball shaped as npm's kotlin-compiler: package/{package.json,build.txt,bin/kotlinc,lib/...}."""
    path = os.path.join(str(folder), "kotlin-compiler-1.9.22.tgz")
    with tarfile.open(path, "w:gz") as tf:
        for name, text, mode in (("package/package.json", '{"name": "kotlin-compiler"}', 0o644),
                                 ("package/build.txt", build + "\n", 0o644),
                                 ("package/bin/kotlinc", FAKE_KOTLINC, 0o644),  # npm drops the x bit
                                 ("package/lib/kotlin-compiler.jar", "jar", 0o644)):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tf.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def downloads(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "downloads")
    monkeypatch.setenv("COMPACTRL_DOWNLOADS", path)
    packs = tmp_path / "npm"
    packs.mkdir()
    made = _npm_package(packs)

    def fake_pack(spec: str, dest: str, timeout_s: float) -> str:
        assert spec == "kotlin-compiler@1.9.22"
        return shutil.copy(made, dest)

    monkeypatch.setattr(td, "_npm_pack", fake_pack)
    return path


def test_the_table_and_what_a_curl_or_wget_saves() -> None:
    assert td.release_for(URL)[1] == "1.9.22"
    assert td.release_for(URL.replace("kotlin-compiler-1.9.22", "kotlin-native-1.9.22")) is None
    assert td.download_target(["curl", "-fsSL", URL, "-o", "/tmp/kotlinc.zip"], "/app") == (URL, "/tmp/kotlinc.zip")
    assert td.download_target(["curl", "-H", "A: b", "-LO", URL], "/app") == (URL, "/app/kotlin-compiler-1.9.22.zip")
    assert td.download_target(["curl", "-fsSLo", "/tmp/k.zip", URL], "/app") == (URL, "/tmp/k.zip")
    assert td.download_target(["curl", "-L", "-O", URL], "/app") == (URL, "/app/kotlin-compiler-1.9.22.zip")
    assert td.download_target(["wget", "-q", URL, "-O", "k.zip"], "/src") == (URL, "/src/k.zip")
    assert td.download_target(["wget", "-P", "/opt", URL], "/") == (URL, "/opt/kotlin-compiler-1.9.22.zip")
    assert td.download_target(["curl", "-fsSL", URL], "/") is None  # to stdout (piped somewhere)
    assert td.download_target(["curl", URL, URL, "-o", "x"], "/") is None
    # the plan copies the cached file where the step saves it, ${KOTLIN_VERSION} expanded as the engine does
    steps = [{"op": "env", "vars": {"KOTLIN_VERSION": "1.9.22"}},
             {"op": "run", "command": "curl -fsSL https://github.com/JetBrains/kotlin/releases/download/v${KOTLIN_VERSION}"
                                      "/kotlin-compiler-${KOTLIN_VERSION}.zip -o /tmp/kotlinc.zip && unzip -q "
                                      "/tmp/kotlinc.zip -d /opt", "workdir": "/"}]
    plan, why = tlb.plan(steps, {}, "", "/app", "k")
    assert why is None and plan.downloads == [URL]
    assert plan.steps[0]["command"] == f" cp {tlb.DOWNLOADS_MARK}/kotlin-compiler-1.9.22.zip /tmp/kotlinc.zip && unzip -q /tmp/kotlinc.zip -d /opt"
    # any other download is still the image's
    other = [{"op": "run", "command": "curl -fsSL https://example.org/x.zip -o /tmp/x.zip", "workdir": "/"}]
    assert tlb.plan(other, {}, "", "/app", "k")[1].startswith("needs its image: RUN curl")


def test_the_kotlin_zip_is_rebuilt_with_the_release_layout_and_recorded(downloads) -> None:
    assert td.cached(URL) is None
    path = td.fetch(URL)
    assert path == os.path.join(downloads, "kotlin-compiler-1.9.22.zip") and td.cached(URL) == path
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        assert "kotlinc/bin/kotlinc" in names and "kotlinc/lib/kotlin-compiler.jar" in names
        assert not any(n.endswith("package.json") or not n.startswith("kotlinc/") for n in names)
        assert (zf.getinfo("kotlinc/bin/kotlinc").external_attr >> 16) & 0o111  # the launcher is executable
    with open(path + ".json") as fh:
        record = json.load(fh)
    assert record["url"] == URL and record["source"] == "npm:kotlin-compiler@1.9.22" and len(record["sha256"]) == 64


def test_a_package_of_another_version_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COMPACTRL_DOWNLOADS", str(tmp_path / "d"))
    wrong = _npm_package(tmp_path, build="1.9.21-release-1")
    monkeypatch.setattr(td, "_npm_pack", lambda spec, dest, timeout_s: shutil.copy(wrong, dest))
    with pytest.raises(td.DownloadError, match="build.txt says '1.9.21-release-1', expected 1.9.22"):
        td.fetch(URL)
    assert td.cached(URL) is None
    with pytest.raises(td.DownloadError, match="no reachable source"):
        td.fetch("https://example.org/x.zip")


def test_offline_uvx_runs_pytest_from_the_prepared_requirements() -> None:
    script = ("uvx --python 3.12 --with pytest==8.3.3 \\\n    pytest /tests/test_outputs.py -rA \\\n"
              "    > /logs/verifier/test-stdout.txt 2>&1\n"
              "uvx \\\n  -p 3.13 \\\n  -w pytest==8.4.1 \\\n  -w pytest-json-ctrf==0.3.5 \\\n  pytest --ctrf /x.json /tests\n"
              "if command -v uvx >/dev/null 2>&1; then uvx ruff check .; fi\nuvx\npytest -q\n")
    assert offline_uvx(script) == (
        "python3 -m pytest /tests/test_outputs.py -rA \\\n    > /logs/verifier/test-stdout.txt 2>&1\n"
        "python3 -m pytest --ctrf /x.json /tests\n"
        "if command -v uvx >/dev/null 2>&1; then uvx ruff check .; fi\nuvx\npytest -q\n")


TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
cd /app
kotlinc Main.kt -include-runtime -d /app/sim.jar > /logs/verifier/build.log 2>&1 || { echo 0 > /logs/verifier/reward.txt; exit 0; }
uvx --python 3.12 --with pytest \\
    pytest /tests/test_outputs.py -rA > /logs/verifier/test-stdout.txt 2>&1
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def _kotlin_task(root) -> str:
    folder = root / "kotlin-task"
    for sub in ("environment", "solution", "tests"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 120.0\n')
    (folder / "instruction.md").write_text("Write /app/Main.kt printing 42.\n")
    (folder / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim\nENV KOTLIN_VERSION=1.9.22\n"
        "RUN curl -fsSL https://github.com/JetBrains/kotlin/releases/download/v${KOTLIN_VERSION}/kotlin-compiler-"
        "${KOTLIN_VERSION}.zip -o /tmp/kotlinc.zip \\\n    && unzip -q /tmp/kotlinc.zip -d /opt && rm /tmp/kotlinc.zip\n"
        'ENV PATH="/opt/kotlinc/bin:${PATH}"\nWORKDIR /app\n')
    (folder / "solution" / "solve.sh").write_text("cat > /app/Main.kt <<'K'\nfun main() { println(\"42\") }\nK\n")
    (folder / "tests" / "test.sh").write_text(TEST_SH)
    (folder / "tests" / "test_outputs.py").write_text(
        "from pathlib import Path\n\ndef test_built():\n    assert 'println(\"42\")' in Path('/app/sim.jar').read_text()\n")
    return str(folder)


def test_a_task_whose_verifier_builds_with_a_downloaded_compiler(tmp_path, cache, downloads) -> None:
    if local_unavailable():
        pytest.skip(local_unavailable())
    if shutil.which("unzip") is None:
        pytest.skip("unzip is not installed")
    folder = _kotlin_task(tmp_path)
    # without the file in the cache an episode cannot prepare it (nothing downloads during one)
    bare = load_task_dir(folder, TerminalBenchConfig(backend="local"))
    assert bare.build.plan["downloads"] == [URL] and bare.grading.mode == "script"
    with pytest.raises(tlb.PrepareError, match="needs preparing: https://github.com/JetBrains"):
        tlb.prepare(bare, allow_download=False)
    task = load_task_dir(folder, TerminalBenchConfig(backend="local", prepare=True))
    assert not task.grading.not_gradable and task.check.kind == "harbor"
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert gold["info"]["test_log_tail"].endswith("[verdict: success: reward.txt: reward=1]")
    assert not noop["success"] and noop["sandbox_error"] is None
    assert noop["info"]["test_log_tail"].endswith("[verdict: failure: reward.txt: reward=0]")
    # the state does not keep the archive; the cache does
    assert not os.path.exists(os.path.join(task.runtime.state, "downloads"))
