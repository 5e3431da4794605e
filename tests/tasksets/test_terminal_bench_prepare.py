"""Terminal-Bench tasks made gradable at prepare time: system packages installed on the host (the
decision only: nothing is installed here), the Go a task needs, known installers mapped to PyPI
wheels, and a root layer for Dockerfile steps that change system files (real local sandbox)."""

from __future__ import annotations

import os
import shutil

import pytest
from loader_helpers import FIXTURES, local_unavailable, write_tb_task

from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.task import Build
from compactrl.tasksets import system_packages as syspkg
from compactrl.tasksets.terminal_bench import folders as tb
from compactrl.tasksets.terminal_bench import local_build as tlb
from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig, load_task_dir

LOCAL = os.path.join(FIXTURES, "terminal_bench_local")


# ---------------------------------------------------------------------------- system packages
def test_apt_decision_per_package_without_installing() -> None:
    installed = {"make", "python3"}
    candidates = {"gfortran": "4:12.2.0-3", "gnucobol3": "3.1.2-5"}
    decision = syspkg.apt_decision(["make", "gfortran", "gnucobol3", "compactrl-absent-tool"],
                                has=lambda p: p in installed, candidate=candidates.get)
    assert decision == {"make": "installed", "gfortran": "installable", "gnucobol3": "installable",
                        "compactrl-absent-tool": "unavailable"}


def test_a_solution_continued_over_lines_is_read_as_the_shell_reads_it(monkeypatch) -> None:
    monkeypatch.setattr(tlb, "host_has_package", lambda name: name != "libopenmpi-dev")
    solution = "apt-get update && apt-get install -y \\\n    gcc \\\n    libopenmpi-dev\nmpicc -o sim sim.c\n"
    assert tlb.apt_packages([], [solution]) == ["gcc", "libopenmpi-dev"]
    assert tlb.solution_network(solution).startswith("apt-get install libopenmpi-dev, which this machine lacks")
    assert tlb.solution_requirements("pip install \\\n  numpy==2.1.3 \\\n  scipy\n") == ["numpy==2.1.3", "scipy"]


def test_apt_packages_of_the_steps_and_the_solution_less_session_tools() -> None:
    steps = [{"op": "run", "command": "apt-get update && apt-get install -y --no-install-recommends gfortran make "
                                      "tmux && rm -rf /var/lib/apt/lists/*"},
             {"op": "env", "vars": {"X": "1"}},
             {"op": "run", "command": "apt install -y dos2unix=7.4.3-1 # pinned"}]
    solution = "#!/bin/bash\napt-get update && apt-get install -y nginx\nnginx -t\n"
    assert tlb.apt_packages(steps, [solution]) == ["gfortran", "make", "dos2unix", "nginx"]


def test_a_missing_package_is_recorded_for_install_and_named_with_the_flag(cache) -> None:
    task = load_task_dir(os.path.join(LOCAL, "needs-image"), TerminalBenchConfig(backend="local"))
    assert task.build.system_packages == ("compactrl-absent-tool",)
    assert task.grading.not_gradable.endswith(
        "(apt packages not installed on this machine: compactrl-absent-tool; `compactrl tasks validate "
        "--install-system-packages` installs them here)")


def test_install_for_tasks_installs_only_what_apt_has(monkeypatch) -> None:
    class T:
        def __init__(self, pkgs):
            self.build = Build(builder="x", system_packages=tuple(pkgs))

    calls, lines = [], []
    monkeypatch.setattr(syspkg, "apt_decision", lambda pkgs: {p: "unavailable" if p == "nope" else "installable"
                                                           for p in pkgs})
    monkeypatch.setattr(syspkg, "install_system_packages", lambda pkgs, record, echo: calls.append(pkgs) or pkgs)
    assert syspkg.install_for_tasks([T(["gfortran", "nope"]), T(["gfortran", "dos2unix"]), T([])], lines.append) == [
        "gfortran", "dos2unix"]
    assert calls == [["gfortran", "dos2unix"]]
    assert lines[0] == "system packages apt has no candidate for (those tasks stay not gradable): nope"


def test_packages_are_named_only_when_nothing_else_stops_the_task(monkeypatch) -> None:
    monkeypatch.setattr(tlb, "host_has_package", lambda name: name != "qemu-utils")
    apt = {"op": "run", "command": "apt-get update && apt-get install -y qemu-utils", "workdir": "/"}
    fetch = {"op": "run", "command": "wget -q https://example.org/alpine.iso -O /app/alpine.iso", "workdir": "/"}
    # a later step that needs the network is the reason: installing qemu-utils would not make it gradable
    assert tlb.plan([apt, fetch], {}, "", "/app", "k")[1].startswith("needs its image: RUN wget")
    alone = tlb.plan([apt, {"op": "run", "command": "echo ok > /app/x", "workdir": "/"}], {}, "", "/app", "k")[1]
    assert alone.startswith("needs its image: RUN apt-get update") and syspkg.INSTALL_HINT in alone

    class T:
        def __init__(self, pkgs, error=None):
            self.build = Build(builder="x", error=error, system_packages=tuple(pkgs))

    monkeypatch.setattr(syspkg, "apt_decision", lambda pkgs: dict.fromkeys(pkgs, "installable"))
    monkeypatch.setattr(syspkg, "install_system_packages", lambda pkgs, record, echo: pkgs)
    tasks = [T(["clang"], "needs its image: RUN git clone https://github.com/o/n (...)"), T(["qemu-utils"], alone)]
    assert syspkg.install_for_tasks(tasks, lambda line: None) == ["qemu-utils"]


def test_installing_needs_root(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="needs root"):
        syspkg.install_system_packages(["gfortran"], None, print)


def test_a_go_task_newer_than_this_machines_go_is_flagged(tmp_path, monkeypatch) -> None:
    assert tlb.go_requirement(["module x\n\ngo 1.22\n", "go 1.21.3\n", None]) == (1, 22)
    monkeypatch.setattr(tb, "host_go_version", lambda: (1, 19))
    monkeypatch.setenv("COMPACTRL_TOOLCHAINS", str(tmp_path / "toolchains"))  # none cached (tb_toolchains)
    folder = tmp_path / "go-task"
    (folder / "tests").mkdir(parents=True)
    (folder / "task.yaml").write_text("instruction: build it\nparser_name: pytest\n")
    (folder / "tests" / "test_outputs.py").write_text("def test_x():\n    assert False\n")
    (folder / "solution.sh").write_text("cat > go.mod <<'EOF'\nmodule x\n\ngo 1.22\nEOF\ngo build ./...\n")
    (folder / "Dockerfile").write_text("FROM ubuntu:24.04\nRUN apt-get update && apt-get install -y golang-go\n"
                                       "WORKDIR /app\n")
    task = load_task_dir(str(folder), TerminalBenchConfig(backend="local"))
    assert task.grading.not_gradable.startswith("needs Go 1.22 (its image's Go or the go line of a go.mod it "
                                                    "writes), newer than this machine's Go 1.19")
    (folder / "solution.sh").write_text("cat > go.mod <<'EOF'\nmodule x\n\ngo 1.18\nEOF\ngo build ./...\n")
    (folder / "Dockerfile").write_text("FROM golang:1.26-bookworm\nWORKDIR /app\n")  # the image's own Go
    task = load_task_dir(str(folder), TerminalBenchConfig(backend="local"))
    assert task.grading.not_gradable.startswith("needs Go 1.26")


# --------------------------------------------------------------------------------- installers
def test_the_uv_installer_maps_to_the_uv_wheel_where_the_installer_puts_it() -> None:
    command, wheels, notes = tlb.map_installers("curl -LsSf https://astral.sh/uv/0.5.11/install.sh | sh && uv --version")
    assert wheels == ["uv==0.5.11"] and "astral.sh" not in command and command.endswith("&& uv --version")
    assert f"cp {tlb.TOOLS_MARK}/uv-0.5.11/bin/uv {tlb.TOOLS_MARK}/uv-0.5.11/bin/uvx" in command
    assert '${XDG_BIN_HOME:-$HOME/.local/bin}' in command and "uv==0.5.11 from PyPI" in notes[0]
    # before 0.5 the installer put uv in Cargo's bin folder; no version: the newest
    old, wheels, _ = tlb.map_installers("wget -qO- https://astral.sh/uv/0.4.30/install.sh | sh")
    assert wheels == ["uv==0.4.30"] and "${CARGO_HOME:-$HOME/.cargo}/bin" in old
    assert tlb.map_installers("curl -LsSf https://astral.sh/uv/install.sh | env UV_UNMANAGED_INSTALL=/x sh")[1] == ["uv"]
    # anything else fetched from the network is left to the classifier (needs its image)
    assert tlb.map_installers("curl -fsSL https://example.com/x.sh | sh")[1] == []
    steps = [{"op": "run", "command": "curl -LsSf https://astral.sh/uv/0.5.11/install.sh | sh", "workdir": "/"},
             {"op": "run", "command": "cp /root/.local/bin/uv /root/.local/bin/uvx /usr/local/bin/", "workdir": "/"}]
    plan, why = tlb.plan(steps, {}, "", "/app", "k")
    assert why is None and plan.tools == ["uv==0.5.11"] and plan.root_layer  # the copy to /usr/local/bin


def test_what_a_script_installs_with_pip_uv_pip_uv_add_and_uvx() -> None:
    # the official 1.x tests' pattern: setup-uv-pytest.sh runs `uv add pytest==8.4.1`, run-tests.sh adds its own
    script = ("source $TEST_DIR/setup-uv-pytest.sh\nuv add rdkit==2025.3.3\n"
              "uv add --dev --group test hypothesis -r extra.txt ./local-pkg https://x.org/p.whl\n"
              "uv pip install pillow==11.2.1 numpy==2.3.1\npip install six\nuvx --with scipy pytest -q\n"
              "uv run pytest tests/\n")
    assert tlb.solution_requirements(script) == ["rdkit==2025.3.3", "hypothesis", "pillow==11.2.1", "numpy==2.3.1",
                                                 "six", "scipy"]
    assert tlb.uv_add_requirements(["uv", "--quiet", "add", "flask>=3", "--optional", "web", "gunicorn"]) == [
        "flask>=3", "gunicorn"]
    assert tlb.uv_add_requirements(["uv", "sync"]) == [] and tlb.uv_add_requirements(["pip", "add", "x"]) == []


def test_a_solution_that_changes_system_files_is_seen() -> None:
    assert tlb.solution_system_writes("apt-get install -y nginx\ncat > /etc/nginx/conf.d/site.conf << 'EOF'\n") == \
        "/etc/nginx/conf.d/site.conf"
    assert tlb.solution_system_writes("sed -i 's/a/b/' /etc/nginx/nginx.conf") == "/etc/nginx/nginx.conf"
    assert tlb.solution_system_writes("cp tool /usr/local/bin/") == "/usr/local/bin/"
    assert tlb.solution_system_writes("cat /etc/os-release > /app/os.txt\npython3 /usr/lib/x.py 2>/dev/null") is None


# ------------------------------------------------------------------------- root layer (real)
@pytest.mark.timeout(600)
@pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))
@pytest.mark.skipif(os.geteuid() != 0, reason="a root layer needs root (overlay mounts over /usr and /etc)")
def test_a_dockerfile_that_writes_system_files_replays_into_a_root_layer(cache) -> None:
    folder = os.path.join(LOCAL, "system-files")
    task = load_task_dir(folder, TerminalBenchConfig(backend="local", prepare=True, local_cache=cache))
    assert not task.grading.not_gradable, task.grading.not_gradable
    assert task.build.plan["root_layer"] is True
    layer = os.path.join(task.runtime.state, "layer")
    with open(os.path.join(layer, "etc", "compactrl-service.ini")) as fh:
        assert fh.read() == "port=7071\n"
    assert os.access(os.path.join(layer, "usr", "local", "bin", "compactrl-greet"), os.X_OK)  # COPY kept its mode
    gold = run_task(task, GoldPolicy(), "local")
    noop = run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    # noop: the image's config is there (not removed) and nothing greeted
    assert not noop["success"] and "FAILED ../tests/test_outputs.py::test_config_removed" in noop["info"]["test_output"]
    # the gold episode's removal stayed in that episode; the layer and the host are untouched
    assert os.path.isfile(os.path.join(layer, "etc", "compactrl-service.ini"))
    assert not os.path.exists("/etc/compactrl-service.ini") and not os.path.exists("/usr/local/bin/compactrl-greet")


def test_tests_that_move_the_tests_folder_are_flagged(tmp_path) -> None:
    folder = tmp_path / "hides-tests"
    write_tb_task(folder, instruction="build it", dockerfile="FROM python:3.11-slim\nWORKDIR /app\n",
                  solution="echo ok > /app/out.txt\n",
                  tests="import shutil\n\ndef test_x():\n    shutil.move('/tests', '/tmp/hidden')\n")
    # with the image's work dir known they run from a plain folder there (test_tb_prepare_sources.py runs one)
    task = load_task_dir(str(folder), TerminalBenchConfig(backend="local"))
    assert task.origin["tests_moved"] == "tests/test_outputs.py" and not task.grading.not_gradable
    task = load_task_dir(str(folder), TerminalBenchConfig(backend="local", use_dockerfile_workdir=False))
    assert task.grading.not_gradable == ("needs its image: its tests move /tests away (tests/test_outputs.py), a "
                                             "mount point in the local sandbox (a plain folder in the image)")
    (folder / "tests" / "test_outputs.py").write_text("def test_x():\n    assert open('/tests/data.txt')\n")
    assert not load_task_dir(str(folder), TerminalBenchConfig(backend="local")).grading.not_gradable


def test_go_mod_tidy_of_standard_library_code_needs_no_network() -> None:
    std = "cat > go.mod <<'EOF'\nmodule s\n\ngo 1.22\nEOF\ncat > main.go <<'EOF'\nimport (\n\t\"fmt\"\n\t\"net/http\"\n)\nEOF\n"
    assert tlb.solution_network(std + "go mod tidy\ngo build .\n") is None
    assert tlb.solution_network(std.replace('"net/http"', '"github.com/gorilla/mux"') + "go mod tidy\n") == "go mod"
    assert tlb.solution_network("go mod init x\ngo build .\n") is None


def test_a_dockerfile_go_mod_tidy_of_standard_library_code_runs_here(tmp_path) -> None:
    # the image's Go code comes from RUN heredocs and from the build context
    steps = [{"op": "run", "command": "printf 'module m\\n\\ngo 1.22\\n' > /app/go.mod", "workdir": "/app"},
             {"op": "run", "command": "cat > /app/main.go << 'GO'\npackage main\nimport (\n    \"fmt\"\n    \"os\"\n)\n"
                                      "func main() { fmt.Println(os.Args) }\nGO", "workdir": "/app"},
             {"op": "run", "command": "go mod tidy && go build ./... || true", "workdir": "/app"}]
    plan, why = tlb.plan(steps, {}, str(tmp_path), "/app", "k")
    assert why is None and any(n.startswith("go mod tidy: the image's Go code imports the standard library only")
                               for n in plan.mapped)
    assert plan.steps[-1]["command"].startswith("go mod tidy")
    (tmp_path / "dep.go").write_text('package main\nimport "github.com/gorilla/mux"\n')
    plan, why = tlb.plan(steps, {}, str(tmp_path), "/app", "k")
    assert plan is None and why.startswith("needs its image: RUN go mod tidy") and why.endswith("(go mod)")


def test_a_release_published_as_source_only_is_built_from_it(monkeypatch) -> None:
    # pip, as it answers --only-binary=:all: for construct 2.10.68 (no wheel of that release on PyPI)
    calls = []

    class Done:
        def __init__(self, rc, err=""):
            self.returncode, self.stdout, self.stderr = rc, "", err

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        if "--no-binary=construct" in cmd:
            return Done(0)
        return Done(1, "ERROR: Could not find a version that satisfies the requirement construct==2.10.68 (from "
                       "versions: 2.8.10, 2.10.69)\nERROR: No matching distribution found for construct==2.10.68")

    monkeypatch.setattr(tlb.subprocess, "run", fake_run)
    kinds = {("construct", "2.10.68"): {"sdist"}, ("numpy", "1.21.0"): {"sdist", "wheel"}}
    monkeypatch.setattr(tlb, "pypi_file_kinds", lambda name, version: kinds.get((name, version), set()))
    assert tlb._pip_wheels("download", ["-d", "/x", "flask==3.1.1", "construct==2.10.68"], 60, 2) is None
    assert len(calls) == 2 and "--only-binary=:all:" in calls[1] and "--no-binary=construct" in calls[1]
    # pinned by a dependency's metadata (solana 0.36.7 requires construct==2.10.68): pip's message names the pin
    calls.clear()
    assert tlb._pip_wheels("download", ["-d", "/x", "solana==0.36.7"], 60, 2) is None and len(calls) == 2
    # a release that has wheels, none for this Python, is not compiled here
    calls.clear()
    monkeypatch.setattr(tlb.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or Done(
        1, "ERROR: No matching distribution found for numpy==1.21.0"))
    assert tlb._pip_wheels("install", ["--target", "/x", "numpy==1.21.0"], 60, 1).startswith("pip failed here:")
    assert len(calls) == 1
    assert not tlb._sdist_only("construct", ["construct>=2.10"])  # not pinned: not looked up


def test_a_pip_install_from_another_index_is_named() -> None:
    steps = [{"op": "run", "command": "pip install torch==2.6.0+cpu --index-url https://download.pytorch.org/whl/cpu",
              "workdir": "/"}]
    why = tlb.plan(steps, {}, "", "/app", "k")[1]
    assert why.endswith("(pip install from the package index https://download.pytorch.org/whl/cpu (not PyPI, which "
                        "prepare installs from))")


def test_redirections_are_neither_separators_nor_arguments() -> None:
    assert tlb.split_segments("pip3 install -q pytest==8.4.1 2>&1 | tail -20 || true") == [
        ("pip3 install -q pytest==8.4.1 2>&1 ", "|"), (" tail -20 ", "||"), (" true", "")]
    assert [sep for _, sep in tlb.split_segments("a &> log & b >&2; c >| f && d |& e")] == ["&", ";", "&&", "|&", ""]
    assert tlb.solution_requirements("pip install 'numpy>=1.2' > /dev/null 2> err.txt scipy 2>&1\n") == [
        "numpy>=1.2", "scipy"]


HARBOR_TEMPLATE = """#!/bin/bash
apt-get update
apt-get install -y curl
curl -LsSf https://astral.sh/uv/0.9.7/install.sh | sh
source $HOME/.local/bin/env
go build -o /app/server . && (/app/server &)
until curl -s http://localhost:8080/health; do sleep 0.2; done
uvx \\
  --with pytest==8.4.1 \\
  pytest /tests/test_outputs.py -rA
if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""


def test_a_verifier_that_installs_what_prepare_installed_runs_as_published(monkeypatch) -> None:
    # Harbor's template (apt-get curl, astral.sh's uv, uvx pytest) around work of the verifier's own: the
    # installs are no-ops offline, so its own work (a build, a server) is not skipped by a pytest fallback
    from compactrl.tasksets.terminal_bench.folders import offline_uvx

    monkeypatch.setattr(tlb, "host_has_package", lambda name: name == "curl")
    script = offline_uvx(tlb.offline_installs(HARBOR_TEMPLATE))
    assert "apt-get" not in script and "astral.sh" not in script and ".local/bin/env" not in script
    assert "go build -o /app/server . && (/app/server &)" in script and "until curl -s http://localhost:8080" in script
    assert "python3 -m pytest /tests/test_outputs.py -rA" in script
    # a package this machine lacks, and a here-document's body, stay as written
    kept = tlb.offline_installs("apt-get install -y gfortran\\ncat > req.txt <<EOF\\npip install x\\nEOF\\n")
    assert kept == "apt-get install -y gfortran\\ncat > req.txt <<EOF\\npip install x\\nEOF\\n"


def test_a_solution_that_downloads_from_a_hub_or_a_bucket_needs_the_network() -> None:
    hub = ('cat > run.py << EOF\nfrom transformers import AutoTokenizer\nMODEL = "Qwen/Qwen2.5-1.5B-Instruct"\n'
           'tok = AutoTokenizer.from_pretrained(MODEL)\nEOF\npython run.py\n')
    assert tlb.solution_network(hub) == "from_pretrained('Qwen/Qwen2.5-1.5B-Instruct') (the Hugging Face hub)"
    assert tlb.solution_network("python -c \"from datasets import load_dataset; load_dataset('org/set')\"") == (
        "load_dataset('org/set') (the Hugging Face hub)")
    assert tlb.solution_network("aws s3 cp s3://bucket/data.parquet . --no-sign-request\n") == (
        "aws s3 cp s3://bucket/data.parquet")
    # a model saved in the work dir, or a local data file, is no download
    assert tlb.solution_network('m.save_pretrained("/app/model")\nAutoModel.from_pretrained("/app/model")\n'
                                "load_dataset('csv', data_files='x.csv')\n") is None
    assert tlb.solution_network('AutoModel.from_pretrained("./model")\n') is None


def test_tests_that_rename_a_file_into_tmp_need_the_image(tmp_path) -> None:
    # rename(2) fails across file systems; the local sandbox's /tmp is one of its own
    folder = tmp_path / "renames"
    write_tb_task(folder, instruction="Write mystery.c.", dockerfile="FROM python:3.12-slim\nWORKDIR /app\n",
                  solution="echo 'int main(){return 0;}' > mystery.c\n",
                  tests="import os\n\ndef test_x():\n    os.rename('mystery', '/tmp/mystery')\n")
    task = load_task_dir(str(folder), TerminalBenchConfig(backend="local"))
    assert task.grading.not_gradable.startswith("needs its image: its tests rename a file into /tmp "
                                                    "(tests/test_outputs.py)")
    assert not load_task_dir(str(folder), TerminalBenchConfig(backend="docker")).grading.not_gradable
    (folder / "tests" / "test_outputs.py").write_text("import shutil\n\ndef test_x():\n    shutil.move('a', '/tmp/a')\n")
    assert not load_task_dir(str(folder), TerminalBenchConfig(backend="local")).grading.not_gradable


# ------------------------------------------------------------- a solution acting as the image's root
def test_what_a_root_solution_writes_is_owned_where_the_image_lets_root_write() -> None:
    script = ("apt-get install -y nginx\ncat > /etc/nginx/conf.d/site.conf << 'EOF'\nEOF\n"
              "rm -f /etc/nginx/sites-enabled/default\ncp tool /usr/local/bin/tool\necho 1 > /etc/hostname\n")
    assert tlb.system_writes(script) == ["/etc/nginx/conf.d/site.conf", "/etc/nginx/sites-enabled/default",
                                         "/usr/local/bin/tool", "/etc/hostname"]
    owned = tlb.owned_system_paths(["/etc/skel/.compactrl/x.conf", "/usr/local/bin/tool", "/etc/hostname"],
                                   exists=lambda p: p == "/etc/hostname")
    # a configuration folder whole; elsewhere the receiving folder only (and the file where it exists)
    assert owned == [("/etc/skel", True), ("/usr/local/bin", False), ("/etc", False), ("/etc/hostname", False)]


def test_a_solution_that_manages_users_is_recognised() -> None:
    assert tlb.solution_users("adduser --disabled-password git\necho 'git:pw' | chpasswd\n") == \
        "adduser --disabled-password git"
    assert tlb.solution_users("mkdir -p /git && chown -R git:git /git\n") == "chown -R git:git"
    assert tlb.solution_users("su - git -c 'git init --bare /git/server'") == "su - git"
    assert tlb.solution_users("chown -R root:root /app\nchown $(whoami) out.txt\nchmod 600 key\n") is None


@pytest.mark.skipif(not shutil.which("dpkg-query"), reason="dpkg-query lists what a package owns")
def test_the_folders_a_package_owns_under_var_are_found() -> None:
    assert "/var/lib/dpkg" in syspkg.package_dirs(["dpkg"])
    assert syspkg.package_dirs(["compactrl-absent-tool"]) == []


@pytest.mark.timeout(600)
@pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))
@pytest.mark.skipif(os.geteuid() != 0, reason="a root layer needs root (overlay mounts over /usr and /etc)")
@pytest.mark.skipif(not os.path.isdir("/etc/skel"), reason="the host's /etc/skel is the folder the solution edits")
def test_a_solution_that_configures_the_system_as_root_runs_in_a_root_layer(tmp_path, cache) -> None:
    host_bashrc = open("/etc/skel/.bashrc").read() if os.path.exists("/etc/skel/.bashrc") else None
    folder = write_tb_task(
        tmp_path / "root-config", instruction="Greet new users and publish a page.",
        dockerfile="FROM ghcr.io/laude-institute/t-bench/python-3-13:20250620\nWORKDIR /app\n",
        solution=("echo 'export GREETING=hi' >> /etc/skel/.bashrc\nrm -f /etc/skel/.compactrl-absent\n"
                  "mkdir -p /var/www/site && echo ok > /var/www/site/index.html\necho 1 > /run/site.pid\n"),
        tests=("def test_greeting():\n    assert 'GREETING=hi' in open('/etc/skel/.bashrc').read()\n\n"
               "def test_page():\n    assert open('/var/www/site/index.html').read() == 'ok\\n'\n"))
    task = load_task_dir(folder, TerminalBenchConfig(backend="local", prepare=True, local_cache=cache))
    assert not task.grading.not_gradable, task.grading.not_gradable
    build = task.build.plan
    assert build["root_layer"] is True and build["owned"] == [["/etc/skel", True]]
    assert {"/run", "/var/www"} <= set(task.runtime.writable_paths)
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert not noop["success"] and noop["sandbox_error"] is None
    # the episode wrote into its own upper layer: the host's file is as it was
    assert (open("/etc/skel/.bashrc").read() if os.path.exists("/etc/skel/.bashrc") else None) == host_bashrc


@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))
def test_a_folder_the_steps_remove_whole_is_not_in_the_episode(tmp_path, cache) -> None:
    # `RUN kotlinc /build/V.kt -d /app/v.jar && rm -rf /build` (android-license-keygen): /build is a mount
    # point while the steps run, so it is emptied, and the episode has no /build, as the image has none
    folder = write_tb_task(
        tmp_path / "removes-build", instruction="Copy /app/a.txt to /app/b.txt.",
        dockerfile=("FROM python:3.12-slim\nWORKDIR /build\nRUN echo hi > /build/a.txt && mkdir -p /app "
                    "&& cp /build/a.txt /app/a.txt && rm -rf /build\nWORKDIR /app\n"),
        solution="cp a.txt b.txt\n",
        tests=("import os\n\ndef test_b():\n    assert open('/app/b.txt').read() == 'hi\\n'\n\n"
               "def test_no_build():\n    assert not os.path.exists('/build')\n"))
    task = load_task_dir(folder, TerminalBenchConfig(backend="local", prepare=True, local_cache=cache))
    assert not task.grading.not_gradable, task.grading.not_gradable
    assert task.build.plan["gone"] == ["/build"]
    assert "/build" not in task.runtime.writable_paths
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert not noop["success"] and noop["sandbox_error"] is None


def test_a_test_script_install_prepare_cannot_do_is_flagged(tmp_path) -> None:
    # pytorch-model-cli: `pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu` in its
    # run-tests.sh; installed from nowhere, its tests ran against whatever this machine's Python had
    script = ("pip install torch==2.7.1 torchvision==0.22.1 --index-url https://download.pytorch.org/whl/cpu\n"
              "pip install numpy==2.3.1 pytest==8.4.1\npytest $TEST_DIR/test_outputs.py -rA\n")
    assert tlb.unpreparable_install(script) == ("pip install from the package index https://download.pytorch.org/"
                                                "whl/cpu (not PyPI, which prepare installs from)")
    assert tlb.unpreparable_install("pip install numpy==2.3.1 pytest==8.4.1\n# pip install -e .\n") is None
    folder = tmp_path / "torch-index"
    write_tb_task(folder, instruction="x", dockerfile="FROM python:3.12-slim\nWORKDIR /app\n",
                  solution="echo ok > out.txt\n", tests="def test_x():\n    pass\n", **{"run-tests.sh": script})
    task = load_task_dir(str(folder), TerminalBenchConfig(backend="local"))
    assert task.grading.not_gradable == (
        "needs network: the test script runs pip install from the package index https://download.pytorch.org/whl/cpu "
        "(not PyPI, which prepare installs from); prepare installs what test scripts install from PyPI only")


def test_tests_that_fetch_from_the_network_are_flagged(tmp_path) -> None:
    # broken-networking: its test runs `curl example.com`; the harness's container has the network
    folder = tmp_path / "fetches"
    write_tb_task(folder, instruction="fix curl", dockerfile="FROM python:3.12-slim\nWORKDIR /app\n",
                  solution="echo ok\n",
                  tests=("import os\n\ndef test_curl():\n    os.popen('curl example.com > /app/example.html').read()\n"
                         "    assert open('/app/example.html').read()\n"))
    task = load_task_dir(str(folder), TerminalBenchConfig(backend="local"))
    assert task.grading.not_gradable == ("needs network: its tests fetch from the network at test time "
                                             "(tests/test_outputs.py fetches example.com; the local sandbox has none)")
    assert not load_task_dir(str(folder), TerminalBenchConfig(backend="docker")).grading.not_gradable
    # this machine's own servers are not the network
    (folder / "tests" / "test_outputs.py").write_text(
        "import requests\n\ndef test_up():\n    requests.get('http://localhost:8080/health')\n"
        "    os.popen('curl -s http://127.0.0.1:5000/x')\n")
    assert not load_task_dir(str(folder), TerminalBenchConfig(backend="local")).grading.not_gradable


def test_hub_downloads_by_command_line_tools_are_seen() -> None:
    # eval-mteb: `mteb run -m BAAI/bge-small-en-v1.5 -t STS12` fetches the model (and the task's data) from the hub
    assert tlb.solution_network("ls\nmteb run -m BAAI/bge-small-en-v1.5 -t STS12\n") == (
        "mteb run -m BAAI/bge-small-en-v1.5 (the Hugging Face hub)")
    assert tlb.solution_network("huggingface-cli download Qwen/Qwen2.5-0.5B --local-dir m\n").startswith(
        "huggingface-cli download")
    assert tlb.solution_network("python -c \"SentenceTransformer('all-MiniLM-L6-v2')\"\n") == (
        "SentenceTransformer('all-MiniLM-L6-v2') (the Hugging Face hub)")
    assert tlb.solution_network("# mteb run -m org/x\nmteb --help\npython -c \"SentenceTransformer('/app/m')\"\n") is None


def test_a_solution_that_starts_an_ssh_server_is_recognised() -> None:
    assert tlb.solution_ssh_server("mkdir -p /run/sshd\n/usr/sbin/sshd\n") == "/usr/sbin/sshd"
    assert tlb.solution_ssh_server("service ssh start || echo failed\n") == "service ssh start"
    assert tlb.solution_ssh_server("systemctl restart sshd.service\n") == "systemctl restart sshd.service"
    assert tlb.solution_ssh_server("ssh git@localhost true\nservice nginx start\n") is None
