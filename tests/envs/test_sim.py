"""The sim sandbox: file system semantics and the static test verdict."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.sandbox import SandboxError, SimSandbox, make_sandbox
from compactrl.task import Task
from compactrl.tasksets.generators.code import CodeTaskGenerator

pytestmark = pytest.mark.timeout(120)
GEN = CodeTaskGenerator("default")


def started(task):
    sb = make_sandbox("sim")
    sb.start(task)
    return sb


def fixed_source(task):
    src = task.files[task.metadata["bug_file"]]
    for fix in task.metadata["fix"]:
        src = src.replace(fix["old"], fix["new"])
    return src


def spec_ids(task):
    return {t for t in task.check.must_pass if t.startswith(task.metadata["spec_file"])}


@settings(max_examples=15)
@given(st.integers(0, 10**6))
def test_original_fails_spec_only_and_fix_passes_all(seed):
    task = GEN.generate(seed)
    sb = started(task)
    report = sb.run_tests()
    assert not report.success
    assert set(report.failed) == spec_ids(task)
    sb.write_file(task.metadata["bug_file"], fixed_source(task))
    report = sb.run_tests()
    assert report.success and not report.failed
    assert set(report.passed) == set(task.check.must_pass)


def with_bug(task, transform):
    sb = started(task)
    sb.write_file(task.metadata["bug_file"], transform(fixed_source(task)))
    return sb.run_tests()


def first_fact(task):
    return task.metadata["facts"][0]


def test_formatting_comments_and_docstrings_do_not_matter():
    task = GEN.generate(1)
    report = with_bug(task, lambda s: s.replace('"""', '"""Edited. ', 1).replace("\n\n\ndef", "\n\n\n# note\ndef", 1) + "\n# end\n")
    assert report.success


def test_equivalent_value_expression_passes():
    task = GEN.generate(2)
    fact = first_fact(task)
    value = fact["value"]
    if isinstance(value, str):
        expr = f"{value[:1]!r} + {value[1:]!r}"
    elif isinstance(value, float):
        expr = f"{round(value * 100, 6)!r} / 100"  # x / 100 rounds to the same double as the literal
    else:
        expr = f"{value} + 0"
    report = with_bug(task, lambda s: s.replace(f"{fact['key']} = {value!r}\n", f"{fact['key']} = {expr}  # fixed\n"))
    assert report.success


@pytest.mark.parametrize(
    "rhs, everything_fails",
    [("UNDEFINED_NAME", True), ("1 / 0", True), ("'x' - 1", True), ("None", False), ("[1, 2]", False)],
)
def test_bad_values(rhs, everything_fails):
    task = GEN.generate(3)
    fact = first_fact(task)
    report = with_bug(task, lambda s: s.replace(f"{fact['key']} = {fact['value']!r}\n", f"{fact['key']} = {rhs}\n"))
    assert not report.success
    if everything_fails:  # the import raises: a collection error, pytest runs nothing
        assert not report.passed
    else:
        assert report.failed == (f"{task.metadata['spec_file']}::test_{fact['function']}",)


def test_syntax_error_fails_everything_and_code_change_fails_dependents():
    task = GEN.generate(4)
    assert not with_bug(task, lambda s: s + "\ndef broken(:\n").passed
    report = with_bug(task, lambda s: s + "\n\ndef extra():\n    return 1\n")
    assert not report.success
    bug_tests = {t for t, spec in task.metadata["sim"]["tests"].items() if task.metadata["bug_file"] in spec["imports"]}
    assert set(report.failed) == bug_tests


def test_float_for_strict_int_fact_fails():
    task = next(t for t in map(GEN.generate, range(200)) if any(f["compare"] == "int" for f in t.metadata["facts"]))
    fact = next(f for f in task.metadata["facts"] if f["compare"] == "int")
    report = with_bug(task, lambda s: s.replace(f"{fact['key']} = {fact['value']!r}\n", f"{fact['key']} = {float(fact['value'])!r}\n"))
    assert f"{task.metadata['spec_file']}::test_{fact['function']}" in report.failed


def test_hidden_tests_never_visible_and_visible_tests_restored():
    task = GEN.generate(5)
    sb = started(task)
    visible = next(p for p in task.files if p.startswith("tests/"))
    sb.write_file(visible, "def test_cheat():\n    pass\n")
    sb.write_file(task.metadata["spec_file"], "def test_cheat():\n    pass\n")
    assert not sb.run_tests().success
    assert sb.read_file(visible) == task.files[visible]
    assert sb.read_file(task.metadata["spec_file"]) == "def test_cheat():\n    pass\n"  # the agent's own file
    sb2 = started(task)
    sb2.run_tests()
    assert task.metadata["spec_file"] not in sb2.list_files()
    with pytest.raises(FileNotFoundError):
        sb2.read_file(task.metadata["spec_file"])


def test_deleted_module_is_broken():
    task = GEN.generate(6)
    sb = started(task)
    sb._files.pop(task.metadata["bug_file"])  # no tool deletes; a shell `rm` does
    assert not sb.run_tests().passed


def test_file_system_errors():
    task = GEN.generate(7)
    sb = started(task)
    pkg = task.metadata["package"]
    with pytest.raises(PermissionError):
        sb.write_file("../escape.txt", "x")
    with pytest.raises(PermissionError):
        sb.read_file("/etc/passwd")
    with pytest.raises(IsADirectoryError):
        sb.write_file(pkg, "x")
    with pytest.raises(IsADirectoryError):
        sb.read_file(pkg)
    with pytest.raises(NotADirectoryError):
        sb.write_file(f"{pkg}/__init__.py/x", "x")
    with pytest.raises(FileNotFoundError):
        sb.read_file("missing.txt")
    sb.write_file("new/dir/file.txt", "hi")
    assert "new/dir/file.txt" in sb.list_files() and sb.list_files() == sorted(sb.list_files())


def test_sim_rejects_tasks_it_cannot_judge_and_unstarted_runs():
    with pytest.raises(ValueError, match="metadata"):
        SimSandbox().start(Task(id="t", kind="code", instruction="x", files={"a.py": ""}))
    with pytest.raises(SandboxError):
        SimSandbox().run_tests()
    with pytest.raises(ValueError, match="backend"):
        make_sandbox("vm")


def test_shell_runs_on_the_sim_files():
    task = GEN.generate(8)
    sb = started(task)
    result = sb.exec("ls")
    assert result.exit_code in (0, 127)
    if result.exit_code == 0:  # the shell emulator is installed
        assert "README.md" in result.output
        sb.exec("echo hello > note.txt")
        assert sb.read_file("note.txt") == "hello\n"


def test_directory_in_place_of_a_hidden_test_file_blocks_the_run():
    task = GEN.generate(9)
    sb = started(task)
    sb.write_file(task.metadata["fix"][0]["file"], fixed_source(task))
    sb.write_file(task.metadata["spec_file"] + "/x", "blocker")
    report = sb.run_tests()
    assert not report.success and not report.passed and "could not install" in report.output


_rhs = st.one_of(
    st.integers(-10**6, 10**6).map(repr), st.floats(allow_nan=False).map(repr), st.text(max_size=8).map(repr),
    st.sampled_from(["UNDEFINED", "1 / 0", "2 ** 10", "3 * 7 + 1", "-5", "'a' * 3", "int('40')", "round(3.14159, 2)",
                     "min(3, 9)", "abs(-20)", "float(2)", "None", "True", "[1]", "(1,", "x = 2", "1; 2", "'''", "PAGE_SIZE",
                     "SERVICE_FEE_RATE * 2", "max", "len('abc')", "10 ** 400000", "'ab' * 10 ** 9"]),
)


@settings(max_examples=40)
@given(st.integers(0, 10**6), st.lists(_rhs, min_size=1, max_size=4), st.booleans())
def test_fast_path_agrees_with_full_analysis(seed, values, annotate):
    """Edits of the fact lines only are judged without parsing the module; the result must equal
    the full statement-level analysis (which the real-pytest comparison validates)."""
    from compactrl.sandbox import static_pytest

    task = GEN.generate(seed)
    meta = task.metadata
    facts = tuple((f["key"], f["compare"], f["value"]) for f in meta["facts"])
    sites = tuple((s["line"], s["key"], frozenset(s["names_before"])) for s in meta["sim"]["sites"])
    original = task.files[meta["bug_file"]]
    lines = original.split("\n")
    for site, rhs in zip(meta["sim"]["sites"], values):
        lines[site["line"]] = f"{site['key']}{': object' if annotate else ''} = {rhs}"
    current = "\n".join(lines)
    assert static_pytest._original_sites(original, frozenset(k for k, _, _ in facts))[1:] == (
        {i: k for i, k, _ in sites}, {i: b for i, _, b in sites})
    fast = static_pytest._fact_lines_only(current, original, facts, sites)
    full = static_pytest._full_verdict(current, original, facts)
    if fast is not None:
        assert fast == full
    else:  # only edits that are not one complete statement per line leave the fast path
        assert any(static_pytest._parse_line(line) is None or len(static_pytest._parse_line(line)) != 1 for line in lines)
    correct = "\n".join(
        f"{line.split(' = ')[0].split(':')[0]} = {next(f['value'] for f in meta['facts'] if line.startswith(f['key']))!r}"
        if i in {s["line"] for s in meta["sim"]["sites"]} else line for i, line in enumerate(lines))
    assert static_pytest._fact_lines_only(correct, original, facts, sites) == ("ok", {k: True for k, _, _ in facts})
