"""Grading parity with the official harness: the verdict of :mod:`.swebench_grading` and the
``swebench`` package's own (``swebench.harness.grading``) on the same test log.

The oracle is the package's code, run as the harness runs it: the log framed by the eval script's
start/end markers and its test-exit-code line, parsed by ``MAP_REPO_TO_PARSER_PY[repo]`` through
``get_logs_eval``, reported by ``get_eval_tests_report`` and judged by ``get_resolution_status``
(resolved iff ``FULL``). The ``swebench`` package (``pip install 'swebench>=5'``, in compactrl's
``test`` extra) is needed only here; nothing of it runs when a task is graded.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

from compactrl.tasksets.swebench import grading

VERDICT_LINE = "=" * 20 + " short test summary info " + "=" * 20
"""The first line :func:`.swebench_grading.verdict_text` appends to the log it prints."""


def split_graded_output(output: str) -> str:
    """The test log of a graded run's output (what the grader printed before its own verdict). The
    sandbox shows control characters as U+FFFD; a U+FFFD before ``[`` is put back as the ESC of an
    ANSI colour code (pytest's ``--color``, the only control characters of these logs), which the
    parsers of astropy, scikit-learn and sphinx strip."""
    cut = output.rfind("\n" + VERDICT_LINE + "\n")
    log = output[:cut] if cut >= 0 else output
    return log.replace("\ufffd[", "\x1b[")


def ours(repo: str, log: str, fail_to_pass: Sequence[str], pass_to_pass: Sequence[str],
         exit_code: int | None = None, log_parser: str | None = None) -> bool:
    """compactrl's verdict on ``log`` (as the task's grading script decides it)."""
    status = grading.parse_log(repo, log, log_parser)
    return grading.grade(status, list(fail_to_pass), list(pass_to_pass), exit_code)["resolved"]


def oracle(repo: str, log: str, fail_to_pass: Sequence[str], pass_to_pass: Sequence[str],
           exit_code: int | None = None, instance_id: str = "x", version: str = "") -> dict[str, Any]:
    """The ``swebench`` package's verdict on ``log``: ``{"resolved", "status", "found", "report"}``."""
    from swebench.harness import grading as g
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, TEST_EXIT_CODE, EvalType
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.log_parsers.python import MAP_REPO_TO_PARSER_PY
    from swebench.types import TestSpec

    parser = MAP_REPO_TO_PARSER_PY.get(repo)
    name = next((n for n, f in PARSER_REGISTRY.items() if f is parser), "parse_log_pytest")
    spec = TestSpec(instance_id=instance_id, image="", eval_script_list=[], repo=repo, version=version,
                    FAIL_TO_PASS=list(fail_to_pass), PASS_TO_PASS=list(pass_to_pass), log_parser=name,
                    eval_type=EvalType.PASS_AND_FAIL.value)
    framed = f"+ : '{START_TEST_OUTPUT}'\n{log}\n+ : '{END_TEST_OUTPUT}'\n"
    if exit_code is not None:
        framed += f"{TEST_EXIT_CODE}: {exit_code}\n"
    fd, path = tempfile.mkstemp(prefix="compactrl-parity-", suffix=".log")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(framed)
        status_map, found = g.get_logs_eval(spec, path)
    finally:
        os.unlink(path)
    if not found:
        return {"resolved": False, "status": "NO", "found": False, "report": {}}
    report = g.get_eval_tests_report(status_map, {"FAIL_TO_PASS": list(fail_to_pass), "PASS_TO_PASS": list(pass_to_pass)})
    status = g.get_resolution_status(report)
    return {"resolved": status == "RESOLVED_FULL", "status": status, "found": True, "report": report}


def parity(repo: str, log: str, fail_to_pass: Sequence[str], pass_to_pass: Sequence[str],
           exit_code: int | None = None) -> dict[str, Any]:
    """Both verdicts on one log: ``{"ours", "oracle", "equal"}``."""
    mine = ours(repo, log, fail_to_pass, pass_to_pass, exit_code)
    theirs = oracle(repo, log, fail_to_pass, pass_to_pass, exit_code)["resolved"]
    return {"ours": mine, "oracle": theirs, "equal": mine == theirs}
