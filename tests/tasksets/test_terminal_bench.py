"""The Terminal-Bench loader: task.yaml fields, hidden tests, the solution; gold succeeds and noop
fails on the real backends; the CLI's JSON output."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from loader_helpers import FIXTURES, TB_TASK

from compactrl.cli import main
from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.tasksets import load_tasks
from compactrl.tasksets.terminal_bench.folders import (
    TESTS_DIR,
    TerminalBenchConfig,
    TerminalBenchError,
    load_task_dir,
    load_terminal_bench,
)

pytestmark = pytest.mark.timeout(300)


def test_folder_becomes_a_task() -> None:
    task = load_task_dir(TB_TASK)
    assert (task.id, task.kind, task.source) == ("count-errors", "terminal", "terminal-bench")
    assert task.instruction.startswith("The directory /app/logs holds one log file per service")
    assert task.time_limit_s == 300.0 and task.check.timeout_s == 60.0
    assert sorted(task.files) == ["logs/api.log", "logs/billing.log", "logs/db.log", "logs/worker.log"]
    # run-tests.sh apart from tests/, so a tests/run-tests.sh is not overwritten
    assert sorted(task.check.hidden_files) == [".tbench_run/run-tests.sh", ".tbench_run/rw-run-tests.sh",
                                               f"{TESTS_DIR}/test_outputs.py"]
    # graded by its own run-tests.sh (it needs no network) from /tests, read with the harness's parser
    assert task.check.kind == "tbench" and task.check.must_pass == ()
    assert "cp .tbench_run/run-tests.sh /tests/run-tests.sh; bash /tests/run-tests.sh;" in task.check.command
    assert task.runtime.workdir == "/app"  # the Dockerfile's WORKDIR
    assert "grep -c ' ERROR '" in task.reference.solution_sh
    assert task.origin["terminal_bench"]["difficulty"] == "easy"


def test_options_and_folder_of_folders() -> None:
    cfg = TerminalBenchConfig(grading="pytest", use_dockerfile_workdir=False, image="tb:latest", python="py3")
    problems: list[str] = []
    tasks = load_terminal_bench(os.path.join(FIXTURES, "terminal_bench"), cfg, problems)
    task = tasks[0]
    assert ' py3 -m pytest -rA -p no:cacheprovider "$TEST_DIR";' in task.check.command
    assert not task.runtime.workdir and task.docker_image == "tb:latest"
    assert [t.id for t in load_tasks(os.path.join(FIXTURES, "terminal_bench"))] == [
        "count-errors", "decode-payload", "sum-numbers"]
    assert len(problems) == 1 and "bad: task file: no task.yaml (1.x) or task.toml (2.x)" in problems[0]


def _copy(tmp_path) -> str:
    dest = str(tmp_path / "task")
    shutil.copytree(TB_TASK, dest)
    return dest


def test_solution_yaml_is_read(tmp_path) -> None:
    folder = _copy(tmp_path)
    os.remove(os.path.join(folder, "solution.sh"))
    with open(os.path.join(folder, "solution.yaml"), "w") as fh:
        fh.write("- command: echo one > report.txt\n  min_timeout_sec: 1\n- command: cat report.txt\n")
    assert load_task_dir(folder).reference.solution_sh == "echo one > report.txt\ncat report.txt\n"


@pytest.mark.parametrize("edit, message", [
    (lambda d: os.remove(os.path.join(d, "task.yaml")), "task file: no task.yaml"),
    (lambda d: (shutil.rmtree(os.path.join(d, "tests")), os.remove(os.path.join(d, "run-tests.sh"))),
     "tests: no tests/ folder with the task's tests and no run-tests.sh"),
    (lambda d: open(os.path.join(d, "task.yaml"), "w").write("instruction: ''\n"), "instruction: needs a non-empty"),
    (lambda d: open(os.path.join(d, "task.yaml"), "a").write("parser_name: swebench\n"), "parser_name: 'swebench'"),
    (lambda d: open(os.path.join(d, "task.yaml"), "w").write("instruction: x\nmax_test_timeout_sec: soon\n"),
     "max_test_timeout_sec: must be a number"),
])
def test_bad_folders_raise_clear_errors(tmp_path, edit, message: str) -> None:
    folder = _copy(tmp_path)
    edit(folder)
    with pytest.raises(TerminalBenchError, match=message):
        load_task_dir(folder)


def test_gold_succeeds_and_noop_fails(backend: str) -> None:
    task = load_task_dir(TB_TASK)
    # docker builds the task's image from its Dockerfile; its t-bench base is replaced by the default image
    kwargs = {"base_images": {"ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest": "compactrl-sandbox:latest"}}
    kwargs = kwargs if backend == "docker" else None
    gold = run_task(task, GoldPolicy(), backend, sandbox_kwargs=kwargs)
    assert gold["success"] and gold["info"]["test_summary"].startswith("Tests: 3 passed, 0 failed"), gold
    noop = run_task(task, NoopPolicy(), backend, sandbox_kwargs=kwargs)
    assert not noop["success"] and noop["sandbox_error"] is None, noop
    assert noop["info"]["test_summary"].startswith("Tests: 0 passed, 3 failed"), noop


def test_eval_cli_prints_json_per_task_and_overall(capsys) -> None:
    from loader_helpers import local_unavailable

    if local_unavailable():
        pytest.skip(local_unavailable())
    assert main(["eval", "--tasks", TB_TASK, "--backend", "local", "--policy", "gold", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["success_rate"] == 1.0 and out["summary"]["episodes"] == 1
    assert out["config"]["policy"] == "gold" and out["episodes"][0]["task_id"] == "count-errors"


def test_eval_cli_rejects_a_bad_path(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--tasks", "/nonexistent/tasks.jsonl", "--policy", "noop"])
    assert exc.value.code == 2 and capsys.readouterr().err.startswith("compactrl eval: error: --tasks:")
