"""The shell emulator on its own: documented behaviours, errors as observations, sessions, limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.shell_sim import SUPPORTED_COMMANDS, ShellEmulator, ShellResult, execute

pytestmark = pytest.mark.timeout(60)

TREE = {
    "logs/app.log": "INFO start\nERROR disk full\nINFO ok\nERROR timeout\n",
    "logs/db.log": "ERROR deadlock\n",
    "data/orders.csv": "id,region,amount\n1,east,10\n2,west,5\n3,east,7\n",
    "notes.txt": "no newline at end",
}


def run(cmd: str, files: dict[str, str] | None = None) -> ShellResult:
    return ShellEmulator(dict(TREE) if files is None else files).run(cmd)


@pytest.mark.parametrize("cmd, out", [
    ("grep -c ERROR logs/app.log", "2\n"),
    ("grep -h ERROR logs/*.log | sort", "ERROR deadlock\nERROR disk full\nERROR timeout\n"),
    ("cut -d, -f2 data/orders.csv | tail -n +2 | sort | uniq -c", "      2 east\n      1 west\n"),
    ("awk -F, 'NR>1 {s[$2]+=$3} END {for (k in s) print k, s[k]}' data/orders.csv | sort", "east 17\nwest 5\n"),
    ("sed -n '2,3p' logs/app.log", "ERROR disk full\nINFO ok\n"),
    ("wc -l < logs/app.log", "4\n"),
    ("cat notes.txt; echo", "no newline at end\n"),
    ("find . -name '*.log' | sort", "./logs/app.log\n./logs/db.log\n"),
    ("echo a b | tr a-z A-Z", "A B\n"),
    ("printf '%s=%03d\\n' x 7", "x=007\n"),
    ("X=4; echo $X ${X}y \"$X\"", "4 4y 4\n"),
    ("ls logs", "app.log\ndb.log\n"),
    ("test -f notes.txt && echo yes || echo no", "yes\n"),
    ("cat <<'EOF'\n$HOME stays\nEOF", "$HOME stays\n"),
])
def test_documented_commands(cmd: str, out: str) -> None:
    res = run(cmd)
    assert (res.output, res.exit_code) == (out, 0)


def test_errors_are_observations_with_bash_exit_codes() -> None:
    assert run("nosuchcmd x") == ShellResult("bash: line 1: nosuchcmd: command not found\n", 127)
    assert run("cat missing.txt").exit_code == 1
    assert run("cat missing.txt").output == "cat: missing.txt: No such file or directory\n"
    assert run("grep x missing.txt").exit_code == 2
    assert run("echo 'open").exit_code == 2
    assert "unexpected EOF" in run("echo 'open").output


def test_unsupported_constructs_say_so() -> None:
    for cmd in ("sleep 1 &", "a=(1 2)", "ls | tee >(wc -l)", "echo ${!x}", "ls |& cat"):
        res = run(cmd)
        assert res.exit_code == 2 and "sim-shell: unsupported" in res.output, cmd


def test_redirections_write_the_shared_files() -> None:
    files = dict(TREE)
    sh = ShellEmulator(files)
    assert sh.run("grep ERROR logs/*.log > errors.txt 2>/dev/null && wc -l errors.txt").output == "3 errors.txt\n"
    assert files["errors.txt"].count("ERROR") == 3
    sh.run("echo more >> errors.txt; sed -i 's/ERROR/E/' errors.txt")
    assert files["errors.txt"].endswith("more\n") and "ERROR" not in files["errors.txt"]
    assert sh.run("echo x > nodir/x").output == "bash: line 1: nodir/x: No such file or directory\n"


def test_session_keeps_cwd_and_exported_variables_only() -> None:
    sh = ShellEmulator(dict(TREE))
    sh.run("cd logs && export KEEP=1 && DROP=2")
    assert sh.run("pwd; echo k$KEEP d$DROP").output == "/workspace/logs\nk1 d\n"


def test_execute_keeps_one_session_per_files_dict() -> None:
    a, b = dict(TREE), dict(TREE)
    execute(a, "cd logs")
    assert execute(a, "ls").output == "app.log\ndb.log\n"
    assert execute(b, "ls").output == "data\nlogs\nnotes.txt\n"


@pytest.mark.parametrize("cmd", ["ls logs", "nosuchcmd", "seq 400000", "while true; do :; done"])
def test_the_sim_sandbox_gives_the_shell_result_as_an_exec_result(cmd: str) -> None:
    from compactrl.sandbox.base import ExecResult
    from compactrl.sandbox.sim import SimSandbox
    from compactrl.task import Task

    sandbox = SimSandbox(judge=lambda task, files: None)
    sandbox.start(Task(id="t", kind="code", instruction="", files=dict(TREE)))
    got = sandbox.exec(cmd, timeout_s=600)  # the loop ends at the iteration cap, not the clock
    want = ShellEmulator(dict(TREE)).run(cmd, timeout_s=600)
    assert type(got) is ExecResult
    assert (got.output, got.exit_code, got.timed_out, got.truncated) == (
        want.output, want.exit_code, want.timed_out, want.truncated)


def test_output_is_capped() -> None:
    sh = ShellEmulator({}, max_output_chars=1000)
    res = sh.run("seq 100000")
    assert res.truncated and len(res.output) == 1000


def test_supported_commands_are_listed() -> None:
    for name in ("grep", "sed", "awk", "sort", "uniq", "cut", "find", "ls", "cd", "test", "["):
        assert name in SUPPORTED_COMMANDS


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=80))
def test_any_command_text_gives_a_shell_result(text: str) -> None:
    files = dict(TREE)
    res = ShellEmulator(files).run(text)
    assert isinstance(res, ShellResult) and isinstance(res.output, str) and 0 <= res.exit_code <= 255
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["grep", "-v", "-c", "ERROR", "logs/app.log", "|", "sort", "-n", "awk",
                                 "'{print $1}'", "sed", "'s/a/b/'", ">", "out.txt", "&&", "||", ";", "cut",
                                 "-d,", "-f2", "wc", "-l", "head", "-2", "tail", "cat", "x", "'", '"', "$X"]),
                max_size=12))
def test_command_soup_never_raises(words: list[str]) -> None:
    res = ShellEmulator(dict(TREE)).run(" ".join(words))
    assert isinstance(res, ShellResult)
