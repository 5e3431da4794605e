"""The sim's verdict equals real pytest's on generated projects and typical edits (slow: runs pytest).

The code run here is the generator's own output plus edits written by this test, never an agent's;
the full backend comparison (local and docker sandboxes) lives in tests/sandbox.
"""

import os
import re
import subprocess
import sys

import pytest

from compactrl.sandbox.static_pytest import judge_code_task
from compactrl.tasksets.generators.code import CodeTaskGenerator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def real_pytest(task, files, tmp_path):
    for path, content in {**files, **task.check.hidden_files}.items():
        if content is None:  # deleted
            continue
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # as the sandboxes
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env=env).stdout
    passed = set(re.findall(r"^PASSED (\S+)", out, flags=re.M))
    return {t: t in passed for t in task.check.must_pass}


def edits(task):
    meta = task.metadata
    bug, src = meta["bug_file"], task.files[meta["bug_file"]]
    fixed = src
    for fix in meta["fix"]:
        fixed = fixed.replace(fix["old"], fix["new"])
    fact = meta["facts"][0]
    site = f"{fact['key']} = {fact['value']!r}\n"
    value = fact["value"]
    equivalent = (f"{value[:1]!r} + {value[1:]!r}" if isinstance(value, str)
                  else f"{round(value * 100, 6)!r} / 100" if isinstance(value, float) else f"{value} * 1")
    helper = meta["sim"]["modules"][bug][1]
    yield "original", {}
    yield "fixed", {bug: fixed}
    yield "fixed, comments and docstrings", {bug: fixed.replace('"""', '"""Edited. ', 1) + "\n# done\n"}
    yield "fixed, equivalent expression", {bug: fixed.replace(site, f"{fact['key']} = {equivalent}\n")}
    yield "fixed, annotated", {bug: fixed.replace(site, f"{fact['key']}: object = {value!r}\n")}
    yield "partly fixed", {bug: fixed.replace(site, f"{fact['key']} = {fact['wrong_value']!r}\n")}
    yield "name error", {bug: fixed.replace(site, f"{fact['key']} = UNDEFINED\n")}
    yield "zero division", {bug: fixed.replace(site, f"{fact['key']} = 1 / 0\n")}
    yield "syntax error", {bug: fixed + "\ndef broken(:\n"}
    yield "helper docstring", {bug: fixed, helper: task.files[helper].replace('"""', '"""Doc. ', 1)}
    yield "helper syntax error", {bug: fixed, helper: task.files[helper] + "\nif True\n"}
    yield "visible test edited", {bug: fixed, next(p for p in task.files if p.startswith("tests/")): "def test_x():\n    assert False\n"}
    # collection-level outcomes: pytest runs no test at all, or does not start
    pkg = meta["package"]
    visible = next(p for p in task.files if p.startswith("tests/test_"))
    yield "bug file overwritten", {bug: "x = 1\n"}
    yield "helper loses its names", {bug: fixed, helper: "VALUE = 1\n"}
    yield "missing __init__", {bug: fixed, f"{pkg}/__init__.py": None}
    yield "missing helper", {bug: fixed, helper: None}
    for content in ("def f(:\n", "x\n", "return 1\n", "1/0\n", "assert False\n", f"from {pkg}.nothing import f\n",
                    f"from {pkg} import nothing\n", "", "def test_extra():\n    assert False\n", "import os\nNone\n"):
        yield f"added test file {content!r}", {bug: fixed, "tests/test_extra.py": content}
    yield "added conftest raises", {bug: fixed, "conftest.py": "1/0\n"}
    yield "added module not collected", {bug: fixed, f"{pkg}/extra.py": "def f(:\n"}
    yield "duplicate test module name", {bug: fixed, f"other/{visible.rsplit('/', 1)[1]}": "def test_o():\n    pass\n"}
    yield "invalid pyproject", {bug: fixed, "pyproject.toml": "(\n"}
    yield "empty pyproject", {bug: fixed, "pyproject.toml": ""}
    yield "pyproject with pytest options table", {bug: fixed, "pyproject.toml": "[tool.pytest.ini_options]\n"}


@pytest.mark.parametrize("difficulty, seed", [("easy", 0), ("easy", 1), ("default", 2), ("hard", 3)])
def test_sim_equals_real_pytest(difficulty, seed, tmp_path):
    task = CodeTaskGenerator(difficulty).generate(seed)
    for i, (name, changes) in enumerate(edits(task)):
        files = {**task.files, **changes}
        sim = judge_code_task(task, {p: c for p, c in {**files, **task.check.hidden_files}.items() if c is not None})
        real = real_pytest(task, files, tmp_path / str(i))
        assert {t: t in sim.passed for t in task.check.must_pass} == real, name
