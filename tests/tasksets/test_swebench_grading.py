"""Grading parity with the official SWE-bench harness: compactrl's log parsers and verdict against
``swebench``'s own (the oracle, a test dependency) on recorded logs in ``tests/fixtures/swebench/logs``.

``pytest_rA*.log`` are real pytest 9 runs (``-rA``; ``-rA -v``; ``-rA -v --color=yes``) of
``test_ids.py.txt`` (ids with spaces, `` - `` inside ids and messages, absolute-path, glob and
``//`` parameters, matplotlib's ``MouseButton`` ids, an error, an xfail, a skip, a stdout line that
looks like a result), with the run's directory written as ``/testbed``. ``django_runtests.log``,
``sympy_bin_test.log`` and ``pytest_old_verbose.log`` are written in the output formats of
django's ``runtests.py --verbosity 2``, sympy's ``bin/test --verbose`` and pytest 3's ``-v``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from loader_helpers import FIXTURES

from compactrl.tasksets.swebench import grading

swebench_parsers = pytest.importorskip("swebench.harness.log_parsers.python")
swebench_grading = pytest.importorskip("swebench.harness.grading")
from swebench.harness.log_parsers import PARSER_REGISTRY  # noqa: E402

LOGS = os.path.join(FIXTURES, "swebench", "logs")
LOG_NAMES = sorted(n for n in os.listdir(LOGS) if n.endswith(".log"))
REPOS = sorted(swebench_parsers.MAP_REPO_TO_PARSER_PY)


def _log(name: str) -> str:
    with open(os.path.join(LOGS, name), encoding="utf-8") as fh:
        return fh.read()


def test_the_repository_map_is_the_harness_map() -> None:
    assert sorted(grading.PARSER_BY_REPO) == REPOS
    for repo in REPOS:
        assert swebench_parsers.MAP_REPO_TO_PARSER_PY[repo] is PARSER_REGISTRY[grading.PARSER_BY_REPO[repo]], repo


@pytest.mark.parametrize("log_name", LOG_NAMES)
@pytest.mark.parametrize("parser", sorted(grading.PARSERS))
def test_every_parser_records_what_the_harness_records(parser: str, log_name: str) -> None:
    log = _log(log_name)
    assert grading.PARSERS[parser](log) == PARSER_REGISTRY[parser](log, None)


@pytest.mark.parametrize("repo", REPOS)
def test_parse_log_by_repository_matches_the_harness(repo: str) -> None:
    for name in LOG_NAMES:
        log = _log(name)
        assert grading.parse_log(repo, log) == swebench_parsers.MAP_REPO_TO_PARSER_PY[repo](log, None), name


def test_the_normalisations_the_harness_makes() -> None:
    """What made compactrl's full node ids miss: the harness's ids, spelled out."""
    log = _log("pytest_rA.log")
    plain = grading.parse_log("pylint-dev/astroid", log)
    assert plain["tests/test_ids.py::test_words[a"] == "PASSED"  # cut at the first space
    assert "tests/test_ids.py::test_words[a b]" not in plain
    options = grading.parse_log("psf/requests", log)
    assert options["tests/test_ids.py::test_paths[/data]"] == "PASSED"  # an absolute path -> its base name
    assert options["tests/test_ids.py::test_paths[/usr/lib/*.so]"] == "PASSED"  # globs and // are kept
    assert options["tests/test_ids.py::test_paths[//server/share]"] == "PASSED"
    whole = grading.parse_log("sphinx-doc/sphinx", log)
    assert whole["tests/test_ids.py::test_words[a b]"] == "PASSED"  # the whole id
    assert whole["tests/test_ids.py::test_words[x"] == "FAILED"  # a FAILED line ends at its first " - "
    assert plain["tests/test_ids.py::test_fake_from_stdout"] == "PASSED"  # a stdout line counts, as upstream
    django = grading.parse_log("django/django", _log("django_runtests.log"))
    assert django["test_combine_and_empty (queries.test_q.QTests)"] == "FAILED"
    assert django["test_reconstruct (queries.test_q.QTests)"] == "PASSED"
    sympy = grading.parse_log("sympy/sympy", _log("sympy_bin_test.log"))
    assert (sympy["test__aresame"], sympy["test_equality"]) == ("PASSED", "FAILED")
    # a result line closing its file ("... E   [FAIL]") is not read; the failure's header is
    assert "test_matches_basic" not in sympy
    assert sympy["sympy/core/tests/test_basic.py:test_matches_basic"] == "FAILED"


def _harness_verdict(status_map: dict, f2p: list, p2p: list) -> dict:
    report = swebench_grading.get_eval_tests_report(status_map, {"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
    status = swebench_grading.get_resolution_status(report)
    return {"resolved": status == swebench_grading.ResolvedStatus.FULL.value,
            "failures": sorted(report["FAIL_TO_PASS"]["failure"] + report["PASS_TO_PASS"]["failure"])}


@pytest.mark.parametrize("log_name", LOG_NAMES)
@pytest.mark.parametrize("repo", REPOS)
def test_verdicts_match_the_harness(repo: str, log_name: str) -> None:
    status_map = grading.parse_log(repo, _log(log_name))
    ids = sorted(status_map)
    by_status = {s: [t for t in ids if status_map[t] == s] for s in grading.STATUSES}
    cases = [
        (by_status["PASSED"][:3], by_status["PASSED"][3:]),  # resolvable when they all pass
        (by_status["PASSED"][:1] + by_status["XFAIL"], by_status["SKIPPED"]),  # XFAIL passes, P2P may skip
        (by_status["SKIPPED"] or ["a::missing"], by_status["PASSED"]),  # a skipped FAIL_TO_PASS fails
        (by_status["PASSED"][:1], by_status["FAILED"] + by_status["ERROR"]),
        (by_status["PASSED"][:1] + ["tests/not_run.py::test_x"], []),  # missing
        ([t[: t.index("[") + 2] for t in ids if "[" in t][:2] or ["x::y"], []),  # truncated ids (prefix)
    ]
    for f2p, p2p in cases:
        mine = grading.grade(status_map, f2p, p2p)
        expected = _harness_verdict(status_map, f2p, p2p)
        assert mine["resolved"] == expected["resolved"], (f2p, p2p)
        assert sorted(mine["failing"] + mine["missing"]) == expected["failures"], (f2p, p2p)
        assert set(mine["passed"]) | set(expected["failures"]) == set(f2p + p2p)


def test_the_verdict_lists_missing_and_failing_required_ids() -> None:
    status_map = grading.parse_log("pylint-dev/astroid", _log("pytest_rA.log"))
    verdict = grading.grade(status_map, ["tests/test_ids.py::test_fails", "tests/test_ids.py::test_gone"],
                            ["tests/test_ids.py::TestGroup::test_method"])
    assert verdict == {"resolved": False, "passed": ["tests/test_ids.py::TestGroup::test_method"],
                       "failing": ["tests/test_ids.py::test_fails"], "missing": ["tests/test_ids.py::test_gone"]}
    text = grading.verdict_text(verdict)
    assert "SWE-bench verdict: not resolved" in text
    assert "failing: tests/test_ids.py::test_fails\nmissing: tests/test_ids.py::test_gone" in text


def test_the_grading_script_runs_standalone(tmp_path) -> None:
    """As the sandbox runs it: a file of its own, the standard library only, exit 0 iff resolved."""
    script = tmp_path / "grade.py"
    script.write_text(open(grading.__file__, encoding="utf-8").read())
    log = tmp_path / "test.log"
    log.write_text(_log("pytest_rA.log"))
    spec = tmp_path / "spec.json"
    for f2p, rc in ((["tests/test_ids.py::test_paths[/data]"], 0), (["tests/test_ids.py::test_fails"], 1)):
        spec.write_text(json.dumps({"repo": "pydicom/pydicom", "log_parser": None, "FAIL_TO_PASS": f2p,
                                    "PASS_TO_PASS": ["tests/test_ids.py::test_known_bug"]}))
        res = subprocess.run([sys.executable, "-I", str(script), str(spec), str(log)], capture_output=True, text=True,
                             cwd=tmp_path, timeout=60)
        assert res.returncode == rc, res.stderr
        assert res.stdout.startswith(_log("pytest_rA.log").rstrip("\n"))  # the log first, then the verdict
        assert ("SWE-bench verdict: resolved" in res.stdout) == (rc == 0)


def test_an_unknown_parser_is_an_error() -> None:
    with pytest.raises(ValueError, match="log_parser: unknown parser 'parse_log_jest'"):
        grading.parser_name("psf/requests", "parse_log_jest")
    assert grading.parser_name("someone/new") == "parse_log_pytest"
