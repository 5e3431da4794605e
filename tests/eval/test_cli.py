"""`compactrl eval` on generated envs, and bad values anywhere on the command line: one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from compactrl.cli import main
from compactrl.tasksets.generators.code import PRESETS

pytestmark = pytest.mark.timeout(120)


def test_eval_prints_one_json_object_with_every_episode(tmp_path, capsys):
    out = tmp_path / "episodes.jsonl"
    code = main(["eval", "--policy", "oracle", "--episodes", "3", "--seed", "1", "--env-kwargs", '{"max_turns": 20}',
                 "--difficulty", "easy", "--split", "test", "--json", "--out", str(out)])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"]["success_rate"] == 1.0 and printed["summary"]["episodes"] == 3
    assert printed["config"]["env_kwargs"] == {"max_turns": 20, "difficulty": "easy", "split": "test"}
    assert [r["num_traces"] for r in printed["episodes"]] == [1, 1, 1]
    assert [json.loads(line) for line in out.read_text().splitlines()] == printed["episodes"]
    assert main(["eval", "--policy", "random", "--episodes", "2", "--difficulty", "tiny"]) == 0
    table = capsys.readouterr().out
    assert "success_rate" in table and "format_errors_per_episode" in table


@pytest.mark.parametrize("argv, option", [
    (["eval", "--difficulty", "bogus"], "--difficulty"),
    (["eval", "--split", "dev"], "--split"),
    (["eval", "--backend", "vm"], "--backend"),
    (["eval", "--policy", "nonsense"], "--policy"),
    (["eval", "--env-kwargs", "[1]"], "--env-kwargs"),
    (["eval", "--episodes", "0"], "--episodes"),
    (["eval", "--summary-quality", "2"], "--summary-quality"),
    (["eval", "--temperature", "-1"], "--temperature"),
    (["--log-level", "loud", "eval"], "--log-level"),
    (["bench", "no_such_benchmark"], "name"),
])
def test_a_bad_value_is_one_line_naming_the_option_with_exit_2(argv, option, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and option in captured.err and "Traceback" not in captured.err
    assert captured.err.startswith(f"compactrl{'' if argv[0].startswith('--') else ' ' + argv[0]}: error: ")


def test_a_bad_difficulty_in_a_real_process_lists_the_allowed_values():
    proc = subprocess.run([sys.executable, "-m", "compactrl.cli", "eval", "--difficulty", "bogus"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1
    assert all(f"'{name}'" in proc.stderr for name in PRESETS) and "tiny" in PRESETS


def test_a_config_value_error_from_the_env_is_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--episodes", "1", "--env-kwargs", '{"budget": 10}'])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("compactrl eval: error: ") and "budget" in err and err.count("\n") == 1


def test_help_lists_every_difficulty(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--help"])
    assert exc.value.code == 0
    help_text = capsys.readouterr().out
    assert all(name in help_text for name in PRESETS)
