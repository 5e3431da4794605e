"""The sim's model of what pytest does before it runs a test: config usage errors, collected files
that fail to import, names an import needs. Each case was checked against real pytest 9 (the slow
``tests/envs/test_sim_vs_pytest.py`` re-checks them); here the invariants are stated on the sim."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactrl.sandbox import make_sandbox
from compactrl.sandbox.static_pytest import _collected, _file_info, judge_code_task
from compactrl.tasksets.generators.code import CodeTaskGenerator

pytestmark = pytest.mark.timeout(120)
GEN = CodeTaskGenerator("default")


def judge(task, changes):
    files = {p: c for p, c in {**task.files, **changes}.items() if c is not None}
    return judge_code_task(task, {**files, **task.check.hidden_files})


def nothing_ran(report, task):
    return not report.passed and set(report.failed) == set(task.check.must_pass) and not report.success


def fixed(task):
    src = task.files[task.metadata["bug_file"]]
    for fix in task.metadata["fix"]:
        src = src.replace(fix["old"], fix["new"])
    return {task.metadata["bug_file"]: src}


@pytest.mark.parametrize("content", [
    "def f(:\n", "x\n", "return 1\n", "1/0", "raise ValueError('boom')\n", "import os\nassert False\n",
    "@undefined\ndef test_a():\n    pass\n", "class T:\n    x = 1 / 0\n", "from . import x\n",
    "é✓🙂", "  x = 1\n", "'''",
])
def test_added_test_file_that_cannot_import_stops_the_session(content):
    task = GEN.generate(11)
    for path in ("tests/test_extra.py", "tests/extra_test.py", "test_root.py", "conftest.py"):
        assert nothing_ran(judge(task, {**fixed(task), path: content}), task), path


@pytest.mark.parametrize("content", [
    "", "# only a comment\n", "import os\nNone\n", "def test_extra():\n    assert False\n",
    "if __name__ == '__main__':\n    1 / 0\n", "f = lambda: undefined\n", "def test_a(x=len):\n    pass\n",
])
def test_added_test_file_that_imports_leaves_the_verdict(content):
    task = GEN.generate(12)
    assert judge(task, {**fixed(task), "tests/test_extra.py": content}).success


def test_files_pytest_does_not_collect_are_ignored():
    task = GEN.generate(13)
    junk = "def f(:\n"
    for path in (".hidden/test_x.py", "build/test_x.py", "venv/test_x.py", "notes/test_x.txt", "helper.py",
                 f"{task.metadata['package']}/extra.py", "env/lib/test_x.py"):
        extra = {"env/pyvenv.cfg": "home = /usr\n"} if path.startswith("env/") else {}
        assert judge(task, {**fixed(task), path: junk, **extra}).success, path
    assert _collected(("a/test_x.py", "a/x_test.py", "a/test.py", "a/testx.py", "a/conftest.py", ".a/test_x.py",
                       "dist/test_x.py", "x.egg/test_x.py")) == ("a/conftest.py", "a/test_x.py", "a/x_test.py")


def test_missing_imported_name_is_a_collection_error():
    task = GEN.generate(14)
    bug = task.metadata["bug_file"]
    assert nothing_ran(judge(task, {bug: "x = 1\n"}), task)
    assert nothing_ran(judge(task, {bug: ""}), task)
    helper = task.metadata["sim"]["modules"][bug][1]  # imported by the bug file: `from pkg.helper import NAME`
    assert nothing_ran(judge(task, {**fixed(task), helper: "VALUE = 1\n"}), task)
    pkg = task.metadata["package"]
    assert nothing_ran(judge(task, {**fixed(task), "tests/test_extra.py": f"from {pkg}.nothing import f\n"}), task)
    assert nothing_ran(judge(task, {**fixed(task), "tests/test_extra.py": f"from {pkg} import nothing\n"}), task)


def test_names_bound_in_any_way_satisfy_imports():
    task = GEN.generate(15)
    bug = task.metadata["bug_file"]
    src = fixed(task)[bug]
    report = judge(task, {bug: src + "\nfor _i in range(1):\n    pass\n"})
    assert not nothing_ran(report, task)  # changed code: only the tests reaching it fail
    assert judge(task, {"tests/test_extra.py": f"from {task.metadata['package']} import __version__\n",
                        **fixed(task)}).success


def test_missing_init_makes_a_namespace_package():
    task = GEN.generate(16)
    assert judge(task, {**fixed(task), f"{task.metadata['package']}/__init__.py": None}).success


def test_duplicate_test_module_names_are_a_collection_error():
    task = GEN.generate(17)
    visible = next(p for p in task.files if p.startswith("tests/test_"))
    name = visible.rsplit("/", 1)[1]
    assert nothing_ran(judge(task, {**fixed(task), f"other/{name}": "def test_o():\n    pass\n"}), task)
    assert judge(task, {**fixed(task), "other/test_unique_name.py": "def test_o():\n    pass\n"}).success


@pytest.mark.parametrize("name, content, starts", [
    ("pyproject.toml", "(", False), ("pyproject.toml", "[project\n", False), ("pyproject.toml", "", True),
    ("pyproject.toml", None, True), ("pyproject.toml", "[tool.pytest.ini_options]\n", True),
    ("pyproject.toml", "[tool.pytest]\nx = 1\n[tool.pytest.ini_options]\ny = 2\n", False),
    ("pytest.toml", "x = 1\n", False), ("pytest.toml", "[pytest]\n", True),
])
def test_config_files_pytest_cannot_read_stop_it(name, content, starts):
    task = GEN.generate(18)
    report = judge(task, {**fixed(task), name: content})
    assert report.success == starts
    if not starts:
        assert nothing_ran(report, task) and "ERROR" in report.output


def test_invalid_pyproject_is_ignored_when_pytest_ini_configures():
    task = GEN.generate(19)
    assert judge(task, {**fixed(task), "pyproject.toml": "(", "pytest.ini": "[pytest]\n"}).success


def test_sandbox_reports_collection_errors_like_pytest():
    task = GEN.generate(20)
    sb = make_sandbox("sim")
    sb.start(task)
    for path, content in fixed(task).items():
        sb.write_file(path, content)
    assert sb.run_tests().success
    sb.write_file("tests/test_extra.py", "x\n")
    report = sb.run_tests()
    assert nothing_ran(report, task) and "during collection" in report.output


_statement = st.sampled_from([
    "x = 1", "y = x", "undefined_name", "1 / 0", "pass", "import os", "def f(a=missing):\n    pass",
    "def g():\n    return nope", "assert True", "assert 0", "class C:\n    z = 2", "del x", "x += 1",
    "if False:\n    1 / 0", "if True:\n    1 / 0", "for i in range(2):\n    pass", "print", "None",
    "z = [q for q in range(3)]", "w = (lambda: nope)", "v = 1 if True else nope",
])


@settings(max_examples=60, deadline=None)
@given(st.lists(_statement, max_size=6))
def test_certain_import_errors_are_real(statements):
    """Soundness on code whose top level the analysis fully decides: it claims an import error
    exactly when running the code (here, generated statements without side effects) raises."""
    source = "\n".join(statements) + "\n"
    try:
        exec(compile(source, "<gen>", "exec"), {"__name__": "gen"})  # test-authored statements only
        raised = False
    except Exception:
        raised = True
    assert _file_info(source).raises == raised, source
