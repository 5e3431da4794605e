"""Terminal-Bench verdicts read as the official graders read them: terminal-bench 1.x's pytest parser
and harness rule, Harbor's reward files. Each case states the verdict the graders give; where an
interpreter with the official ``terminal-bench`` and ``harbor`` packages is at hand
(``COMPACTRL_TB_ORACLE_PYTHON``, e.g. a Python 3.12 venv), their verdicts on the same outputs are
compared too (benchmarks/terminal_bench_oracle.py)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from compactrl.sandbox.tb_verdict import (
    REWARD_BEGIN,
    REWARD_END,
    harbor_verdict,
    reward_blocks,
    tbench_verdict,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ORACLE = os.environ.get("COMPACTRL_TB_ORACLE_PYTHON") or "/work/data/tb/oracle/bin/python"

HEAD = "============================= test session starts ==============================\n"
SUMMARY = "=========================== short test summary info ============================\n"
TBENCH = [  # (id, output, timed_out, resolved)
    ("all-pass", HEAD + SUMMARY + "PASSED tests/test_outputs.py::test_a\nPASSED tests/test_outputs.py::test_b\n"
     "============================== 2 passed in 0.01s ===============================\n", False, True),
    ("one-fails", SUMMARY + "PASSED t.py::test_a\nFAILED t.py::test_b - assert 1 == 2 - really\n", False, False),
    ("skipped-and-xfail-pass", SUMMARY + "PASSED t.py::test_a\nSKIPPED [1] t.py:3: no gpu\nXFAIL t.py::test_c\n", False, True),
    ("xpass-fails", SUMMARY + "PASSED t.py::test_a\nXPASS t.py::test_c\n", False, False),
    ("error-fails", SUMMARY + "ERROR t.py::test_a - fixture 'x' not found\n", False, False),
    ("no-summary", HEAD + "collected 0 items / 1 error\nImportError while importing test module\n", False, False),
    ("timed-out", SUMMARY + "PASSED t.py::test_a\n", True, False),
    ("empty-summary", SUMMARY + "============================== 1 passed ==============================\n", False, True),
    ("first-header-counts", SUMMARY + "FAILED a.py::test_x\n" + SUMMARY + "PASSED a.py::test_x\n", False, True),
    ("exit-code-ignored", SUMMARY + "PASSED t.py::test_a\nbash: line 9: cleanup: command not found\n", False, True),
    ("same-name-other-file", SUMMARY + "FAILED a.py::test_x\nPASSED b.py::test_x\n", False, True),
    ("status-with-colon", SUMMARY + "FAILED: t.py::test_a\n", False, False),
]


def _blocks(files: dict[str, str]) -> str:
    return "".join(f"\n{REWARD_BEGIN} {name}\n{text}\n{REWARD_END}\n" for name, text in files.items())


HARBOR = [  # (id, files, timed_out, resolved)
    ("txt-one", {"reward.txt": "1\n"}, False, True),
    ("txt-float-one", {"reward.txt": "1.0"}, False, True),
    ("txt-zero", {"reward.txt": "0"}, False, False),
    ("txt-partial", {"reward.txt": "0.5"}, False, False),
    ("txt-empty", {"reward.txt": ""}, False, False),
    ("txt-garbage", {"reward.txt": "PASS"}, False, False),
    ("txt-nan", {"reward.txt": "nan"}, False, False),
    ("json-one", {"reward.json": '{"reward": 1}'}, False, True),
    ("json-wins-over-txt", {"reward.json": '{"reward": 0}', "reward.txt": "1"}, False, False),
    ("json-string", {"reward.json": '{"reward": "1"}'}, False, False),
    ("json-bad", {"reward.json": "{reward: 1"}, False, False),
    ("none", {}, False, False),
    ("timed-out", {"reward.txt": "1"}, True, False),
]


@pytest.mark.parametrize("case", TBENCH, ids=[c[0] for c in TBENCH])
def test_tbench_1x_verdicts(case) -> None:
    _, output, timed_out, resolved = case
    assert tbench_verdict(output, timed_out)[0] is resolved


@pytest.mark.parametrize("case", HARBOR, ids=[c[0] for c in HARBOR])
def test_harbor_2x_verdicts(case) -> None:
    _, files, timed_out, resolved = case
    output = "tests ran\n" + _blocks(files)
    assert reward_blocks(output) == files
    assert harbor_verdict(output, timed_out)[0] is resolved


def test_the_last_printed_reward_block_counts() -> None:
    # an agent's program printing a fake block earlier cannot win: the check prints the real one last
    output = _blocks({"reward.txt": "1"}) + "more output\n" + _blocks({"reward.txt": "0"})
    assert harbor_verdict(output, False) == (False, "reward.txt: reward=0")


@pytest.mark.skipif(not os.path.isfile(ORACLE), reason=f"no interpreter with terminal-bench and harbor ({ORACLE})")
def test_same_verdicts_as_the_official_graders() -> None:
    cases = [{"id": c[0], "kind": "tbench", "output": c[1], "timed_out": c[2]} for c in TBENCH]
    cases += [{"id": c[0], "kind": "harbor", "files": c[1], "timed_out": c[2]} for c in HARBOR]
    res = subprocess.run([ORACLE, os.path.join(ROOT, "benchmarks", "terminal_bench_oracle.py")],
                         input="".join(json.dumps(c) + "\n" for c in cases), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    official = {r["id"] + ":" + k: r["resolved"] for k, r in zip([c["kind"] for c in cases],
                                                                  map(json.loads, res.stdout.splitlines()))}
    ours = {f"{c[0]}:tbench": c[3] for c in TBENCH} | {f"{c[0]}:harbor": c[3] for c in HARBOR}
    assert official == ours


def test_a_summary_without_test_ids_says_why() -> None:
    from compactrl.envs.code_env import format_report
    from compactrl.sandbox.base import TestReport

    report = TestReport(passed=(), failed=(), output="", success=False, exit_code=0,
                        log_tail="expected 4, got None\n[verdict: failure: reward.txt: reward=0]")
    assert format_report(report) == ("Tests: 0 passed, 0 failed.\n(no test ids in the output: exit code 0; "
                                     "[verdict: failure: reward.txt: reward=0])")
