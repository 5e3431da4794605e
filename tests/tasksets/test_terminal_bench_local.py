"""Terminal-Bench folders graded right on the local backend: a 2.x verifier written in Python, input
made by a Dockerfile ``RUN`` step, a resource limit hit and named, a task that needs its image flagged
before any episode, a verifier past its timeout recorded as one, a noop that ends with its verifier."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from loader_helpers import FIXTURES, local_unavailable

from compactrl.cli import main
from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.sandbox.base import SandboxError
from compactrl.sandbox.local import LocalSandbox
from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig, load_task_dir

pytestmark = [pytest.mark.timeout(600), pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))]

LOCAL = os.path.join(FIXTURES, "terminal_bench_local")


def _load(name: str, cache: str, **options):
    return load_task_dir(os.path.join(LOCAL, name),
                         TerminalBenchConfig(backend="local", prepare=True, local_cache=cache, **options))


def _gold_and_noop(task):
    return run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")


def test_a_python_verifier_writes_the_reward_itself(cache) -> None:
    task = _load("python-verifier", cache)
    assert task.check.kind == "harbor" and task.check.timeout_s == 600.0
    gold, noop = _gold_and_noop(task)
    assert gold["success"], gold["info"]["test_log_tail"]
    assert gold["info"]["test_log_tail"].endswith("[verdict: success: reward.txt: reward=1]")
    assert not noop["success"] and noop["sandbox_error"] is None
    assert noop["info"]["test_log_tail"].endswith("[verdict: failure: reward.txt: reward=0]")
    # a noop ends when its verifier ends, far before the 600 s verifier timeout
    assert noop["info"]["test_timed_out"] is False and noop["info"]["test_exit_code"] == 0


def test_input_made_by_a_dockerfile_run_step(cache) -> None:
    task = _load("generated-input", cache)
    build = task.build.plan
    assert "/opt" in build["roots"] and build["env"]["DATA_SEED"] == "20250620"
    assert list(task.grading.local_notes) == ["apt-get install tmux asciinema: installed on this machine except asciinema "
                                            "(terminal session tools, used by no grader)"]
    assert os.path.isfile(os.path.join(task.runtime.state, "work", "data", "readings.csv"))
    gold, noop = _gold_and_noop(task)
    assert gold["success"], gold["info"]["test_log_tail"]
    # the generated input and the reference outside the work dir are there for noop too; only the report is missing
    assert not noop["success"] and "PASSED ../tests/test_outputs.py::test_input_was_generated" in noop["info"]["test_output"]
    # without the replayed step the input would be missing: the state is what made the difference
    bare = load_task_dir(os.path.join(LOCAL, "generated-input"))
    assert "data/readings.csv" not in bare.files


def test_the_state_is_cached_per_task_and_dockerfile(cache, tmp_path) -> None:
    first = _load("generated-input", cache).runtime.state
    assert _load("generated-input", cache).runtime.state == first
    folder = str(tmp_path / "generated-input")
    shutil.copytree(os.path.join(LOCAL, "generated-input"), folder)
    with open(os.path.join(folder, "Dockerfile"), "a") as fh:
        fh.write("ENV EXTRA=1\n")
    changed = load_task_dir(folder, TerminalBenchConfig(backend="local", prepare=True, local_cache=cache))
    assert changed.runtime.state != first


def test_a_sparse_file_past_256_mib_passes_by_default_and_a_lower_limit_is_named(cache) -> None:
    task = _load("sparse-file", cache)
    assert task.runtime.limits.file_size_bytes == 32 << 30
    gold = run_task(task, GoldPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    low = _load("sparse-file", cache, file_size_bytes=128 << 20)
    gold = run_task(low, GoldPolicy(), "local")
    assert not gold["success"]
    assert gold["info"]["test_limit_hit"] == "file size limit 128 MiB (RLIMIT_FSIZE, file_size_bytes)"
    assert "[sandbox limit hit: file size limit 128 MiB" in gold["info"]["test_log_tail"]


def test_a_task_that_needs_its_image_is_flagged_before_any_episode(cache, capsys) -> None:
    folder = os.path.join(LOCAL, "needs-image")
    task = _load("needs-image", cache)
    reason = ("needs its image: RUN apt-get update && apt-get install -y compactrl-absent-tool "
              "(apt packages not installed on this machine: compactrl-absent-tool; `compactrl tasks validate "
              "--install-system-packages` installs them here)")
    assert task.grading.not_gradable == reason
    # the docker backend builds the image, so only a local load flags it; the local sandbox refuses it anyway
    other = load_task_dir(folder, TerminalBenchConfig(backend="docker"))
    assert not other.grading.not_gradable and other.build.error == reason and other.build.plan is None
    with pytest.raises(SandboxError, match="needs its image: RUN apt-get"):
        LocalSandbox().start(other)
    # eval reports it and grades nothing; so does `tasks validate` (exit status 1)
    assert main(["eval", "--tasks", folder, "--backend", "local", "--policy", "gold"]) == 0
    assert f"SKIP needs-image  not gradable: {reason}" in capsys.readouterr().out
    assert main(["tasks", "validate", folder, "--backend", "local"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("SKIP  needs-image  terminal") and f"not gradable: {reason}" in out


def test_a_verifier_past_its_timeout_is_recorded_as_one(cache) -> None:
    task = _load("slow-verifier", cache)
    assert task.check.timeout_s == 3.0
    gold = run_task(task, GoldPolicy(), "local")
    assert not gold["success"] and gold["info"]["test_timed_out"] is True and gold["info"]["test_exit_code"] == 124
    assert "the verifier ran past verifier.timeout_sec" in gold["info"]["test_log_tail"]


def test_validate_takes_terminal_bench_folders(cache, tmp_path, capsys) -> None:
    root = str(tmp_path / "set")
    for name in ("python-verifier", "sparse-file"):
        shutil.copytree(os.path.join(LOCAL, name), os.path.join(root, name))
    report = str(tmp_path / "report.json")
    assert main(["tasks", "validate", root, "--backend", "local", "--json-out", report]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ok    python-verifier  terminal") and lines[1].startswith("ok    sparse-file  terminal")
    with open(report) as fh:
        data = json.load(fh)
    assert data["ok"] == data["total"] == 2
    rec = data["tasks"][0]
    assert rec["gold"]["exit_code"] == 0 and rec["noop"]["timed_out"] is False and "reward=0" in rec["noop"]["log_tail"]


def test_validate_names_a_task_published_without_a_reference_solution(tmp_path, capsys) -> None:
    # Harbor tasks may come without solution/ (the oracle agent then fails): nothing for gold to run
    folder = str(tmp_path / "no-solution")
    shutil.copytree(os.path.join(LOCAL, "python-verifier"), folder)
    shutil.rmtree(os.path.join(folder, "solution"))
    assert main(["tasks", "validate", folder, "--backend", "local"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("SKIP  no-solution  terminal") and "no reference solution as published" in out


def test_validate_names_a_reference_solution_that_is_only_comments(tmp_path, capsys) -> None:
    folder = str(tmp_path / "placeholder")
    shutil.copytree(os.path.join(LOCAL, "python-verifier"), folder)
    with open(os.path.join(folder, "solution", "solve.sh"), "w") as fh:
        fh.write("#!/bin/bash\n# This is a template solution script.\n\n# UNKNOWN\n")
    assert main(["tasks", "validate", folder, "--backend", "local"]) == 1
    assert "no reference solution as published: its script has no command (comments only)" in capsys.readouterr().out
