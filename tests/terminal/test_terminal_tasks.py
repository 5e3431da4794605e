"""The terminal task generator and its checker: reproducible, disjoint splits, facts where the
metadata says, the reference solution passes and the untouched state fails, and the shipped check
script decides exactly as the in-process checker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.shell_sim import ShellEmulator
from compactrl.tasksets.generators.code import task_seed_for
from compactrl.tasksets.generators.terminal import (
    CHECK_SCRIPT,
    FAMILIES,
    PRESETS,
    GeneratedTerminalTasks,
    TerminalTaskConfig,
    TerminalTaskGenerator,
    judge_terminal_task,
    render_solution,
)

pytestmark = pytest.mark.timeout(120)


def _solve_in_sim(task, values=None) -> dict[str, str]:
    meta = task.metadata["terminal"]
    values = values or {f["key"]: f["value"] for f in meta["facts"]}
    files = dict(task.files)
    sh = ShellEmulator(files)
    for cmd in render_solution(task, values):
        res = sh.run(cmd)
        assert res.exit_code == 0, (cmd, res.output)
    return files


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(PRESETS)), st.integers(0, 10_000))
def test_generation_is_pure_and_facts_are_where_metadata_says(difficulty: str, seed: int) -> None:
    a, b = TerminalTaskGenerator(difficulty).generate(seed), TerminalTaskGenerator(difficulty).generate(seed)
    assert a == b and a.to_json() == b.to_json()
    meta = a.metadata["terminal"]
    assert meta["family"] in FAMILIES and a.kind == "terminal" and a.check.kind == "script"
    assert CHECK_SCRIPT in a.check.hidden_files and CHECK_SCRIPT not in a.files
    for fact in meta["facts"]:
        lines = a.files[fact["file"]].split("\n")
        assert re.search(fact["pattern"], lines[fact["line"] - 1]).group(1) == fact["value"]
        assert sum(bool(re.search(fact["pattern"], line)) for line in lines) == 1  # distractors never match
    assert len({f["file"] for f in meta["facts"]}) == len(meta["facts"])  # one fact per file


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(PRESETS)), st.integers(0, 10_000))
def test_solution_passes_and_untouched_state_fails(difficulty: str, seed: int) -> None:
    task = TerminalTaskGenerator(difficulty).generate(seed)
    assert not judge_terminal_task(task, dict(task.files)).success
    assert judge_terminal_task(task, _solve_in_sim(task)).success


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000))
def test_a_wrong_fact_value_fails(seed: int) -> None:
    task = TerminalTaskGenerator("default").generate(seed)
    facts = task.metadata["terminal"]["facts"]
    values = {f["key"]: f["value"] for f in facts}
    first = facts[0]
    values[first["key"]] = first["wrong"][0] if first["wrong"] else str(int(first["value"]) + 1)
    assert not judge_terminal_task(task, _solve_in_sim(task, values)).success


def test_splits_are_disjoint_and_reproducible() -> None:
    gen = TerminalTaskGenerator("default")
    ids = {split: {GeneratedTerminalTasks(gen, split).task(i).id for i in range(50)} for split in ("train", "val", "test")}
    assert not ids["train"] & ids["test"] and not ids["train"] & ids["val"] and not ids["val"] & ids["test"]
    assert GeneratedTerminalTasks(gen, "test").task(3).id == f"terminal-default-{task_seed_for('test', 3)}"


def test_families_all_occur_and_hard_is_bigger() -> None:
    default = [TerminalTaskGenerator("default").generate(s) for s in range(30)]
    hard = [TerminalTaskGenerator("hard").generate(s) for s in range(30)]
    assert {t.metadata["terminal"]["family"] for t in default} == set(FAMILIES)

    def size(t):
        return sum(len(v) for v in t.files.values())

    assert sum(map(size, hard)) > 3 * sum(map(size, default))


@pytest.mark.parametrize("field, value", [
    ("families", ("nope",)), ("families", ()), ("num_facts", 0), ("file_lines", (10, 5)), ("file_lines", (2, 3)),
    ("fact_depth", (0.5, 1.5)), ("distractors_per_fact", -1), ("extra_files", 99), ("max_turns", 0),
])
def test_bad_config_names_the_field(field: str, value) -> None:
    with pytest.raises(ValueError, match=f"TerminalTaskConfig.{field}"):
        TerminalTaskConfig(**{field: value})


def test_unknown_difficulty_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="difficulty"):
        TerminalTaskGenerator("impossible")


def _run_check_script(task, files: dict[str, str]) -> int:
    with tempfile.TemporaryDirectory() as root:
        for path, text in {**files, **task.check.hidden_files}.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)) or root, exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as fh:
                fh.write(text)
        return subprocess.run([sys.executable, CHECK_SCRIPT], cwd=root, capture_output=True, timeout=60).returncode


@pytest.mark.parametrize("seed", range(6))
def test_check_script_decides_like_the_in_process_checker(seed: int) -> None:
    task = TerminalTaskGenerator("default").generate(seed)
    untouched, solved = dict(task.files), _solve_in_sim(task)
    assert _run_check_script(task, untouched) == 1
    assert _run_check_script(task, solved) == 0


@pytest.mark.parametrize("seed", range(6))
def test_solution_in_real_bash_passes_the_check_script(seed: int) -> None:
    """The same commands in real bash (not the emulator) and the shipped script: success."""
    task = TerminalTaskGenerator("default").generate(seed)
    meta = task.metadata["terminal"]
    with tempfile.TemporaryDirectory() as root:
        for path, text in {**task.files, **task.check.hidden_files}.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)) or root, exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as fh:
                fh.write(text)
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
        for cmd in render_solution(task, {f["key"]: f["value"] for f in meta["facts"]}):
            subprocess.run(["bash", "-c", cmd], cwd=root, env=env, check=True, timeout=30)
        assert subprocess.run([sys.executable, CHECK_SCRIPT], cwd=root, timeout=60).returncode == 0


def test_presets_generate_the_same_tasks_as_before_the_flaky_knob() -> None:
    import hashlib

    digest = hashlib.sha256()
    for name in ("easy", "default", "hard"):
        gen = TerminalTaskGenerator(name)
        for seed in range(12):
            digest.update(gen.generate(seed).to_json().encode())
    assert digest.hexdigest() == "daf685221f4a89aa5d4766329442b3d8e47dd23cf551c235e86348877e770b0c"


def test_a_flaked_checker_run_does_not_accept_the_submit() -> None:
    import dataclasses

    from compactrl.envs.terminal_env import TerminalEnv

    cfg = dataclasses.replace(PRESETS["easy"], name="flaky", flaky_test_p=0.999)
    task = TerminalTaskGenerator(cfg).generate(task_seed_for("test", 0))
    assert task.metadata["dynamics"]["flaky_test_p"] == 0.999
    plain = TerminalTaskGenerator(dataclasses.replace(cfg, flaky_test_p=0.0)).generate(task_seed_for("test", 0))
    assert plain.files == task.files and "dynamics" not in plain.metadata
    env = TerminalEnv(task)
    env.reset(seed=0)
    obs, reward, terminated, truncated, _ = env.step("<tool>submit</tool>")
    assert "not accepted" in obs and reward == 0.0 and not terminated and not truncated
