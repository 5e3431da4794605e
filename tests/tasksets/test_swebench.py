"""The SWE-bench loader: the upstream row format, the image naming convention, the test command
and hidden test files; gold succeeds and noop fails on the real backends."""

from __future__ import annotations

import json

import pytest
from loader_helpers import SWEBENCH_ROWS

from compactrl.eval import evaluate_tasks, run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.tasksets import load_tasks
from compactrl.tasksets.swebench.rows import (
    GRADE_SPEC,
    GRADER_FILE,
    IMAGE_PYTHON,
    TEST_PATCH_FILE,
    SWEBenchConfig,
    SWEBenchError,
    get_test_directives,
    image_name,
    load_swebench,
    patch_targets,
    read_rows,
    row_to_task,
)

pytestmark = pytest.mark.timeout(300)


def _row() -> dict:
    return read_rows(SWEBENCH_ROWS)[0]


@pytest.mark.parametrize("iid, expected", [
    ("django__django-10973", "swebench/sweb.eval.x86_64.django_1776_django-10973:latest"),
    ("astropy__astropy-14096", "swebench/sweb.eval.x86_64.astropy_1776_astropy-14096:latest"),
    ("scikit-learn__scikit-learn-13142", "swebench/sweb.eval.x86_64.scikit-learn_1776_scikit-learn-13142:latest"),
    ("Mathkit__Mk-1", "swebench/sweb.eval.x86_64.mathkit_1776_mk-1:latest"),
])
def test_image_names_follow_the_harness_convention(iid: str, expected: str) -> None:
    assert image_name(iid) == expected
    assert image_name(iid, namespace=None) == f"sweb.eval.x86_64.{iid.lower()}:latest"  # local builds keep "__"


def test_get_test_directives_drop_non_test_files() -> None:
    diff = ("diff --git a/tests/a.py b/tests/a.py\n--- a/tests/a.py\n+++ b/tests/a.py\n"
            "diff --git a/tests/data.json b/tests/data.json\ndiff --git a/docs/x.md b/docs/x.md\n"
            "diff --git a/tests/b.py b/tests/b.py\n")
    assert patch_targets(diff) == ["tests/a.py", "tests/data.json", "docs/x.md", "tests/b.py"]
    assert get_test_directives(diff) == ["tests/a.py", "tests/b.py"]
    # django's runtests.py takes module labels, as the harness writes them
    django = "diff --git a/tests/queries/test_q.py b/tests/queries/test_q.py\ndiff --git a/tests/x/y.txt b/tests/x/y.txt\n"
    assert get_test_directives(django, "django/django") == ["queries.test_q"]


def test_row_becomes_a_task_from_the_local_checkout(repos_root: str) -> None:
    row = _row()
    task = row_to_task(row, SWEBenchConfig(repos_root=repos_root))
    assert (task.id, task.kind, task.source, task.docker_image) == (row["instance_id"], "code", "swebench", None)
    assert "median() is wrong" in task.instruction
    assert set(task.files) == {"README.md", "setup.cfg", "mathkit/__init__.py", "mathkit/stats.py", "tests/test_stats.py"}
    # the test patch's files, post-patch, are hidden; the agent sees the base versions
    assert set(task.check.hidden_files) == {"tests/test_stats.py", "tests/test_median_types.py", GRADER_FILE, GRADE_SPEC}
    assert "test_median_even" in task.check.hidden_files["tests/test_stats.py"]
    assert "test_median_even" not in task.files["tests/test_stats.py"]
    assert task.check.must_pass == tuple(json.loads(row["FAIL_TO_PASS"]) + json.loads(row["PASS_TO_PASS"]))
    # the log of the tests is graded in the sandbox by the harness's parser for the repository
    assert task.check.kind == "script"
    assert "( python -m pytest -rA -p no:cacheprovider tests/test_median_types.py tests/test_stats.py )" in task.check.command
    assert f"python -I {GRADER_FILE} {GRADE_SPEC}" in task.check.command
    assert json.loads(task.check.hidden_files[GRADE_SPEC]) == {
        "repo": row["repo"], "log_parser": None, "FAIL_TO_PASS": json.loads(row["FAIL_TO_PASS"]),
        "PASS_TO_PASS": json.loads(row["PASS_TO_PASS"])}
    assert task.reference.gold_patch == row["patch"] and task.origin["base_commit"] == row["base_commit"]
    assert task.to_json() == type(task).from_json(task.to_json()).to_json()


def test_image_mode_keeps_the_repo_in_the_image() -> None:
    task = row_to_task(_row(), SWEBenchConfig(use_images=True))
    assert task.files == {} and task.runtime.workdir == "/testbed"
    assert task.docker_image == "swebench/sweb.eval.x86_64.mathkit-dev_1776_mathkit-17:latest"
    assert set(task.check.hidden_files) == {TEST_PATCH_FILE, GRADER_FILE, GRADE_SPEC}
    assert task.check.hidden_files[TEST_PATCH_FILE] == _row()["test_patch"]
    cmd = task.check.command
    assert f"if git apply --whitespace=nowarn {TEST_PATCH_FILE}; then" in cmd and f"( {IMAGE_PYTHON} -m pytest -rA" in cmd
    assert cmd.index("git checkout") < cmd.index("git apply") < cmd.rindex("git checkout")
    assert "rm -f tests/test_median_types.py" in cmd


def test_plain_list_fields_and_config_options(repos_root: str) -> None:
    row = dict(_row(), FAIL_TO_PASS=["t::a"], PASS_TO_PASS=[])
    cfg = SWEBenchConfig(repo_paths={"mathkit-dev/mathkit": f"{repos_root}/mathkit-dev__mathkit"}, python="/opt/py/bin/python",
                         setup=("pip install -e .",), setup_by_repo={"mathkit-dev/mathkit": ("echo ready",)},
                         test_command="{python} -m pytest -x -rA {test_files}")
    task = row_to_task(row, cfg)
    assert task.check.must_pass == ("t::a",)
    assert task.setup == ("pip install -e .", "echo ready")
    assert "( /opt/py/bin/python -m pytest -x -rA tests/" in task.check.command


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="repos_root or repo_paths"):
        SWEBenchConfig()
    with pytest.raises(ValueError, match="arch"):
        SWEBenchConfig(use_images=True, arch="riscv")
    with pytest.raises(ValueError, match="test_files"):
        SWEBenchConfig(use_images=True, test_command="pytest")


def test_load_filters_instance_ids(repos_root: str) -> None:
    cfg = SWEBenchConfig(repos_root=repos_root)
    assert [t.id for t in load_tasks(SWEBENCH_ROWS, swebench=cfg)] == ["mathkit-dev__mathkit-17"]
    with pytest.raises(SWEBenchError, match="not in"):
        load_swebench(SWEBENCH_ROWS, cfg, instance_ids=["other__x-1"])


def test_gold_succeeds_and_noop_fails(repos_root: str, backend: str) -> None:
    task = row_to_task(_row(), SWEBenchConfig(repos_root=repos_root, python="python3"))
    gold = run_task(task, GoldPolicy(), backend)
    assert gold["success"] and gold["info"]["test_summary"].startswith("Tests: 7 passed, 0 failed"), gold
    noop = run_task(task, NoopPolicy(), backend)
    assert not noop["success"] and noop["sandbox_error"] is None, noop
    # exactly the FAIL_TO_PASS tests fail before the fix
    assert noop["info"]["test_summary"].startswith("Tests: 5 passed, 2 failed"), noop


def test_evaluate_tasks_reports_per_task_and_overall(repos_root: str) -> None:
    from loader_helpers import local_unavailable

    if local_unavailable():
        pytest.skip(local_unavailable())
    tasks = load_tasks(SWEBENCH_ROWS, swebench=SWEBenchConfig(repos_root=repos_root, python="python3"))
    summary, records = evaluate_tasks(tasks, NoopPolicy(), "local")
    assert (summary["episodes"], summary["success_rate"], summary["sandbox_errors"], summary["steps_per_episode"]) == (1, 0, 0, 1)
    assert records[0]["task_id"] == "mathkit-dev__mathkit-17"
