"""A prepared SWE-bench row is graded on the work tree the harness sees, with the harness's own test
command: a fixture repository (built here with git) whose runner is an executable script the row runs
directly (``bin/runtests``, mode 100755, found through ``#!/usr/bin/env python`` in the row's
environment), a symlink and a binary file, a ``pre_install`` step that edits a tracked file (without
the edit the runner prints no per-test lines and gold cannot pass) and an install step that builds a
file in place. Real venvs, a real git work tree, the real local sandbox; nothing downloads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from loader_helpers import local_unavailable

from compactrl.cli import main
from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.sandbox.local import LocalSandbox
from compactrl.tasksets.swebench import prepare as sp
from compactrl.tasksets.swebench.rows import SWEBenchConfig, load_swebench

pytestmark = [pytest.mark.timeout(300)]

VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
REPO = "runner-dev/runner"

RUNTESTS = '''#!/usr/bin/env python
"""Runs the checks of the named test files; prints per-test lines only when runner.cfg says verbose."""
import configparser, importlib.util, os, sys
cfg = configparser.ConfigParser(); cfg.read("runner.cfg")
verbose = cfg.get("runner", "report", fallback="quiet") == "verbose"
built = open("calc/_built.txt").read().strip()
failed = 0
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("t", path); mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in sorted(n for n in dir(mod) if n.startswith("test_")):
        try:
            getattr(mod, name)(); status = "PASSED"
        except Exception:
            status = "FAILED"; failed += 1
        if verbose:
            print("%s %s::%s" % (status, path, name))
print("ran with %s; %d failed" % (built, failed))
sys.exit(1 if failed else 0)
'''
CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TESTS = "import sys\nsys.path.insert(0, '.')\nfrom calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
GOLD = "\n".join([
    "diff --git a/calc/__init__.py b/calc/__init__.py", "--- a/calc/__init__.py", "+++ b/calc/__init__.py",
    "@@ -1,5 +1,5 @@", " def add(a, b):", "-    return a - b", "+    return a + b", " ", " ", " def mul(a, b):", ""])
TEST_PATCH = "\n".join([
    "diff --git a/tests/test_calc.py b/tests/test_calc.py", "--- a/tests/test_calc.py", "+++ b/tests/test_calc.py",
    "@@ -1,7 +1,11 @@", " import sys", " sys.path.insert(0, '.')", "-from calc import mul", "+from calc import add, mul",
    " ", " ", " def test_mul():", "     assert mul(2, 3) == 6", "+", "+", "+def test_add():", "+    assert add(2, 3) == 5", ""])
ENV = {"GIT_AUTHOR_NAME": "r", "GIT_AUTHOR_EMAIL": "r@r.invalid", "GIT_COMMITTER_NAME": "r",
       "GIT_COMMITTER_EMAIL": "r@r.invalid", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+00:00",
       "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+00:00"}


def _git(cwd, *args) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **ENV}, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("repos")
    src = root / REPO.replace("/", "__")
    (src / "bin").mkdir(parents=True)
    (src / "calc").mkdir()
    (src / "tests").mkdir()
    (src / "docs").mkdir()
    (src / "bin" / "runtests").write_text(RUNTESTS)
    os.chmod(src / "bin" / "runtests", 0o755)
    (src / "calc" / "__init__.py").write_text(CALC)
    (src / "tests" / "test_calc.py").write_text(TESTS)
    (src / "runner.cfg").write_text("[runner]\nreport = quiet\n")
    (src / "README").write_text("calc\n")
    os.symlink("../README", src / "docs" / "README")
    (src / "logo.bin").write_bytes(bytes(range(256)))
    (src / ".gitignore").write_text("calc/_built.txt\n")
    _git(src, "init", "-q", "-b", "main")
    _git(src, "add", "-A")
    _git(src, "commit", "-q", "-m", "calc")
    return str(root), _git(src, "rev-parse", "HEAD")


def _row(commit: str, iid: str = "runner-dev__runner-1", version: str = "1.0", **change) -> dict:
    return {"instance_id": iid, "repo": REPO, "base_commit": commit, "version": version, "patch": GOLD,
            "test_patch": TEST_PATCH, "problem_statement": "add() subtracts", "environment_setup_commit": commit,
            "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),
            "PASS_TO_PASS": json.dumps(["tests/test_calc.py::test_mul"]), **change}


def _harness(tmp_path, install: str = "python -c \"open('calc/_built.txt', 'w').write('built in place')\"",
             **more) -> str:
    spec = {"python": VERSION, "pre_install": ["sed -i 's/report = quiet/report = verbose/' runner.cfg"],
            "install": install, "test_cmd": "bin/runtests"}
    specs = {"1.0": spec, **{v: {**spec, **s} for v, s in more.items()}}
    path = tmp_path / "harness.json"
    path.write_text(json.dumps({"specs": {REPO: specs}, "reqs_paths": {}}))
    return str(path)


def _write_rows(tmp_path, rows) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, repo):
    root, commit = repo
    tmp = tmp_path_factory.mktemp("prep")
    rows = _write_rows(tmp, [_row(commit)])
    config = sp.PrepareConfig(repos_root=root, envs_root=str(tmp / "envs"), harness_specs=_harness(tmp))
    report = sp.prepare(rows, config)
    assert report.failed == {}, report.failed
    return tmp, rows, report


def _local():
    why = local_unavailable()
    if why:
        pytest.skip(why)


def test_the_sandbox_gets_the_prepared_tree_with_modes_links_binaries_and_the_pre_install_edit(prepared, repo) -> None:
    _local()
    _, rows, report = prepared
    (task,) = load_swebench(rows, SWEBenchConfig(repos_root=repo[0], specs=report.specs_path))
    assert task.runtime.work_tree == report.prepared["runner-dev__runner-1"]["checkout"]
    assert task.files["runner.cfg"] == "[runner]\nreport = verbose\n"  # the tracked file as pre_install left it
    box = LocalSandbox()
    try:
        box.start(task)
        out = box.exec("stat -c '%A %n' bin/runtests; readlink docs/README; cat docs/README; "
                       "od -An -tx1 -N4 -j252 logo.bin; cat calc/_built.txt; echo; cat runner.cfg; command -v python")
    finally:
        box.close()
    lines = out.output.splitlines()
    assert lines[0] == "-rwxr-xr-x bin/runtests", out.output
    assert lines[1:3] == ["../README", "calc"]
    assert lines[3].split() == ["fc", "fd", "fe", "ff"]
    assert lines[4] == "built in place"  # what the install step built in the tree
    assert "report = verbose" in out.output
    # the row's environment is first on PATH in the agent's shell too
    assert lines[-1] == os.path.join(os.path.dirname(report.prepared["runner-dev__runner-1"]["python"]), "python")


def test_the_row_runs_its_executable_runner_directly_gold_passes_noop_fails(prepared, repo) -> None:
    _local()
    _, rows, report = prepared
    (task,) = load_swebench(rows, SWEBenchConfig(repos_root=repo[0], specs=report.specs_path))
    assert "bin/runtests tests/test_calc.py" in task.check.command  # the harness's command, run directly
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]
    assert gold["info"]["test_exit_code"] == 0 and "PASSED tests/test_calc.py::test_add" in gold["info"]["test_log_tail"]
    assert not noop["success"] and "FAILED tests/test_calc.py::test_add" in noop["info"]["test_log_tail"]


def test_without_the_pre_install_edit_gold_cannot_pass(tmp_path, repo) -> None:
    """The control: the same row prepared without the edit has no per-test lines to grade."""
    _local()
    root, commit = repo
    harness = json.loads(open(_harness(tmp_path)).read())
    harness["specs"][REPO]["1.0"]["pre_install"] = []
    path = tmp_path / "no-edit.json"
    path.write_text(json.dumps(harness))
    rows = _write_rows(tmp_path, [_row(commit)])
    report = sp.prepare(rows, sp.PrepareConfig(repos_root=root, envs_root=str(tmp_path / "envs"), harness_specs=str(path)))
    (task,) = load_swebench(rows, SWEBenchConfig(repos_root=root, specs=report.specs_path))
    gold = run_task(task, GoldPolicy(), "local")
    assert not gold["success"] and "missing: tests/test_calc.py::test_add" in gold["info"]["test_log_tail"]


def test_eval_exits_nonzero_when_gold_fails_and_shows_the_log_tail(prepared, repo, capsys) -> None:
    _local()
    tmp, _, report = prepared
    root, commit = repo
    # a row whose FAIL_TO_PASS names a test the gold patch does not make pass
    (tmp / "bad").mkdir(exist_ok=True)
    bad = _write_rows(tmp / "bad", [_row(commit, FAIL_TO_PASS=json.dumps(["tests/test_calc.py::test_add",
                                                                          "tests/test_calc.py::test_div"]))])
    args = ["eval", "--tasks", bad, "--repos-root", root, "--swebench-specs", report.specs_path, "--policy", "gold"]
    assert main([*args, "--expect", "success"]) == 1
    out = capsys.readouterr().out
    assert "FAIL runner-dev__runner-1" in out and "last lines of the test log" in out
    assert "missing: tests/test_calc.py::test_div" in out
    assert main(args) == 0  # without --expect the exit status does not judge
    capsys.readouterr()
    records = tmp / "records.jsonl"
    assert main([*args, "--policy", "noop", "--expect", "failure", "--out", str(records)]) == 0
    (rec,) = [json.loads(line) for line in records.read_text().splitlines()]
    assert "FAILED tests/test_calc.py::test_add" in rec["info"]["test_output"]  # the whole log is kept


def test_validate_prints_a_line_per_task_writes_json_and_judges(prepared, repo, capsys, tmp_path) -> None:
    _local()
    tmp, rows, report = prepared
    root, commit = repo
    out_json = tmp_path / "report.json"
    assert main(["tasks", "validate", rows, "--repos-root", root, "--swebench-specs", report.specs_path,
                 "--json-out", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "ok    runner-dev__runner-1  code  prepared  gold=resolved  noop=not-resolved" in out
    rec = json.loads(out_json.read_text())["tasks"][0]
    assert rec["ok"] and rec["gold"]["exit_code"] == 0 and rec["noop"]["exit_code"] == 1
    assert not rec["gold"]["timed_out"] and "FAILED tests/test_calc.py::test_add" in rec["noop"]["log_tail"]
    # a wrong row (its FAIL_TO_PASS passes without a fix) and a flagged one: exit 1, the reasons named
    wrong = _write_rows(tmp_path, [_row(commit, FAIL_TO_PASS=json.dumps(["tests/test_calc.py::test_mul"]),
                                        PASS_TO_PASS="[]")])
    assert main(["tasks", "validate", wrong, "--repos-root", root, "--swebench-specs", report.specs_path]) == 1
    assert "WRONG runner-dev__runner-1" in capsys.readouterr().out


def test_a_not_gradable_row_is_reported_and_never_run(prepared, repo, capsys, tmp_path) -> None:
    tmp, rows, report = prepared
    specs = json.loads(open(report.specs_path).read())
    specs["runner-dev__runner-1"]["not_gradable"] = "needs network at test time: a test connects to 10.255.255.1"
    path = tmp_path / "specs.json"
    path.write_text(json.dumps(specs))
    (task,) = load_swebench(rows, SWEBenchConfig(repos_root=repo[0], specs=str(path)))
    assert task.grading.not_gradable.startswith("needs network")
    assert main(["tasks", "validate", rows, "--repos-root", repo[0], "--swebench-specs", str(path)]) == 1
    assert "SKIP  runner-dev__runner-1" in capsys.readouterr().out
    assert main(["eval", "--tasks", rows, "--repos-root", repo[0], "--swebench-specs", str(path), "--policy", "gold",
                 "--expect", "success"]) == 1
    assert "not gradable: needs network" in capsys.readouterr().out


def test_the_prepare_hint_names_every_option_the_eval_needs(prepared, repo, capsys) -> None:
    tmp, rows, report = prepared
    assert main(["tasks", "prepare", rows, "--repos-root", repo[0], "--envs-root", str(tmp / "envs"),
                 "--harness-specs", str(tmp / "harness.json")]) == 0
    out = capsys.readouterr().out
    hint = [line for line in out.splitlines() if line.startswith("next: compactrl eval")][0]
    assert "--swebench-specs" in hint and "pytest_plugin_autoload" in hint and "--expect success" in hint
    assert any(line.startswith("next: compactrl tasks validate") for line in out.splitlines())


def test_prepare_killed_midway_resumes_without_rebuilding_finished_envs(tmp_path, repo) -> None:
    """Two environments; the second's install step blocks until the test kills the prepare; the rerun
    reuses the first environment and row (same build, not rebuilt) and finishes the second."""
    root, commit = repo
    gate = tmp_path / "block"
    gate.write_text("")
    slow = f"while test -f {gate}; do sleep 0.2; done; python -c \"open('calc/_built.txt', 'w').write('x')\""
    harness = _harness(tmp_path, **{"2.0": {"install": slow}})
    rows = _write_rows(tmp_path, [_row(commit), _row(commit, iid="runner-dev__runner-2", version="2.0")])
    envs = tmp_path / "envs"
    argv = [sys.executable, "-m", "compactrl.cli", "tasks", "prepare", rows, "--repos-root", root,
            "--envs-root", str(envs), "--harness-specs", harness]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    manifest = envs / "manifest.json"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:  # the first row is in the manifest as soon as it is done
            if manifest.exists() and "runner-dev__runner-1" in json.loads(manifest.read_text())["instances"]:
                break
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.2)
        else:
            raise AssertionError("the first row never reached the manifest")
        time.sleep(0.5)
        assert proc.poll() is None  # still blocked in the second row's install step
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    first = json.loads(manifest.read_text())["instances"]["runner-dev__runner-1"]
    built_at = json.loads((envs / "envs" / "runner-dev__runner@1.0" / sp.STAMP).read_text())["built_at"]
    gate.unlink()
    report = sp.prepare(rows, sp.PrepareConfig(repos_root=root, envs_root=str(envs), harness_specs=harness))
    assert report.failed == {}
    again = report.prepared["runner-dev__runner-1"]
    assert again["env_reused"] and again["reused"] and again["install_s"] == first["install_s"]
    assert json.loads((envs / "envs" / "runner-dev__runner@1.0" / sp.STAMP).read_text())["built_at"] == built_at
    assert not report.prepared["runner-dev__runner-2"]["reused"]
    assert set(json.loads(manifest.read_text())["instances"]) == {"runner-dev__runner-1", "runner-dev__runner-2"}
    log = (envs / "logs" / "runner-dev__runner-2.log").read_text()
    assert "while test -f" in log  # each step's command and output streamed to the row's log


def test_a_step_past_its_time_limit_is_killed_and_named(tmp_path, repo) -> None:
    root, commit = repo
    rows = _write_rows(tmp_path, [_row(commit)])
    config = sp.PrepareConfig(repos_root=root, envs_root=str(tmp_path / "envs"), command_timeout_s=2,
                              harness_specs=_harness(tmp_path, install="sleep 30"))
    start = time.monotonic()
    why = sp.prepare(rows, config).failed["runner-dev__runner-1"]
    assert time.monotonic() - start < 25
    assert "pre_install/install" in why and "step limit of 2 s" in why and "--step-timeout" in why


def test_the_harness_eval_commands_become_pre_test_exports() -> None:
    kept, notes = sp.pre_test(["sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen",
                               "export LANG=en_US.UTF-8", "export PYTHONIOENCODING=utf8"], locales=["C.utf8"])
    assert kept == ["export LANG=C.UTF-8", "export PYTHONIOENCODING=utf8"]
    assert notes[0].startswith("left out (acts on the system): sed -i") and "en_US.UTF-8 is not installed" in notes[1]
    assert sp.pre_test(["export LANG=en_US.UTF-8"], locales=["en_US.utf8"])[0] == ["export LANG=en_US.UTF-8"]


def test_a_conda_environment_yml_becomes_pip_requirements(tmp_path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    (repo / "environment.yml").write_text(
        "name: dev\ndependencies:\n  - python=3.9\n  - numpy=1.21\n  - pytables>=3.6\n  - gtk4\n  - pytest\n"
        "  - conda-forge::cftime\n  - pip\n  - pip:\n    - pikepdf\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "env")
    skipped: list[str] = []
    lines = sp.environment_yml_requirements(str(repo), "HEAD", ["ci/environment.yml", "environment.yml"], "row", skipped)
    assert lines == ["numpy==1.21", "tables>=3.6", "pytest", "cftime", "pikepdf"]
    assert skipped == ["python=3.9", "gtk4", "pip"]
    with pytest.raises(sp.PrepareError, match=r"row: packages: none of \['nope.yml'\]"):
        sp.environment_yml_requirements(str(repo), "HEAD", ["nope.yml"], "row", [])


def test_rows_that_cannot_be_graded_here_are_flagged_with_the_reason(tmp_path, repo) -> None:
    from compactrl.tasksets.swebench.network import network_reason

    source = ("import requests\nTARPIT = 'http://10.255.255.1'\n\nclass TestTimeout:\n"
              "    def test_connect_timeout(self):\n        requests.get(TARPIT, timeout=(0.1, None))\n\n"
              "def test_basic():\n    assert requests.Request('GET', 'http://example.com').url\n")
    why = network_reason({"test_requests.py": source}, ["test_requests.py::TestTimeout::test_connect_timeout"])
    assert why.startswith("needs network at test time: test_requests.py::TestTimeout::test_connect_timeout")
    assert network_reason({"test_requests.py": source}, ["test_requests.py::test_basic"]) is None
    assert sp._apt_packages("apt-get -y update && DEBIAN_FRONTEND=noninteractive apt-get install -y foo-missing-pkg bar") \
        == ["foo-missing-pkg", "bar"]
    root, commit = repo
    tree = tmp_path / "tree"
    _git(os.path.join(root, REPO.replace("/", "__")), "worktree", "add", "--detach", str(tree), commit)
    row = _row(commit)
    why = sp.not_gradable(row, {"install": "pip install -e ."}, ["apt-get install -y compactrl-no-such-package"], str(tree))
    assert why.startswith("needs its image: apt-get install -y compactrl-no-such-package")
    assert sp.not_gradable(row, {"install": "pip install -e ."}, [], str(tree)) is None
    (tree / "calc" / "_speedups.so").write_bytes(b"\x7fELF")  # an extension the install built in place
    (tree / ".gitignore").write_text("calc/_built.txt\n*.so\n")
    compiled = {**row, "patch": row["patch"].replace("calc/__init__.py", "calc/_speedups.pyx")}
    why = sp.not_gradable(compiled, {"install": "pip install -e ."}, [], str(tree))
    assert "changes compiled sources (calc/_speedups.pyx)" in why


def test_setup_lines_that_act_on_the_machine_are_left_out() -> None:
    for line in ("echo 'en_US UTF-8' > /etc/locale.gen", "locale-gen en_US.UTF-8", "sudo make install",
                 "apt-get update && apt-get install -y locales", "sed -i 's/^# //' /etc/locale.gen && locale-gen"):
        assert sp.on_system(line), line
    for line in ("sed -i 's/pytest/pytest -rA/' tox.ini", "python -m pip install -e .", "echo x > build/y",
                 'mkdir -p "$QHULL_BUILD_DIR"'):
        assert not sp.on_system(line), line


def test_tox_current_env_runs_the_rows_venv_through_shims(tmp_path) -> None:
    """tox-current-env keeps existing .tox/NAME/bin/python files; a link to a venv's python (itself a
    link) would start the base interpreter without the venv."""
    made = sp.tox_current_env_shims(str(tmp_path), sys.executable, "tox --current-env -epy39 -v --")
    assert made == [".tox/py39/bin/python", ".tox/py39/bin/python3", f".tox/py39/bin/python{VERSION}"]
    shim = tmp_path / ".tox" / "py39" / "bin" / "python"
    out = subprocess.run([str(shim), "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    assert out.stdout.strip() == sys.prefix  # the venv itself, not its base interpreter
    assert sp.tox_current_env_shims(str(tmp_path / "x"), sys.executable, "pytest -rA") == []


def test_prepare_options_are_validated(tmp_path) -> None:
    with pytest.raises(ValueError, match="PrepareConfig.exclude_newer: expected YYYY-MM-DD"):
        sp.PrepareConfig(repos_root=str(tmp_path), envs_root=str(tmp_path), exclude_newer="last week")
    with pytest.raises(ValueError, match="PrepareConfig.resolver: expected 'auto', 'uv' or 'pip'"):
        sp.PrepareConfig(repos_root=str(tmp_path), envs_root=str(tmp_path), resolver="conda")
    assert sp.PIP_FOR_PYTHON["3.6"] == "pip<22"  # the newest pip that runs on 3.6 honours requires-python
