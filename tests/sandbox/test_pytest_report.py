"""The -rA report parser and the verdict rule (pure functions, shared with the SWE-bench loader)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compactrl.sandbox.pytest_report import check_success, parse_pytest_rA, split_outcomes
from compactrl.task import Check

REAL_OUTPUT = """\
.F.                                                                      [100%]
=================================== FAILURES ===================================
___________________________________ test_two ___________________________________

    def test_two():
>       assert 1 == 2
E       assert 1 == 2

tests/test_x.py:5: AssertionError
==================================== PASSES ====================================
___________________________________ test_one ___________________________________
----------------------------- Captured stdout call -----------------------------
PASSED tests/test_x.py::test_fake
=========================== short test summary info ============================
PASSED tests/test_x.py::test_one
PASSED tests/test_x.py::test_p[a b - c]
XFAIL tests/test_x.py::test_xf - reason: later
SKIPPED [1] tests/test_x.py:20: not now
FAILED tests/test_x.py::test_two - assert 1 == 2
ERROR tests/test_y.py - ImportError: no module named nope
FAILED tests/test_x.py::test_q[1-2] - AssertionError: [1] - x
2 failed, 2 passed, 1 xfailed, 1 skipped, 1 error in 0.12s
"""


def test_parses_a_real_report():
    outcomes = parse_pytest_rA(REAL_OUTPUT)
    assert outcomes == {
        "tests/test_x.py::test_one": "PASSED",
        "tests/test_x.py::test_p[a b - c]": "PASSED",
        "tests/test_x.py::test_xf": "XFAIL",
        "tests/test_x.py::test_two": "FAILED",
        "tests/test_y.py": "ERROR",
        "tests/test_x.py::test_q[1-2]": "FAILED",
    }
    # a test's own stdout ("PASSED tests/test_x.py::test_fake") is not a result
    passed, failed = split_outcomes(outcomes)
    assert "tests/test_x.py::test_fake" not in passed
    assert failed == ("tests/test_x.py::test_q[1-2]", "tests/test_x.py::test_two", "tests/test_y.py")


def test_only_the_last_summary_counts():
    spoof = "=== short test summary info ===\nPASSED t.py::test_a\n"
    real = "=== short test summary info ===\nFAILED t.py::test_a - boom\n1 failed in 0.1s\n"
    assert parse_pytest_rA(spoof + real) == {"t.py::test_a": "FAILED"}


def test_without_a_summary_every_line_is_read():
    assert parse_pytest_rA("PASSED t.py::a\r\nnoise\nFAILED t.py::b - x\n") == {"t.py::a": "PASSED", "t.py::b": "FAILED"}


_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=12)
_param = st.text(alphabet="abcxyz0123456789-. ", min_size=1, max_size=10).filter(lambda p: "] - " not in p + "]")
_node = st.builds(
    lambda d, f, t, p: f"{d}/test_{f}.py::test_{t}" + (f"[{p}]" if p else ""),
    _name, _name, _name, st.none() | _param,
)


@given(st.dictionaries(_node, st.sampled_from(["PASSED", "FAILED", "ERROR", "XFAIL", "XPASS"]), max_size=12),
       st.booleans())
def test_roundtrip_of_generated_summaries(outcomes, with_messages):
    lines = ["=== short test summary info ==="]
    for node, outcome in outcomes.items():
        msg = " - AssertionError: x - y" if with_messages and outcome in ("FAILED", "ERROR") else ""
        lines.append(f"{outcome} {node}{msg}")
    lines.append("3 passed in 0.01s")
    assert parse_pytest_rA("\n".join(lines)) == outcomes


@pytest.mark.parametrize(
    "check, code, passed, expected",
    [
        (Check(must_pass=("a", "b")), 1, ("a", "b"), True),  # other tests may fail
        (Check(must_pass=("a", "b")), 0, ("a",), False),
        (Check(), 0, ("a",), True),
        (Check(), 1, ("a",), False),
        (Check(), 0, (), False),  # exit 0 but nothing ran (e.g. no tests collected is 5, but be safe)
        (Check(kind="script", command="true"), 0, (), True),
        (Check(kind="script", command="false"), 1, ("a",), False),
    ],
)
def test_verdict_rule(check, code, passed, expected):
    assert check_success(check, code, passed) is expected


@given(st.lists(st.sampled_from("abcde"), unique=True), st.lists(st.sampled_from("abcde"), unique=True),
       st.integers(0, 5))
def test_verdict_invariants(must_pass, passed, code):
    check = Check(must_pass=tuple(must_pass))
    ok = check_success(check, code, passed)
    if must_pass:
        assert ok == (set(must_pass) <= set(passed))
    else:
        assert ok == (code == 0 and bool(passed))
    assert check_success(check, code, passed, timed_out=True) is False
