"""The shell language in the sim (compound commands, functions, substitutions, arithmetic, read,
the added utilities) against real bash, the limits that end runaway commands like a timeout, and
the guarantee that the sim never executes agent-written code in the host process."""

from __future__ import annotations

import builtins
import os
import shutil
import subprocess
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.shell_sim import ShellEmulator, execute
from compactrl.testing.shell_agreement import Case, check_case

pytestmark = pytest.mark.timeout(120)

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash to compare against")

FILES = {"data.csv": "a,x,3\nb,y,10\nc,x,7\n", "logs/app.log": "INFO a\nERROR b\nERROR c\n",
         "logs/db.log": "ERROR deadlock\n", "src/m.py": "def f():\n    return 1\n", "notes.txt": "alpha\nbeta\n"}

LANGUAGE = [
    'for f in *.csv logs/*.log; do echo "--- $f"; head -n 2 "$f"; done',
    'x=$(grep -c ERROR logs/app.log); echo "errors: $x"',
    "echo $((3 + 4 * 2)) $(( (1+2) ** 3 )) $((7 / 2)) $((-7 % 3)) $(( 010 + 0x10 )) $((1 << 4 | 1))",
    "i=0; while [ $i -lt 3 ]; do echo $i; i=$((i+1)); done",
    "if [ -f data.csv ]; then echo yes; elif [ -d x ]; then echo dir; else echo no; fi",
    'while IFS=, read a b c; do echo "$c:$a"; done < data.csv',
    "case notes.txt in *.txt) echo text;; *.csv) echo csv;; *) echo other;; esac",
    'f() { echo "args: $# $1 $2"; return 3; }; f a "b c"; echo $?',
    "{ echo a; echo b; } > out.txt; cat out.txt",
    "(cd logs && ls); pwd | wc -c",
    "[[ -f data.csv && $(wc -l < data.csv) -gt 2 ]] && echo big",
    'for ((i=0; i<3; i++)); do echo "i=$i"; done',
    "echo `echo hi` $(echo $(echo nested))",
    "v=hello.tar.gz; echo ${v%.*} ${v%%.*} ${v#*.} ${v##*.} ${v/l/L} ${v//l/L} ${v:1:3} ${v: -2} ${v^^}",
    "set -e; false; echo no",
    "set -e; false || true; if false; then :; fi; echo yes",
    "set -euo pipefail; grep -c ERROR logs/app.log | cat; false | true; echo unreachable",
    "x=5; (( x > 3 )) && echo big; echo $(( x ** 2 )); let y=x*2; echo $y",
    "echo $((1/0)); echo after",
    "echo $(( 5 / 0 + 3 ))\necho next line",
    'set -- a "b c"; for x in "$@"; do echo "<$x>"; done; echo $#',
    "for i in 1 2 3 4 5; do if [ $i -eq 2 ]; then continue; fi; if [ $i -eq 4 ]; then break; fi; echo $i; done",
    'cat data.csv | while read line; do echo "L: $line"; done',
    "[[ abc == a* ]] && echo glob; [[ abc =~ ^a(b)c$ ]] && echo ${BASH_REMATCH[1]}",
    'g() { local a=1; echo $a; }; g; echo "[$a]"',
    'read -r a b <<< "x y z"; echo "$a|$b"; IFS=, read p q <<< "1,2,3"; echo "$p|$q"',
    'echo "a b" | while read x; do echo "$x"; done; echo "[$x]"',
    "break; echo x; x=$(exit 3); echo $?; echo $(echo a; false)$?",
    "set -u; echo $NOPE; echo after",
    'while read -r line; do echo "got $line"; done < <(grep ERROR logs/app.log)',
    "find . -path ./logs -prune -o -type f -print | sort; find . -name '*.log' -exec grep -c ERROR {} + | sort",
    "find . -name '*.py' | xargs wc -l; ls | xargs -n1 echo item; printf 'a\\nb\\n' | xargs -I{} echo '<{}>'",
    "paste -d, data.csv notes.txt; cut -d, -f3 data.csv | paste -sd+ | bc; nl -ba notes.txt; rev notes.txt; tac data.csv",
    "printf '1\\n2\\n' > f1; printf '1\\n3\\n' > f2; diff f1 f2; echo rc=$?; comm f1 f2; diff -q f1 f2; join f1 f2",
    "diff <(sort data.csv) <(sort -r data.csv); printf 'e\\nf\\nf\\n' > g1; printf 'e\\nf\\n' > g2; diff g1 g2; diff -u g2 g1 | tail -n +3",
    "echo 'scale=2; 10/3; 1/3; 2^10; 3.5*2' | bc; expr 3 + 4; expr length hello; expr 0 + 0; echo rc=$?",
    "column -t -s, data.csv; realpath data.csv | wc -c; sha256sum data.csv notes.txt",
    "func() { local n=$1; if (( n <= 1 )); then echo 1; else echo $(( n * $(func $((n-1))) )); fi; }; func 6",
    "cat <<EOF > gen.sh\necho generated \\$1 $(( 2 + 2 ))\nEOF\nbash gen.sh arg; bash -c 'echo \"$0:$1\"' name one",
    "test -f missing.txt || { echo missing; exit 3; }; echo unreachable",
    "fi",
    "if true; then echo x",
    "for i in 1 2; do echo $i",
    'count=0; for f in $(find . -name "*.log" | sort); do count=$((count + $(wc -l < "$f"))); done; echo $count',
]


@needs_bash
@pytest.mark.parametrize("command", LANGUAGE)
def test_language_agrees_with_bash(command: str) -> None:
    diffs, real, sim = check_case(Case(dict(FILES), [], command))
    assert not diffs, (command, diffs, {d: (getattr(real, d, None), getattr(sim, d, None))
                                       for d in diffs if d in ("stdout", "stderr", "exit_code")})


# ===================================================================== limits
def test_an_infinite_loop_ends_like_a_timeout() -> None:
    # no time budget to race with: the default iteration cap alone must end it, whatever the load
    res = ShellEmulator({}).run("echo start; while true; do :; done; echo never", timeout_s=1e9)
    assert "more than 100000 loop iterations" in res.output
    assert res.exit_code == 124 and res.timed_out
    assert res.output.startswith("start\n") and "[timed out after" in res.output and "never" not in res.output


def test_the_time_budget_ends_a_loop_before_the_iteration_cap() -> None:
    sh = ShellEmulator({}, max_loop_iterations=10**9)
    t0 = time.monotonic()
    res = sh.run("while :; do x=1; done", timeout_s=0.5)
    assert time.monotonic() - t0 >= 0.5  # no upper bound: a starved process may overrun its budget
    assert (res.exit_code, res.timed_out) == (124, True) and "the time budget" in res.output
    assert sh.run("echo fine").output == "fine\n"  # the session goes on after a timeout


def test_sim_sandbox_exec_passes_its_timeout() -> None:
    files: dict[str, str] = {}
    res = execute(files, "until false; do echo x > f; done", timeout_s=30)
    assert res.timed_out and res.exit_code == 124 and files["f"] == "x\n"


def test_runaway_recursion_and_output_end() -> None:
    res = ShellEmulator({}).run("f() { f; }; f; echo after")
    assert res == res.__class__("bash: line 1: f: maximum function nesting level exceeded (100)\n", 1)
    deep = ShellEmulator({}).run("g() { [ $1 -le 0 ] && echo 0 && return; echo $(( $1 + $(g $(($1 - 1))) )); }; g 90")
    assert deep.output == "4095\n"
    big = ShellEmulator({}, max_output_chars=10_000).run("while true; do echo yes; done")
    assert big.truncated and len(big.output) == 10_000


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_loop_iterations"):
        ShellEmulator({}, max_loop_iterations=0)
    with pytest.raises(ValueError, match="max_function_depth"):
        ShellEmulator({}, max_function_depth=0)


# ===================================================================== nothing runs on the host
AGENT_CODE = [
    "python3 -c \"open('{marker}', 'w').write('pwned')\"",
    "python -c \"import os; os.system('touch {marker}')\"",
    "bash -c \"python3 -c 'open(\\\"{marker}\\\", \\\"w\\\")'\"",
    "echo \"open('{marker}', 'w')\" | xargs -0 python3 -c",
    "env python3 -c \"open('{marker}', 'w')\"; timeout 5 python3 -c \"open('{marker}', 'w')\"",
    "printf 'import os\\nos.system(\"touch {marker}\")\\n' > x.py; python3 x.py; find . -name '*.py' -exec python3 {{}} \\;",
    "touch {marker}; echo x > {marker}; mkdir -p {marker}.d",
]


def test_the_sim_never_executes_agent_code_in_the_host_process(tmp_path, monkeypatch) -> None:
    marker = tmp_path / "pwned"

    def refuse(*args, **kwargs):
        raise AssertionError(f"the sim tried to execute something: {args!r}")

    for module, name in ((subprocess, "Popen"), (subprocess, "run"), (os, "system"), (os, "execv"), (os, "fork"),
                         (os, "posix_spawn"), (builtins, "exec"), (builtins, "eval"), (builtins, "compile")):
        monkeypatch.setattr(module, name, refuse)
    for template in AGENT_CODE:
        res = ShellEmulator({}).run(template.format(marker=marker))
        assert "AssertionError" not in res.output
        if "python" in template:
            assert "sim-shell: unsupported: running programs (python)" in res.output
    assert not marker.exists() and not (tmp_path / "pwned.d").exists()
    assert list(tmp_path.iterdir()) == []


# ===================================================================== malformed input
SOUP = list("$(){}[]'\"`\\;|&<>!#*?=+-%/:,. \n\tabcx01") + [
    "$(", "$((", "${", "))", "for ", "do ", "done", "if ", "then ", "fi", "case ", " in ", "esac", ";;", "[[ ", " ]]",
    "while ", "read ", "<<", "EOF", "f()", "{ ", " }", "echo ", "xargs ", "<(", "$x", "${x:-", "${x#", "${x/",
    "local ", "return ", "break", "set -e;", "$((1/0))", "x=$(", "`"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(SOUP), max_size=30))
def test_malformed_shell_language_is_an_observation(pieces: list[str]) -> None:
    res = ShellEmulator({"a": "x\n"}).run("".join(pieces), timeout_s=5)
    assert isinstance(res.exit_code, int) and 0 <= res.exit_code <= 255
    assert "internal error" not in res.output and "too deeply nested" not in res.output
