"""Dockerfile steps that build a uv project (`uv init`, `uv add`, `uv sync`) are prepared from the
package index like pip installs: their packages go to the task's wheelhouse at prepare time and the
steps run as written, offline from it. What uv would fetch from elsewhere still needs the image."""

from __future__ import annotations

import pytest

import compactrl.tasksets.terminal_bench.local_build as tlb

pytestmark = pytest.mark.timeout(60)

URL = "https://astral.sh/uv/0.7.13/install.sh"
LOCK = '''version = 1
requires-python = ">=3.12"

[[package]]
name = "demo"
version = "0.1.0"
source = { virtual = "." }
dependencies = [{ name = "numpy" }]

[[package]]
name = "numpy"
version = "2.3.1"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "pytest"
version = "8.4.1"
source = { registry = "https://pypi.org/simple" }
'''
PYPROJECT = '''[project]
name = "demo"
version = "0.1.0"
dependencies = ["numpy>=2"]

[dependency-groups]
dev = ["pytest==8.4.1"]
'''


def _run(command: str) -> dict:
    return {"op": "run", "command": command, "workdir": "/app"}


def test_uv_init_and_add_in_a_dockerfile_are_prepared_from_the_index() -> None:
    steps = [_run(f"curl -LsSf {URL} | sh"), {"op": "env", "vars": {"PATH": "/root/.local/bin:$PATH"}},
             _run("uv init && uv add numpy==2.3.1 requests"), _run("uv sync")]
    plan, why = tlb.plan(steps, {}, "", "/app", "k")
    assert why is None, why
    assert plan.wheelhouse == ["numpy==2.3.1", "requests"]
    uv_steps = [s for s in plan.steps if s.get("uv_offline")]
    # run as written (offline, from the wheelhouse), so the state holds the image's /app/.venv
    assert [s["command"] for s in uv_steps] == ["uv init && uv add numpy==2.3.1 requests", "uv sync"]
    assert any("uv add" in note and "wheelhouse" in note for note in plan.mapped)


def test_uv_sync_of_a_shipped_project_fetches_what_its_lock_pins() -> None:
    files = {"pyproject.toml": PYPROJECT, "uv.lock": LOCK}
    plan, why = tlb.plan([_run("uv sync --frozen")], files, "", "/app", "k")
    assert why is None, why
    assert plan.wheelhouse == ["numpy==2.3.1", "pytest==8.4.1"]  # the project itself is not a package to fetch
    # without a lock: its dependencies and the dev group `uv sync` installs by default
    assert tlb.uv_project_requirements({"pyproject.toml": PYPROJECT}, "") == ["numpy>=2", "pytest==8.4.1"]
    assert tlb.uv_project_requirements({}, "") is None


@pytest.mark.parametrize("command", [
    "uv sync",  # no project to sync: neither shipped nor made by `uv init`
    "uv init && uv add -r requirements.txt",  # a requirements file: not read here
    "uv init && uv add --index-url https://download.pytorch.org/whl/cpu torch",  # another index
    "uv init && uv add git+https://github.com/o/n",  # a git source
])
def test_what_uv_would_fetch_from_elsewhere_still_needs_the_image(command: str) -> None:
    plan, why = tlb.plan([_run(command)], {}, "", "/app", "k")
    assert plan is None and why.startswith("needs its image: RUN ") and "uv " in why
