"""What a SWE-bench row needs of the local sandbox: the row's interpreter (its prefix, a venv's base
interpreter) visible read-only, a writable /dev/shm, and a verdict that says why when the
interpreter cannot start; the CLI's per-repository specs file."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
from loader_helpers import SWEBENCH_ROWS, local_unavailable

from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.sandbox.local import LocalSandbox, LocalSandboxConfig, _host_binds, _interpreter_prefixes
from compactrl.tasksets.swebench.rows import SWEBenchConfig, read_rows, row_to_task

pytestmark = pytest.mark.timeout(300)


def _local() -> None:
    if local_unavailable():
        pytest.skip(local_unavailable())


def test_a_venvs_base_interpreter_prefix_is_mounted(tmp_path) -> None:
    base = tmp_path / "pythons" / "3.9.19"
    (base / "bin").mkdir(parents=True)
    venv = tmp_path / "envs" / "astropy-5.1"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base}/bin\ninclude-system-site-packages = false\nversion = 3.9.19\n")
    (venv / "bin" / "python").symlink_to(base / "bin" / "python3.9")
    assert str(base) in _interpreter_prefixes(str(venv / "bin" / "python"))
    _, binds = _host_binds(str(venv / "bin" / "python"))
    assert str(base) in binds and str(venv) in binds
    assert _interpreter_prefixes("/usr/bin/python3") == ["/usr"]  # no pyvenv.cfg: its own prefix only


def _task(repos_root: str, **row_change):
    row = dict(read_rows(SWEBENCH_ROWS)[0], **row_change)
    return row_to_task(row, SWEBenchConfig(repos_root=repos_root))


def test_dev_shm_is_writable_and_bounded(repos_root: str) -> None:
    _local()
    box = LocalSandbox()
    box.start(_task(repos_root))
    try:
        res = box.exec("python3 -c 'import multiprocessing as m; l = m.Lock(); l.acquire(); print(\"locked\")'")
        assert res.exit_code == 0 and "locked" in res.output, res.output
        res = box.exec("head -c 20000000 /dev/zero > /dev/shm/big; echo rc=$?")
        assert "rc=0" not in res.output and "No space left" in res.output, res.output  # 16 MiB, not the host's
    finally:
        box.close()


def test_the_rows_interpreter_runs_the_tests(repos_root: str) -> None:
    """An absolute ``python`` of the row is the sandbox's python (wrappers and mounts), not the default."""
    _local()
    task = _task(repos_root, python=sys.executable)
    box = LocalSandbox()
    box.start(task)
    try:
        res = box.exec("python -c 'import sys; print(sys.executable)'; readlink -f $(command -v python)")
        assert sys.executable in res.output, res.output
    finally:
        box.close()


def test_an_interpreter_that_cannot_start_is_named_in_the_verdict(repos_root: str) -> None:
    _local()
    task = _task(repos_root, python="/opt/no-such-env/bin/python")
    result = run_task(task, GoldPolicy(), "local")
    assert not result["success"] and result["sandbox_error"] is None, result
    summary = result["info"]["test_summary"]
    assert summary.startswith("Tests: 0 passed, 1 failed.\nFAILED [the test interpreter /opt/no-such-env/bin/python "
                              "cannot start in the sandbox"), summary


def test_the_cli_reads_a_specs_file(tmp_path, repos_root: str, capsys) -> None:
    _local()
    from compactrl.cli import main

    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps({"mathkit-dev/mathkit": {"python": sys.executable, "setup": ["test -f setup.cfg"]}}))
    out = tmp_path / "records.jsonl"
    main(["eval", "--tasks", SWEBENCH_ROWS, "--repos-root", repos_root, "--swebench-specs", str(specs),
          "--backend", "local", "--policy", "gold", "--out", str(out)])
    record = json.loads(out.read_text().splitlines()[0])
    assert record["success"] and record["info"]["test_summary"].startswith("Tests: 7 passed, 0 failed"), record
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"mathkit-dev/mathkit": {"setup": "pip install ."}}))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["eval", "--tasks", SWEBENCH_ROWS, "--repos-root", repos_root, "--swebench-specs", str(bad),
              "--backend", "local", "--policy", "gold"])
    assert "SWEBenchConfig.specs['mathkit-dev/mathkit'].setup: expected a list of strings" in capsys.readouterr().err


def test_a_module_the_agent_plants_cannot_fake_the_verdict(repos_root: str) -> None:
    """The grader imports json and re: a work-dir json.py that exits 0 must not make it "resolve"."""
    _local()
    task = _task(repos_root)
    planted = dataclasses.replace(task, files={**task.files, "json.py": "raise SystemExit(0)\n"})
    result = run_task(planted, NoopPolicy(), "local")
    assert not result["success"] and result["sandbox_error"] is None, result


def test_extra_read_only_mounts(tmp_path, repos_root: str) -> None:
    shared = tmp_path / "wheels"
    shared.mkdir()
    (shared / "index.txt").write_text("pinned\n")
    with pytest.raises(ValueError, match="ro_binds must be a list of absolute paths of existing directories"):
        LocalSandboxConfig(ro_binds=("relative/dir",))
    _local()
    box = LocalSandbox(ro_binds=[str(shared)])  # as --sandbox-kwargs gives it: a JSON list
    box.start(_task(repos_root))
    try:
        res = box.exec(f"cat {shared}/index.txt; touch {shared}/new 2>&1; echo rc=$?")
        assert res.output.startswith("pinned\n") and "rc=0" not in res.output, res.output
    finally:
        box.close()
    assert not (shared / "new").exists()
