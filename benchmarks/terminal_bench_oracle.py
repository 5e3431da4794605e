"""The official graders' verdicts on test outputs, for parity checks (run with an interpreter that has
``terminal-bench`` and ``harbor`` installed, e.g. a Python 3.12 venv: both need >= 3.12).

Reads JSON lines ``{"id", "kind": "tbench" | "harbor", "timed_out", "output" | "files"}`` on stdin and
writes ``{"id", "resolved", "detail"}`` lines:

* ``tbench``: terminal-bench's own ``PytestParser().parse(output)`` and the harness's rule (a parse
  error or a test timeout is unresolved, else every parsed result must be ``PASSED``);
* ``harbor``: Harbor's ``Verifier`` reading of the reward files (``reward.json`` when it exists, else
  ``reward.txt``; its own parse errors), and its pass@k rule (one reward equal to 1).

    /work/data/tb/oracle/bin/python benchmarks/terminal_bench_oracle.py < cases.jsonl
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace


def tbench(case: dict) -> tuple[bool, str]:
    from terminal_bench.parsers.base_parser import UnitTestStatus
    from terminal_bench.parsers.pytest_parser import PytestParser

    if case.get("timed_out"):
        return False, "test timeout"
    try:
        results = PytestParser().parse(case["output"])
    except Exception as e:  # the harness records PARSE_ERROR
        return False, f"parse error: {e}"
    return all(r == UnitTestStatus.PASSED for r in results.values()), f"{len(results)} results"


def harbor(case: dict) -> tuple[bool, str]:
    from harbor.verifier.verifier import Verifier

    if case.get("timed_out"):
        return False, "verifier timeout"
    with tempfile.TemporaryDirectory() as tmp:
        paths = SimpleNamespace(reward_json_path=Path(tmp, "reward.json"), reward_text_path=Path(tmp, "reward.txt"))
        for name, text in (case.get("files") or {}).items():
            Path(tmp, name).write_text(text)
        fake = SimpleNamespace(trial_paths=paths)
        try:
            if paths.reward_json_path.exists():
                rewards = Verifier._parse_reward_json(fake)
            elif paths.reward_text_path.exists():
                rewards = Verifier._parse_reward_text(fake)
            else:
                return False, "no reward file"
        except Exception as e:
            return False, f"{type(e).__name__}: {e}"
    values = list(rewards.values()) if isinstance(rewards, dict) else [rewards]
    return len(values) == 1 and values[0] == 1, f"rewards {rewards}"


def main() -> None:
    for line in sys.stdin:
        case = json.loads(line)
        resolved, detail = (tbench if case["kind"] == "tbench" else harbor)(case)
        print(json.dumps({"id": case.get("id"), "resolved": resolved, "detail": detail[:300]}), flush=True)


if __name__ == "__main__":
    main()
