"""Shell semantics shared by the local and docker backends, the output cap, and config validation."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sandbox_helpers import REAL_BACKENDS, make_backend, small_task

from compactrl.sandbox import _shell
from compactrl.sandbox.docker import DockerSandbox, DockerSandboxConfig
from compactrl.sandbox.local import LocalSandbox, LocalSandboxConfig
from compactrl.task import Limits, Runtime


# ----------------------------------------------------------------------------------- pure pieces
@given(st.binary(max_size=3000), st.integers(2, 400), st.lists(st.integers(1, 500), max_size=20))
def test_capped_output_keeps_head_and_tail_whatever_the_chunking(data, limit, cuts):
    out = _shell.CappedOutput(limit)
    pos = 0
    for c in cuts:
        out.feed(data[pos : pos + c])
        pos += c
    out.feed(data[pos:])
    assert out.total == len(data)
    assert out.truncated == (len(data) > limit)
    text = out.text()
    if not out.truncated:
        assert text == _shell.readable(data)
    else:
        head, tail = limit // 2, limit - limit // 2
        omitted = len(data) - head - tail
        assert text == (_shell.readable(data[:head]) + f"\n[... {omitted} bytes of output omitted ...]\n"
                        + _shell.readable(data[len(data) - tail :]))


@given(st.binary(max_size=500), st.integers(-300, 300), st.lists(st.integers(1, 64), max_size=30),
       st.binary(max_size=50))
def test_marker_scanner_finds_the_exit_code_across_chunk_boundaries(before, code, cuts, after):
    marker = _shell.new_marker().encode()
    stream = before + marker + str(code).encode() + b"\n" + after
    out = _shell.CappedOutput(10_000)
    scanner = _shell.MarkerScanner(marker, out)
    pos, done = 0, False
    for c in [*cuts, len(stream)]:
        if not done:
            done = scanner.feed(stream[pos : pos + c])
        pos += c
    assert done and scanner.exit_code == code
    assert bytes(out.head) + bytes(out.tail) == before
    assert after.startswith(scanner.rest)


@given(st.text())
def test_readable_is_valid_text_without_control_characters(text):
    r = _shell.readable(text.encode("utf-8", errors="surrogatepass"))
    r.encode("utf-8")
    assert not any(ord(c) < 32 and c not in "\t\n\r" for c in r)


@pytest.mark.parametrize(
    "cls, field, value",
    [
        (LocalSandboxConfig, "timeout_s", 0),
        (LocalSandboxConfig, "max_processes", 2),
        (LocalSandboxConfig, "isolation", "chroot"),
        (LocalSandboxConfig, "workdir", "relative"),
        (LocalSandboxConfig, "memory_bytes", 1.5),
        (LocalSandboxConfig, "sandbox_uid", 0),
        (DockerSandboxConfig, "cpus", -1),
        (DockerSandboxConfig, "image", ""),
        (DockerSandboxConfig, "memory_bytes", 1024),
        (DockerSandboxConfig, "workdir", "/tmp"),
    ],
)
def test_bad_config_raises_value_error_naming_the_field(cls, field, value):
    with pytest.raises(ValueError, match=field):
        cls(**{field: value})


@pytest.mark.parametrize("cls", [LocalSandbox, DockerSandbox])
def test_unknown_option_is_a_value_error(cls):
    with pytest.raises(ValueError, match="timeout"):
        cls(timeout=3)
    with pytest.raises(TypeError):
        cls(LocalSandboxConfig())  # options are keyword-only


# ---------------------------------------------------------------------------------- real shells
@pytest.mark.timeout(120)
def test_cwd_and_exported_variables_persist_but_nothing_else(sandbox):
    sandbox.exec("cd tests && export KEEP='a b' && PLAIN=1 && f() { :; } && set -e && shopt -s nullglob")
    res = sandbox.exec('pwd; echo "[$KEEP] [$PLAIN]"; type f 2>&1 | head -1; echo $-; false; echo continues')
    lines = res.output.splitlines()
    assert lines[0].endswith("/workspace/tests")
    assert lines[1] == "[a b] []"
    assert "not found" in lines[2]
    assert "e" not in lines[3] and lines[4] == "continues"
    sandbox.exec("unset KEEP; cd ..")
    assert sandbox.exec('echo "[$KEEP]"; pwd; echo $HOME').output == "[]\n/workspace\n/workspace\n"


@pytest.mark.timeout(120)
def test_exit_and_errors_are_observations(sandbox):
    assert sandbox.exec("exit 7").exit_code == 7
    res = sandbox.exec("nosuchcommand")
    assert res.exit_code == 127 and "bash: line 1: nosuchcommand: command not found" in res.output
    res = sandbox.exec("echo 'unterminated")
    assert res.exit_code == 2 and "unexpected EOF" in res.output
    assert sandbox.exec("echo fine").output == "fine\n"


@pytest.mark.timeout(300)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=60))
def test_any_text_reaches_the_command_verbatim(sandbox, text):
    # printf %s of a quoted argument: the bytes bash receives are exactly the command's
    quoted = "'" + text.replace("'", "'\\''") + "'"
    res = sandbox.exec(f"printf %s {quoted}")
    assert res.exit_code == 0
    assert res.output == _shell.readable(text.encode())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", REAL_BACKENDS)
def test_stdin_is_empty_and_the_protocol_cannot_be_spoofed(name):
    sb = make_backend(name)
    sb.start(small_task())
    try:
        assert sb.exec("cat; echo after-cat", timeout_s=10).output == "after-cat\n"  # no hang on stdin
        res = sb.exec("echo __compactrl_done_0123456789abcdef0123456789abcdef_0; echo real-end")
        assert res.output.endswith("real-end\n") and res.exit_code == 0
    finally:
        sb.close()


@pytest.mark.timeout(120)
def test_local_shell_restarts_when_wedged_and_says_so():
    sb = make_backend("local")
    sb.start(small_task())
    try:
        sb._kill_command = lambda: None  # simulate a command whose processes cannot be killed
        started = time.monotonic()
        res = sb.exec("sleep 30", timeout_s=0.5)
        assert res.timed_out and "the shell was restarted" in res.output
        assert time.monotonic() - started < 20
        assert sb.restarts == 1
        assert sb.exec("echo back; pwd").output == "back\n/workspace\n"
        assert sb.read_file("calc.py").startswith("def add")  # files survive a restart
    finally:
        sb.close()


@pytest.mark.timeout(120)
def test_run_tests_reports_per_test_verdicts_and_hides_hidden_files(backend):
    hidden = {"tests/test_hidden.py": "from calc import add\n\ndef test_hidden():\n    assert add(1, 1) == 2\n",
              "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"}
    sb = make_backend(backend)
    sb.start(small_task(must_pass=("tests/test_calc.py::test_add", "tests/test_hidden.py::test_hidden"),
                        hidden_files=hidden))
    try:
        sb.write_file("tests/test_calc.py", "def test_add():\n    pass\n")  # agent edits a visible test
        report = sb.run_tests()
        assert report.success and set(report.passed) == {"tests/test_calc.py::test_add", "tests/test_hidden.py::test_hidden"}
        assert "tests/test_hidden.py" not in sb.list_files()  # hidden tests never become visible
        assert sb.read_file("tests/test_calc.py") == hidden["tests/test_calc.py"]  # pristine again, as in the sim
        sb.write_file("calc.py", "def add(a, b):\n    return a - b\n")
        report = sb.run_tests()
        assert not report.success and "tests/test_hidden.py::test_hidden" in report.failed
        sb.exec("mkdir -p tests/test_hidden.py")  # something in the hidden file's way
        report = sb.run_tests()
        assert not report.success and "could not install the test files" in report.output
    finally:
        sb.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", REAL_BACKENDS)
def test_a_tasks_own_command_time_limit_is_the_default_for_exec(name):
    """``Task.runtime.limits.timeout_s`` (a Terminal-Bench task's per-command wait) replaces the
    backend's configured default on both real backends; an explicit ``timeout_s`` still wins."""
    import dataclasses

    sb = make_backend(name)
    task = small_task()
    sb.start(dataclasses.replace(task, runtime=Runtime(limits=Limits(timeout_s=2))))
    try:
        started = time.monotonic()
        res = sb.exec("sleep 20; echo never")
        assert res.timed_out and "never" not in res.output
        assert time.monotonic() - started < 15
        assert sb.exec("sleep 3; echo done", timeout_s=30).output == "done\n"
    finally:
        sb.close()
