"""Grading parity: on the same test log, compactrl's verdict equals the ``swebench`` package's own
(``swebench.harness.grading`` with the repository's parser from ``MAP_REPO_TO_PARSER_PY``).

``real_logs/`` holds gold and no-op test logs of real SWE-bench rows, written by
``benchmarks/swebench_real.py`` from runs on the local sandbox (small ones, committed), with each row's
repository, FAIL_TO_PASS, PASS_TO_PASS and the test command's exit status in ``cases.json``: gold must
be resolved and no-op not, by both graders."""

from __future__ import annotations

import json
import os

import pytest
from loader_helpers import FIXTURES

from compactrl.tasksets.swebench import grading
from compactrl.tasksets.swebench.parity import ours, parity, split_graded_output

swebench = pytest.importorskip("swebench", reason="the parity oracle is the swebench package (compactrl[test])")

pytestmark = pytest.mark.timeout(120)

REAL = os.path.join(FIXTURES, "swebench", "real_logs")
LOGS = os.path.join(FIXTURES, "swebench", "logs")


def _cases() -> list[dict]:
    path = os.path.join(REAL, "cases.json")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c['instance_id']}.{c['run']}")
def test_real_logs_get_the_harness_verdict(case) -> None:
    with open(os.path.join(REAL, case["log"]), encoding="utf-8") as fh:
        log = fh.read()
    got = parity(case["repo"], log, case["FAIL_TO_PASS"], case["PASS_TO_PASS"], case.get("exit_code"))
    assert got["equal"], got
    assert got["ours"] is (case["run"] == "gold")  # gold resolved, no-op not, by both graders


def test_there_are_real_logs_from_several_repositories() -> None:
    repos = {c["repo"] for c in _cases()}
    assert len(repos) >= 5, repos


@pytest.mark.parametrize(("name", "repo"), [
    ("django_runtests.log", "django/django"), ("sympy_bin_test.log", "sympy/sympy"),
    ("pytest_rA.log", "pytest-dev/pytest"), ("pytest_rA.log", "psf/requests"), ("pytest_rA.log", "pylint-dev/pylint"),
    ("pytest_rA_color.log", "sphinx-doc/sphinx"), ("pytest_rA_color.log", "astropy/astropy"),
    ("pytest_rA_v.log", "scikit-learn/scikit-learn"), ("pytest_rA.log", "mwaskom/seaborn"),
    ("pytest_rA.log", "matplotlib/matplotlib"), ("pytest_rA.log", "pydata/xarray"),
])
def test_every_lite_repository_parses_as_the_package_parses(name, repo) -> None:
    from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY

    with open(os.path.join(LOGS, name), encoding="utf-8") as fh:
        log = fh.read()
    assert grading.parse_log(repo, log) == MAP_REPO_TO_PARSER_PY[repo](log, None)


def test_a_nonzero_exit_with_no_failing_test_is_not_resolved_by_either() -> None:
    """A patch can print its own PASSED lines: the harness cross-checks the test command's exit status."""
    log = "PASSED tests/test_a.py::test_x\nPASSED tests/test_a.py::test_y\n"
    f2p, p2p = ["tests/test_a.py::test_x"], ["tests/test_a.py::test_y"]
    assert parity("pytest-dev/pytest", log, f2p, p2p, exit_code=0) == {"ours": True, "oracle": True, "equal": True}
    assert parity("pytest-dev/pytest", log, f2p, p2p, exit_code=1) == {"ours": False, "oracle": False, "equal": True}
    verdict = grading.grade(grading.parse_log("pytest-dev/pytest", log), f2p, p2p, exit_code=1)
    assert "invalid run: the test command exited 1" in grading.verdict_text(verdict)


def test_skipped_and_missing_tests_are_judged_alike() -> None:
    log = "SKIPPED tests/t.py::f2p\nSKIPPED tests/t.py::p2p\n"
    assert parity("pytest-dev/pytest", log, ["tests/t.py::f2p"], ["tests/t.py::p2p"]) == {
        "ours": False, "oracle": False, "equal": True}  # a skipped FAIL_TO_PASS is no resolution
    log = "PASSED tests/t.py::f2p\nSKIPPED tests/t.py::p2p\n"
    assert parity("pytest-dev/pytest", log, ["tests/t.py::f2p"], ["tests/t.py::p2p"])["ours"] is True
    assert ours("pytest-dev/pytest", "PASSED tests/t.py::f2p\n", ["tests/t.py::f2p"], ["tests/t.py::gone"]) is False


def test_the_graded_output_splits_back_into_the_log() -> None:
    verdict = grading.grade({"a": "PASSED"}, ["a"], [])
    out = "line 1\n" + "=" * 5 + " short test summary info " + "=" * 5 + "\nPASSED a\n" + grading.verdict_text(verdict)
    assert split_graded_output(out) == "line 1\n=====" + " short test summary info " + "=====\nPASSED a"
