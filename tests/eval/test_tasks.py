"""Task-set evaluation through the collector: gold succeeds, noop fails, failures are records."""

from __future__ import annotations

import json
import os
import sys

import pytest

from compactrl.cli import main
from compactrl.envs.code_env import CodeRepoEnv
from compactrl.envs.terminal_env import TerminalEnv
from compactrl.eval import evaluate_tasks, run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.tasksets import load_tasks
from compactrl.tasksets.swebench.rows import SWEBenchConfig
from compactrl.wrappers import ContextBudgetConfig

pytestmark = pytest.mark.timeout(300)

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
SWEBENCH_ROWS = os.path.join(FIXTURES, "swebench", "instances.jsonl")
TB_TASK = os.path.join(FIXTURES, "terminal_bench", "count-errors")


def _generated_tasks():
    """Code and terminal tasks interleaved, so that records must come back in input order."""
    by_kind = []
    for cls in (CodeRepoEnv, TerminalEnv):
        env = cls(difficulty="easy", split="test")
        by_kind.append([env.reset(seed=s) and env.task for s in range(2)])
    return [t for pair in zip(*by_kind) for t in pair]


def _local_unavailable() -> str | None:
    from compactrl.sandbox.base import SandboxError
    from compactrl.sandbox.local import choose_isolation

    try:
        choose_isolation("auto")
    except SandboxError as e:
        return f"local sandbox unavailable: {e} (apt-get install bubblewrap)"
    return None


@pytest.fixture(scope="module")
def fixture_tasks(tmp_path_factory):
    """The SWE-bench fixture row (its checkout built in a temp dir) and the Terminal-Bench folder."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("swebench_fixture_build", os.path.join(FIXTURES, "swebench", "build.py"))
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    root = str(tmp_path_factory.mktemp("repos"))
    build.build_repo(root)
    swe = load_tasks(SWEBENCH_ROWS, swebench=SWEBenchConfig(repos_root=root, python="python3"))
    return swe + load_tasks(TB_TASK), root


def test_gold_succeeds_and_noop_fails_on_sim_task_records():
    tasks = _generated_tasks()
    gold, records = evaluate_tasks(tasks, GoldPolicy(), "sim", num_envs=2)
    assert gold["success_rate"] == 1.0 and gold["sandbox_errors"] == 0
    assert [r["task_id"] for r in records] == [t.id for t in tasks] and [r["episode_id"] for r in records] == [0, 1, 2, 3]
    assert [r["kind"] for r in records] == ["code", "terminal", "code", "terminal"]
    assert all(r["num_traces"] == 1 and r["compactions"] == 0 for r in records)  # the open budget
    noop, records = evaluate_tasks(tasks, NoopPolicy(), "sim")
    assert noop["success_rate"] == 0.0 and noop["sandbox_errors"] == 0 and noop["steps_per_episode"] == 1


def test_gold_succeeds_and_noop_fails_on_the_fixture_rows_locally(fixture_tasks):
    if _local_unavailable():
        pytest.skip(_local_unavailable())
    tasks, _ = fixture_tasks
    gold, records = evaluate_tasks(tasks, GoldPolicy(), "local")
    assert gold["success_rate"] == 1.0 and gold["sandbox_errors"] == 0, records
    assert [r["info"]["test_summary"].split(".")[0] for r in records] == ["Tests: 7 passed, 0 failed",
                                                                         "Tests: 3 passed, 0 failed"]
    noop, records = evaluate_tasks(tasks, NoopPolicy(), "local")
    assert noop["success_rate"] == 0.0 and noop["sandbox_errors"] == 0, records
    assert [r["info"]["test_summary"].split(".")[0] for r in records] == ["Tests: 5 passed, 2 failed",
                                                                         "Tests: 0 passed, 3 failed"]


def test_tasks_a_backend_cannot_run_are_records_not_crashes(fixture_tasks):
    tasks, _ = fixture_tasks
    summary, records = evaluate_tasks(tasks, GoldPolicy(), "sim")  # sim runs generated tasks only
    assert summary["sandbox_errors"] == 2 and summary["success_rate"] == 0.0
    assert [r["task_id"] for r in records] == ["mathkit-dev__mathkit-17", "count-errors"]
    assert all("ValueError" in r["sandbox_error"] and r["truncated"] for r in records)


def test_a_task_that_does_not_fit_the_budget_is_a_record():
    tasks = _generated_tasks()[:2]
    tight = ContextBudgetConfig(budget=300, reserve=64, tool_output_cap=64, max_compactions=0)
    summary, records = evaluate_tasks(tasks, GoldPolicy(), "sim", context_budget=tight)
    assert summary["sandbox_errors"] == 2 and all("budget" in r["sandbox_error"] for r in records)
    assert run_task(tasks[0], GoldPolicy(), "sim")["success"]


def test_cli_task_set_json_and_jsonl(tmp_path, capsys):
    tasks = _generated_tasks()
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(t.to_json() + "\n" for t in tasks))
    out = tmp_path / "records.jsonl"
    assert main(["eval", "--tasks", str(path), "--backend", "sim", "--policy", "gold", "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"]["success_rate"] == 1.0 and printed["config"]["backend"] == "sim"
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == printed["episodes"] and [r["task_id"] for r in lines] == [t.id for t in tasks]
    assert main(["eval", "--tasks", str(path), "--backend", "sim", "--policy", "noop"]) == 0
    table = capsys.readouterr().out
    assert table.count("FAIL ") == len(tasks) and "success_rate" in table


def test_cli_rejects_a_bad_task_path_in_one_line(tmp_path):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "compactrl.cli", "eval", "--tasks", str(tmp_path / "none.jsonl"),
                           "--policy", "noop"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("compactrl eval: error: --tasks:") and proc.stderr.count("\n") == 1


def test_cli_task_set_under_a_budget(tmp_path, capsys):
    tasks = _generated_tasks()
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(t.to_json() + "\n" for t in tasks))
    argv = ["eval", "--tasks", str(path), "--backend", "sim", "--policy", "gold", "--json"]
    assert main([*argv, "--budget", "2048", "--max-new-tokens", "256", "--max-compactions", "2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"]["success_rate"] == 1.0 and printed["config"]["budget"] == 2048
    assert all(0 < r["info"]["context_tokens_max"] <= 2048 - 256 for r in printed["episodes"])
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--budget", "100"])
    assert exc.value.code == 2 and capsys.readouterr().err.startswith("compactrl eval: error: --budget")
