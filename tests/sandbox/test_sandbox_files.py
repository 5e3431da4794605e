"""The file tools (read_file / write_file / list_files) behave exactly like the sim's on real backends:
same contents, same listings, same exception types, for any sequence of operations."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sandbox_helpers import REAL_BACKENDS, make_backend, small_task

from compactrl.sandbox.sim import SimSandbox

PATHS = [
    "calc.py", "tests/test_calc.py", "d/b.py", "d", "d/e/c.txt", "d/e", "calc.py/x", "new.md",
    "./calc.py", "d//b.py", "d/", "ünï/çødé.txt", "sp ace.md", ".hidden", "tests",
    "../x", "/etc/passwd", "d/../calc.py", "", ".",
]
CONTENTS = st.one_of(
    st.sampled_from(["", "x = 1\n", "no newline", "crlf\r\nline\r\n", "tab\tand unicode é ✓ 🙂\n", "nul\x00byte"]),
    st.text(max_size=200),
)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.sampled_from(PATHS), CONTENTS),
        st.tuples(st.just("read"), st.sampled_from(PATHS), st.none()),
        st.tuples(st.just("list"), st.none(), st.none()),
    ),
    min_size=1, max_size=12,
)


def _apply(sb, op):
    kind, path, content = op
    try:
        if kind == "write":
            return ("ok", sb.write_file(path, content))
        if kind == "read":
            return ("ok", sb.read_file(path))
        return ("ok", sb.list_files())
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
        return ("error", type(e).__name__, str(e))  # the env shows the message: it must match too


def _sim():
    sim = SimSandbox(judge=lambda task, files: None)
    sim.start(small_task())
    return sim


@pytest.fixture(scope="module", params=REAL_BACKENDS)
def real(request):
    sb = make_backend(request.param)
    sb.start(small_task())
    yield sb
    sb.close()


def _reset(sb) -> None:
    """Back to the task's initial files without paying for a new sandbox."""
    res = sb.exec("find . -mindepth 1 -delete && echo clean")
    assert res.output == "clean\n", res
    for path, content in small_task().files.items():
        sb.write_file(path, content)


@pytest.mark.timeout(600)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_file_tools_agree_with_the_sim(real, ops):
    _reset(real)
    sim = _sim()
    for op in ops:
        assert _apply(real, op) == _apply(sim, op), op
    assert real.list_files() == sim.list_files()
    for path in sim.list_files():
        assert real.read_file(path) == sim.read_file(path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", REAL_BACKENDS)
def test_files_written_by_the_shell_are_seen_by_the_tools(name):
    sb = make_backend(name)
    sb.start(small_task())
    try:
        sb.exec("mkdir -p pkg/sub && printf 'a\\nb' > pkg/sub/m.py && ln -s calc.py alias.py && mkfifo pipe")
        assert "pkg/sub/m.py" in sb.list_files()
        assert "alias.py" not in sb.list_files() and "pipe" not in sb.list_files()  # regular files only
        assert sb.read_file("pkg/sub/m.py") == "a\nb"
        assert sb.read_file("alias.py") == sb.read_file("calc.py")  # a link inside the work dir is followed
        with pytest.raises(PermissionError):
            sb.read_file("pipe")  # never blocks on a FIFO
        sb.write_file("pkg/sub/m.py", "changed\n")
        assert sb.exec("cat pkg/sub/m.py").output == "changed\n"
        sb.exec("echo more >> pkg/sub/m.py")  # the shell may have changed what a cache would hold
        assert sb.read_file("pkg/sub/m.py") == "changed\nmore\n"
    finally:
        sb.close()
