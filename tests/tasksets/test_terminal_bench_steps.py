"""Harbor's multi-step tasks (``[[steps]]``): read with every step's instruction, tests and solution;
run in one episode in the real local sandbox, each step graded by its own verifier when the agent
submits, the next step's instruction then given in the same conversation; a step below its
``min_reward`` ends the task; the task's reward derived from the steps' as Harbor derives it."""

from __future__ import annotations

import pytest
from loader_helpers import local_unavailable

from compactrl.envs.code_env import steps_reward
from compactrl.envs.terminal_env import TerminalEnv
from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy, gold_calls
from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig, load_task_dir
from compactrl.tasksets.terminal_bench.spec import TerminalBenchError

VERIFIER = """#!/usr/bin/env python3
import pathlib
ok = all(pathlib.Path(p).read_text().strip() == w
         for p, w in (%s) if pathlib.Path(p).exists()) and all(pathlib.Path(p).exists() for p, _ in (%s))
pathlib.Path("/logs/verifier").mkdir(parents=True, exist_ok=True)
pathlib.Path("/logs/verifier/reward.txt").write_text("1" if ok else "0")
"""


def _verifier(*pairs: tuple[str, str]) -> str:
    listed = ", ".join(repr(p) for p in pairs) + ","
    return VERIFIER % (listed, listed)


def _two_step_task(root, gate: str = "min_reward = 1.0\n", strategy: str = "") -> str:
    folder = root / "two-steps"
    (folder / "environment").mkdir(parents=True)
    (folder / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\n")
    (folder / "task.toml").write_text(
        'schema_version = "1.1"\n' + strategy + '[agent]\ntimeout_sec = 120.0\n[verifier]\ntimeout_sec = 60.0\n'
        f'\n[[steps]]\nname = "1_make"\n{gate}\n[[steps]]\nname = "2_extend"\n[steps.verifier]\ntimeout_sec = 30.0\n')
    for name, text, solution, pairs in (
            ("1_make", "Write one to a.txt.", "echo one > /app/a.txt\n", [("/app/a.txt", "one")]),
            ("2_extend", "Now also write two to b.txt.", "echo two > /app/b.txt\n",
             [("/app/a.txt", "one"), ("/app/b.txt", "two")])):
        step = folder / "steps" / name
        (step / "tests").mkdir(parents=True)
        (step / "solution").mkdir()
        (step / "instruction.md").write_text(text + "\n")
        (step / "tests" / "test.sh").write_text(_verifier(*pairs))
        (step / "solution" / "solve.sh").write_text(solution)
    return str(folder)


def test_the_steps_are_read_with_their_own_tests_solutions_and_limits(tmp_path) -> None:
    task = load_task_dir(_two_step_task(tmp_path), TerminalBenchConfig(backend="local"))
    steps = task.steps
    assert task.instruction == "Write one to a.txt." and [s.name for s in steps] == ["1_make", "2_extend"]
    assert task.steps_reward == "mean" and steps[0].min_reward == 1.0 and steps[1].min_reward is None
    assert task.check.kind == "harbor" and task.check.timeout_s == 60.0 and steps[1].check.timeout_s == 30.0
    assert "/app/b.txt" in steps[1].check.hidden_files[".tbench_tests/test.sh"]
    assert "/app/b.txt" not in task.check.hidden_files[".tbench_tests/test.sh"]
    assert task.time_limit_s == 240.0  # every step's agent time
    calls = gold_calls(task)
    assert [c.name for c in calls] == ["create", "shell", "submit", "create", "shell"]
    assert "b.txt" in calls[3].content and "b.txt" not in calls[0].content


def test_bad_steps_are_named(tmp_path) -> None:
    folder = _two_step_task(tmp_path)
    tests = tmp_path / "two-steps" / "steps" / "2_extend" / "tests"
    (tests / "test_outputs.py").write_text("def test_x():\n    pass\n")
    (tests / "test.sh").unlink()
    with pytest.raises(TerminalBenchError, match="steps/2_extend/tests/test.sh: tests: missing"):
        load_task_dir(folder)
    toml = tmp_path / "two-steps" / "task.toml"
    toml.write_text(toml.read_text().replace('name = "2_extend"', 'name = "../x"'))
    with pytest.raises(TerminalBenchError, match=r"steps\[1\]\.name: expected a folder name under steps/"):
        load_task_dir(folder)
    toml.write_text('multi_step_reward_strategy = "max"\n' + toml.read_text())
    with pytest.raises(TerminalBenchError, match="multi_step_reward_strategy: expected 'mean' or 'final'"):
        load_task_dir(folder)


def test_the_reward_of_the_graded_steps() -> None:
    assert steps_reward([True, True]) == 1.0 and steps_reward([True, False]) == 0.5
    assert steps_reward([True, False], "final") == 0.0 and steps_reward([False]) == 0.0 == steps_reward([])
    with pytest.raises(ValueError, match="steps_reward"):
        steps_reward([True], "max")


@pytest.fixture
def local() -> None:
    if local_unavailable():
        pytest.skip(local_unavailable())


def test_gold_passes_every_step_and_noop_stops_at_the_gate(tmp_path, local) -> None:
    task = load_task_dir(_two_step_task(tmp_path), TerminalBenchConfig(backend="local"))
    gold = run_task(task, GoldPolicy(), "local")
    assert gold["success"] and gold["reward"] == 1.0, gold["info"]
    assert gold["info"]["steps_summary"] == "1_make: pass; 2_extend: pass" and gold["info"]["steps_passed"] == 2
    noop = run_task(task, NoopPolicy(), "local")
    assert not noop["success"] and noop["reward"] == 0.0
    # min_reward 1.0: step 2 never starts
    assert noop["info"]["steps_summary"] == "1_make: fail" and noop["info"]["steps_graded"] == 1


def test_without_a_gate_each_step_counts_in_the_mean(tmp_path, local) -> None:
    task = load_task_dir(_two_step_task(tmp_path, gate=""), TerminalBenchConfig(backend="local"))
    env = TerminalEnv(task, backend="local")
    try:
        obs, _ = env.reset()
        assert obs.startswith("Write one to a.txt.")
        env.step("<tool>shell\necho one > /app/a.txt</tool>")
        obs, reward, terminated, truncated, _ = env.step("<tool>submit</tool>")
        assert not terminated and reward == 0.0 and "Step 2 of 2 (2_extend):\nNow also write two to b.txt." in obs
        obs, reward, terminated, truncated, info = env.step("<tool>submit</tool>")  # b.txt not written
        assert terminated and reward == 0.5 and info["success"] is False
        assert info["steps"] == [{"name": "1_make", "success": True}, {"name": "2_extend", "success": False}]
    finally:
        env.close()
    final = load_task_dir(_two_step_task(tmp_path / "f", gate="", strategy='multi_step_reward_strategy = "final"\n'),
                          TerminalBenchConfig(backend="local"))
    assert run_task(final, GoldPolicy(), "local")["reward"] == 1.0
