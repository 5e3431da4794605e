"""Terminal-Bench verdicts read as the official harnesses read them (pure functions of the output).

* **1.x** (``Check.kind="tbench"``): terminal-bench's ``pytest`` parser reads the test run's output
  from the *first* "short test summary info" header on: each following line whose first word
  (a trailing ``:`` dropped) is a pytest outcome gives one result, keyed by what follows the first
  ``::`` of its path (a ``FAILED`` line loses its last `` - message``). ``PASSED``, ``SKIPPED`` and
  ``XFAIL`` count as passed; ``FAILED``, ``ERROR`` and ``XPASS`` as failed. No header is a parse
  error, which fails the task. The task is resolved iff the parse succeeded and every result passed
  (the harness does not look at the exit code; an empty result set counts as resolved, as there).
  A run past the test timeout is unresolved.
* **2.x / Harbor** (``Check.kind="harbor"``): the verifier script writes
  ``/logs/verifier/reward.json`` (a JSON object of named rewards, or one number) or
  ``/logs/verifier/reward.txt`` (one number); Harbor reads the JSON file when it exists, else the
  text file; an empty file, a non-number or a non-finite value is an error; no file is an error.
  The check command prints each file it finds between :data:`REWARD_BEGIN` and :data:`REWARD_END`
  lines; the last block of each name counts. The trial succeeds iff every reward is 1 or more (Harbor's
  pass@k counts a single 0/1 reward equal to 1). A verifier past its timeout has no reward.
"""

from __future__ import annotations

import json
import math
import re

REWARD_BEGIN = "__compactrl_tb_reward_begin__"
REWARD_END = "__compactrl_tb_reward_end__"
_SUMMARY = re.compile(r"=+\s*short test summary info\s*=+", re.IGNORECASE)
_PASSED = {"PASSED", "SKIPPED", "XFAIL"}
_FAILED = {"FAILED", "ERROR", "XPASS"}


def tbench_pytest_results(output: str) -> dict[str, bool] | None:
    """terminal-bench 1.x's ``pytest`` parser: ``{test name: passed?}``, or None (no summary header)."""
    parts = _SUMMARY.split(output, maxsplit=1)
    if len(parts) < 2:
        return None
    results: dict[str, bool] = {}
    for line in parts[1].splitlines():
        if line.startswith("FAILED"):
            pieces = line.split(" - ")
            if len(pieces) > 1:
                line = " - ".join(pieces[:-1])
        words = line.split(maxsplit=1)
        if len(words) <= 1:
            continue
        status = words[0].strip().strip(":")
        if status not in _PASSED and status not in _FAILED:
            continue
        name = words[1].strip().split("::", 1)[-1]
        if name:
            results[name] = status in _PASSED
    return results


def tbench_verdict(output: str, timed_out: bool) -> tuple[bool, str]:
    """``(resolved, why)`` of a 1.x test run, as the harness decides it."""
    if timed_out:
        return False, "the tests ran past max_test_timeout_sec (the harness's TEST_TIMEOUT)"
    results = tbench_pytest_results(output)
    if results is None:
        return False, "no 'short test summary info' in the test output (the harness's PARSE_ERROR)"
    failed = sorted(n for n, ok in results.items() if not ok)
    if failed:
        return False, f"{len(failed)} of {len(results)} test results failed (parser: pytest)"
    if not results:
        return True, "resolved with an empty result list (a summary header with no result lines, as the harness counts it)"
    return True, f"all {len(results)} test results passed (parser: pytest)"


def reward_blocks(output: str) -> dict[str, str]:
    """The last printed content of each reward file (``reward.json``, ``reward.txt``) in ``output``."""
    found: dict[str, str] = {}
    pattern = re.compile(re.escape(REWARD_BEGIN) + r" (reward\.(?:json|txt))\n(.*?)\n?" + re.escape(REWARD_END),
                         re.DOTALL)
    for m in pattern.finditer(output):
        found[m.group(1)] = m.group(2)
    return found


def _number(value) -> float | None:
    if not isinstance(value, (int, float)):  # a JSON true is an int to Harbor's check too
        return None
    return float(value) if math.isfinite(value) else None


def harbor_rewards(files: dict[str, str]) -> tuple[dict[str, float] | None, str]:
    """Harbor's reading of the reward files: ``(rewards, where)``, or ``(None, the error)``."""
    if "reward.json" in files:
        text = files["reward.json"]
        if not text.strip():
            return None, "reward.json is empty"
        try:
            data = json.loads(text)
        except ValueError:
            return None, f"reward.json is not JSON: {text.strip()[:80]!r}"
        items = data.items() if isinstance(data, dict) else [("reward", data)]
        rewards = {}
        for key, value in items:
            number = _number(value)
            if number is None:
                return None, f"reward.json: non-numeric or non-finite reward {key}={value!r}"
            rewards[str(key)] = number
        return rewards, "reward.json"
    if "reward.txt" in files:
        text = files["reward.txt"]
        if not text.strip():
            return None, "reward.txt is empty"
        try:
            value = float(text)
        except ValueError:
            return None, f"reward.txt is not a number: {text.strip()[:80]!r}"
        if not math.isfinite(value):
            return None, f"reward.txt: non-finite reward {value!r}"
        return {"reward": value}, "reward.txt"
    return None, "no reward file: the verifier wrote neither /logs/verifier/reward.json nor reward.txt"


def harbor_verdict(output: str, timed_out: bool) -> tuple[bool, str]:
    """``(success, why)`` of a 2.x verifier run, as Harbor reads its rewards."""
    if timed_out:
        return False, "the verifier ran past verifier.timeout_sec (Harbor: VerifierTimeoutError, no reward)"
    rewards, where = harbor_rewards(reward_blocks(output))
    if rewards is None:
        return False, where
    shown = ", ".join(f"{k}={v:g}" for k, v in rewards.items()) or "(none)"
    success = bool(rewards) and all(v >= 1 for v in rewards.values())
    return success, f"{where}: {shown}"
