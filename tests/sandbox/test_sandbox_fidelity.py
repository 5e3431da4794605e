"""sim, local and docker agree on whole episodes of generated tasks (property-based).

Oracle and no-op sequences: everything agrees (files, must-pass verdicts, reward, termination and
every file-tool observation). Random edits: files and file-tool observations always agree and the
two real backends agree on everything; the sim's *verdict* may differ from real pytest in the
classes docs/sandboxes.md lists (measured by ``benchmarks/sandbox_agreement.py``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sandbox_helpers import REAL_BACKENDS, docker_unavailable, local_unavailable

from compactrl.tasksets.generators.code import CodeTaskGenerator, task_seed_for
from compactrl.testing import sandbox_fidelity as F

_GEN = {d: CodeTaskGenerator(d) for d in ("easy", "default")}
_HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]


def _examples(n: int) -> settings:
    return settings(max_examples=n, deadline=None, suppress_health_check=_HEALTH)


def _task(difficulty: str, index: int):
    return _GEN[difficulty].generate(task_seed_for("test", index))


def _require(backend: str) -> None:
    why = local_unavailable() if backend == "local" else docker_unavailable()
    if why:
        pytest.skip(why)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", REAL_BACKENDS)
@_examples(3)
@given(index=st.integers(0, 10_000), difficulty=st.sampled_from(["easy", "easy", "default"]))
def test_oracle_episodes_agree(backend, index, difficulty):
    _require(backend)
    task = _task(difficulty, index)
    outcomes, diffs = F.compare(task, ["sim", backend], F.oracle_actor)
    assert diffs == [], diffs
    assert all(o.reward == 1.0 and o.terminated for o in outcomes)  # the oracle solves every task


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", REAL_BACKENDS)
@_examples(3)
@given(index=st.integers(0, 10_000), rng=st.randoms(use_true_random=False))
def test_noop_episodes_agree(backend, index, rng):
    _require(backend)
    task = _task("easy", index)
    actions = F.noop_actions(task, rng)
    outcomes, diffs = F.compare(task, ["sim", backend], lambda: F.scripted_actor(actions))
    assert diffs == [], diffs
    assert all(o.reward == 0.0 for o in outcomes)  # nothing was fixed


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", REAL_BACKENDS)
@_examples(4)
@given(index=st.integers(0, 10_000), rng=st.randoms(use_true_random=False))
def test_random_edits_agree_on_files_and_observations(backend, index, rng):
    _require(backend)
    task = _task("easy", index)
    actions = F.random_edit_actions(task, rng)
    _, diffs = F.compare(task, ["sim", backend], lambda: F.scripted_actor(actions))
    assert [d for d in diffs if d[1] not in ("verdict", "reward")] == [], diffs
    # Where the verdicts differ, the sim's judge is what differs from pytest; the real backends
    # agree with each other on everything (below).


@pytest.mark.docker
@pytest.mark.timeout(900)
@_examples(3)
@given(index=st.integers(0, 10_000), rng=st.randoms(use_true_random=False))
def test_local_and_docker_agree_on_everything(index, rng):
    _require("local")
    _require("docker")
    task = _task("easy", index)
    actions = F.random_edit_actions(task, rng)
    _, diffs = F.compare(task, ["local", "docker"], lambda: F.scripted_actor(actions))
    assert diffs == [], diffs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", REAL_BACKENDS)
def test_sandbox_killed_from_outside_truncates_the_episode(backend):
    """Through the env: the next step ends the episode as truncated, with a clear info message."""
    _require(backend)
    from compactrl.envs.code_env import CodeRepoEnv

    task = _task("easy", 0)
    env = CodeRepoEnv(task, backend=backend, sandbox_kwargs={"timeout_s": 20.0})
    try:
        env.reset(options={"task": task})
        obs, *_ = env.step("<tool>shell echo up</tool>")
        assert obs.startswith("up")
        sandbox = env._sandbox
        if backend == "local":
            from compactrl.sandbox.local import _ns_processes

            for pid in _ns_processes(sandbox.pid_namespace):
                with contextlib.suppress(ProcessLookupError):  # killing its init may have ended it already
                    os.kill(pid, signal.SIGKILL)
        else:
            sandbox._client.api.kill(sandbox.container_id)
        obs, reward, terminated, truncated, info = env.step("<tool>shell echo still-there</tool>")
        assert truncated and not terminated and reward == 0.0
        assert "sandbox_error" in info and "sandbox" in info["sandbox_error"], info
        assert "The sandbox failed" in obs
    finally:
        env.close()


@pytest.mark.timeout(300)
def test_agreement_benchmark_helpers_are_seeded():
    task = _task("easy", 3)
    assert F.random_edit_actions(task, random.Random(7)) == F.random_edit_actions(task, random.Random(7))
    assert F.noop_actions(task, random.Random(7))[-1] == "<tool>submit</tool>"
