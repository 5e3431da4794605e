"""Strict SWE-bench row validation: every bad input is an error naming the file and line, the
instance and the field; per-repository settings (specs) and generated files."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from loader_helpers import SWEBENCH_ROWS, local_unavailable

from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy
from compactrl.tasksets import load_tasks
from compactrl.tasksets.swebench.rows import (
    SWEBenchConfig,
    SWEBenchError,
    load_specs,
    load_swebench,
    read_rows,
    row_to_task,
)

IID = "mathkit-dev__mathkit-17"


def _row(**change) -> dict:
    row = dict(read_rows(SWEBENCH_ROWS)[0], **change)
    return {k: v for k, v in row.items() if v is not None}


def _write(tmp_path, rows: list, name: str = "rows.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


BROKEN_PATCH = "diff --git a/mathkit/stats.py b/mathkit/stats.py\n--- a/mathkit/stats.py\n+++ b/mathkit/stats.py\n" \
               "@@ -1,2 +1,2 @@\n-no such line here\n+replacement\n context that is not there\n"


@pytest.mark.parametrize("change, field_message", [
    ({"FAIL_TO_PASS": None}, "FAIL_TO_PASS: missing"),
    ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS: empty"),
    ({"FAIL_TO_PASS": []}, "FAIL_TO_PASS: empty"),
    ({"FAIL_TO_PASS": "not json"}, "FAIL_TO_PASS: not a JSON list"),
    ({"PASS_TO_PASS": None}, "PASS_TO_PASS: missing"),
    ({"test_patch": None}, "test_patch: missing or empty"),
    ({"repo": "someone/else"}, "repo: no checkout for someone/else"),
    ({"base_commit": "0" * 40}, f"base_commit: {'0' * 40} is not a commit of "),
    ({"base_commit": "not-a-ref"}, "base_commit: not-a-ref is not a commit of "),
    ({"test_patch": BROKEN_PATCH}, "test_patch does not apply"),
    ({"patch": BROKEN_PATCH}, r"patch \(the gold fix\) does not apply"),
    ({"log_parser": "parse_log_jest"}, "log_parser: unknown parser"),
])
def test_a_bad_row_names_file_line_instance_and_field(tmp_path, repos_root: str, change: dict, field_message: str) -> None:
    other = _row(instance_id="mathkit-dev__mathkit-16")
    path = _write(tmp_path, [other, "", _row(**change)])  # the bad row is on line 3
    with pytest.raises(SWEBenchError, match=f"^{tmp_path}/rows.jsonl:3: {IID}: {field_message}"):
        load_swebench(path, SWEBenchConfig(repos_root=repos_root))


def test_a_row_missing_test_patch_is_not_taken_for_something_else(tmp_path, repos_root: str) -> None:
    path = _write(tmp_path, [_row(test_patch=None)])
    with pytest.raises(SWEBenchError, match=f"rows.jsonl:1: {IID}: test_patch: missing or empty"):
        load_tasks(path, swebench=SWEBenchConfig(repos_root=repos_root))


@pytest.mark.parametrize("text, line", [('{"instance_id": "a"}\n{"instance_id": \n{}\n', 2),
                                        ('\n\n{"instance_id": "a"}\n\n{broken\n', 5)])
def test_a_broken_jsonl_line_is_reported_at_its_line(tmp_path, text: str, line: int) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(text)
    with pytest.raises(SWEBenchError, match=f"rows.jsonl:{line}: not valid JSON"):
        read_rows(str(path))


def test_a_broken_json_file_is_reported_at_its_line(tmp_path) -> None:
    path = tmp_path / "rows.json"
    path.write_text('[\n  {"instance_id": "a"},\n  {"instance_id": }\n]\n')
    with pytest.raises(SWEBenchError, match="rows.json:3: not valid JSON"):
        read_rows(str(path))


def test_rows_given_as_objects_are_named_by_index(repos_root: str) -> None:
    with pytest.raises(SWEBenchError, match=f"^row 1: {IID}: FAIL_TO_PASS: empty"):
        load_swebench([_row(), _row(FAIL_TO_PASS=[])], SWEBenchConfig(repos_root=repos_root))


def test_specs_layer_repository_version_instance_and_row(tmp_path, repos_root: str) -> None:
    specs = {"mathkit-dev/mathkit": {"python": "/envs/a/bin/python", "setup": ["echo repo"]},
             "mathkit-dev/mathkit@0.3": {"test_command": "{python} -m pytest -rA -x {test_files}", "setup": ["echo v"]},
             IID: {"log_parser": "parse_log_pytest_v2"}}
    path = tmp_path / "specs.yaml"
    path.write_text(json.dumps(specs))  # JSON is YAML
    cfg = SWEBenchConfig(repos_root=repos_root, setup=("echo all",), specs=load_specs(str(path)))
    task = row_to_task(_row(), cfg)
    assert task.setup == ("echo all", "echo repo", "echo v")
    assert "( /envs/a/bin/python -m pytest -rA -x tests/" in task.check.command
    assert (task.origin["log_parser"], task.runtime.python) == ("parse_log_pytest_v2", "/envs/a/bin/python")
    own = row_to_task(_row(python="/envs/b/bin/python", log_parser="parse_log_pytest_options"), cfg)
    assert (own.origin["log_parser"], own.runtime.python) == ("parse_log_pytest_options", "/envs/b/bin/python")


@pytest.mark.parametrize("spec, message", [
    ({"pyhton": "x"}, r"specs\['r/r'\]: unknown field\(s\) \['pyhton'\]"),
    ({"setup": "pip install ."}, r"specs\['r/r'\].setup: expected a list of strings"),
    ({"test_command": "pytest"}, r"specs\['r/r'\].test_command: expected a template with \{test_files\}"),
    ({"log_parser": "nope"}, "log_parser: unknown parser 'nope'"),
])
def test_a_bad_spec_is_a_value_error_naming_the_field(spec: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SWEBenchConfig(use_images=True, specs={"r/r": spec})


def test_generated_files_come_from_the_work_tree_at_base_commit(repos_root: str) -> None:
    checkout = os.path.join(repos_root, "mathkit-dev__mathkit")
    with open(os.path.join(checkout, "mathkit", "_version.py"), "w") as fh:  # what an install step writes
        fh.write("version = '0.3'\n")
    try:
        cfg = SWEBenchConfig(repos_root=repos_root, specs={"mathkit-dev/mathkit": {"generated_files": ["mathkit/_version.py"]}})
        task = row_to_task(_row(), cfg)
        assert task.files["mathkit/_version.py"] == "version = '0.3'\n"
        assert "mathkit/_version.py" not in row_to_task(_row(), SWEBenchConfig(repos_root=repos_root)).files
        head = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        with pytest.raises(SWEBenchError, match=f"{IID}: the checkout .* is at {head[:12]}, not at base_commit"):
            _not_at_base(cfg)
    finally:
        os.remove(os.path.join(checkout, "mathkit", "_version.py"))


def _not_at_base(cfg: SWEBenchConfig) -> None:
    """A row whose base_commit is a commit of the checkout other than its HEAD."""
    checkout = os.path.join(cfg.repos_root, "mathkit-dev__mathkit")
    env = {"PATH": os.environ["PATH"], "HOME": checkout, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t.invalid"}
    tree = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD^{tree}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    other = subprocess.run(["git", "-C", checkout, "commit-tree", tree, "-m", "same tree, another commit"],
                           capture_output=True, text=True, check=True, env=env).stdout.strip()
    row_to_task(_row(base_commit=other), cfg)


def test_the_verdict_lists_missing_and_failing_required_tests(repos_root: str) -> None:
    if local_unavailable():
        pytest.skip(local_unavailable())
    row = _row(FAIL_TO_PASS=json.dumps(["tests/test_stats.py::test_median_even", "tests/test_stats.py::test_gone[a"]))
    gold = run_task(row_to_task(row, SWEBenchConfig(repos_root=repos_root, python="python3")), GoldPolicy(), "local")
    assert not gold["success"] and gold["sandbox_error"] is None, gold
    assert gold["info"]["test_summary"] == "Tests: 6 passed, 1 failed.\nFAILED tests/test_stats.py::test_gone[a", gold
