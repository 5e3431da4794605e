"""Pure functions that turn pytest's ``-rA`` report into a verdict.

Shared by every backend that runs real tests (local, docker) and by the SWE-bench loader, so a
test id means the same thing everywhere: the node id exactly as pytest prints it in the
"short test summary info" section (``tests/test_x.py::test_a[1-2]``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from compactrl.task import Check

# Outcomes as pytest prints them at the start of a summary line.
PASS_OUTCOMES = frozenset({"PASSED", "XFAIL", "XPASS"})
FAIL_OUTCOMES = frozenset({"FAILED", "ERROR"})
_OUTCOMES = PASS_OUTCOMES | FAIL_OUTCOMES | {"SKIPPED"}

_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+\s*$", re.MULTILINE)
_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (.+)$")
# The closing line ("=== 3 passed, 1 failed in 0.12s ===") or "-q"'s bare "3 passed in 0.1s".
_FINAL = re.compile(r"^=*\s*\d+ (passed|failed|error|errors|skipped|xfailed|xpassed|deselected)\b")


def _node_id(rest: str) -> str:
    """The node id of a summary line's remainder (``id`` or ``id - message``).

    Parametrised ids may hold spaces, so an id with brackets runs to the first ``] - `` (the start
    of a message) or to the end of the line; other ids end at the first space.
    """
    if "[" in rest.split(" ", 1)[0]:
        close = rest.find("] - ")
        if close >= 0:
            return rest[: close + 1]
        return rest
    return rest.split(" ", 1)[0]


def parse_pytest_rA(output: str) -> dict[str, str]:
    """Map each test id in a ``pytest -rA`` run's output to its outcome (``PASSED``, ``FAILED``...).

    Only the *last* "short test summary info" section is read, so lines a test prints to stdout
    cannot pose as results; if the section is missing (output clipped, older pytest) every line is
    read. A test listed twice keeps its last outcome. ``SKIPPED`` lines carry a location, not an id,
    and are ignored.
    """
    headers = list(_SUMMARY_HEADER.finditer(output))
    text = output[headers[-1].end() :] if headers else output
    outcomes: dict[str, str] = {}
    for line in text.splitlines():
        line = line.rstrip("\r")
        if headers and _FINAL.match(line):
            break
        m = _LINE.match(line)
        if m is None or m.group(1) == "SKIPPED":
            continue
        node = _node_id(m.group(2).strip())
        if node:
            outcomes[node] = m.group(1)
    return outcomes


def split_outcomes(outcomes: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(passed, failed)`` test ids, each sorted. XFAIL/XPASS count as passed (pytest exits 0)."""
    passed = sorted(t for t, o in outcomes.items() if o in PASS_OUTCOMES)
    failed = sorted(t for t, o in outcomes.items() if o in FAIL_OUTCOMES)
    return tuple(passed), tuple(failed)


def check_success(check: Check, exit_code: int, passed: Iterable[str], timed_out: bool = False) -> bool:
    """The task's verdict from one run of its check.

    ``kind="script"``: exit code 0. ``kind="pytest"``: every id in ``must_pass`` passed, or, when
    ``must_pass`` is empty, the run exited 0 and at least one test passed. A timed-out run fails.
    """
    if timed_out:
        return False
    if check.kind == "script":
        return exit_code == 0
    passed_set = set(passed)
    if check.must_pass:
        return all(t in passed_set for t in check.must_pass)
    return exit_code == 0 and bool(passed_set)
