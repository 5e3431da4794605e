"""Terminal-Bench 1.x and 2.x folders: the image's work dir and files (binary, COPY into a subfolder,
RUN rm), the per-task reasons only an image honours, grading by the task's own script and reward
file, one line per bad task; gold succeeds and noop fails through ``compactrl eval``."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from loader_helpers import FIXTURES, local_unavailable

from compactrl.cli import main
from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.sandbox._common import file_bytes
from compactrl.tasksets.terminal_bench.folders import (
    TerminalBenchConfig,
    TerminalBenchError,
    load_task_dir,
    load_terminal_bench,
)

pytestmark = pytest.mark.timeout(300)
TB = os.path.join(FIXTURES, "terminal_bench")
PAYLOAD, TOML_TASK, BAD = (os.path.join(TB, n) for n in ("decode-payload", "sum-numbers", "bad"))


def test_dockerfile_effects_on_the_work_dir() -> None:
    task = load_task_dir(PAYLOAD)
    assert task.runtime.workdir == "/app"  # inherited from the Terminal-Bench base image
    # COPY into a subfolder; answer.txt is copied, then removed by RUN rm; tests and solution never copied
    assert sorted(task.files) == ["notes/readme.txt", "payload/blob.bin"]
    with open(os.path.join(PAYLOAD, "payload", "blob.bin"), "rb") as fh:
        raw = fh.read()
    assert b"\xff" in raw and file_bytes(task.files["payload/blob.bin"]) == raw  # byte-exact
    assert _roundtrip(task).files == task.files
    # its apt-get install of a package this machine has is mapped; the rest is replayed locally
    assert list(task.grading.image_only) == [] and not task.grading.not_gradable
    assert list(task.grading.local_notes) == ["apt-get install xxd: installed on this machine"]
    steps = task.build.plan["steps"]
    assert [s.get("command") for s in steps] == [
        " true && true && true ", None, "rm -f /app/notes/answer.txt && chmod 0444 /app/payload/blob.bin"]
    # the copy the later `rm` removes is replayed in its place (a step between could read it)
    assert steps[1] == {"op": "copy_out", "pairs": [["notes/answer.txt", "/app/notes/answer.txt"]]}


def _roundtrip(task):
    from compactrl.task import Task

    return Task.from_json(task.to_json())


def test_toml_task_fields_and_reward_grading() -> None:
    task = load_task_dir(TOML_TASK)
    assert task.instruction.startswith("The CSV files under /app/data/batch/")
    assert (task.time_limit_s, task.check.timeout_s, task.check.kind) == (120.0, 60.0, "harbor")
    assert sorted(task.files) == ["data/batch/a.csv", "data/batch/b.csv"] and task.runtime.workdir == "/app"
    assert task.origin["terminal_bench"] == {"difficulty": "easy", "category": "data-processing", "tags": ["csv"],
                                               "author_name": "compactrl maintainers",
                                               "allow_internet": False, "version": 2}
    assert "tail -q -n +2" in task.reference.solution_sh
    # the test script as published (it goes to /tests), and a copy pointed into the work dir for a
    # sandbox whose root is read-only
    with open(os.path.join(TOML_TASK, "tests", "test.sh")) as fh:
        assert task.check.hidden_files[".tbench_tests/test.sh"] == fh.read()
    script = task.check.hidden_files[".tbench_run/rw/test.sh"]
    assert "/logs/verifier" not in script.replace("/.tbench_logs/verifier", "")
    assert "${TBENCH_ROOT}/.tbench_tests/test_outputs.py" in script and "cd /app" in script


def _copy_appending(tmp_path, source: str, rel: str, text: str) -> str:
    """A copy of the task folder ``source`` with ``text`` appended to its file ``rel``."""
    folder = str(tmp_path / "t")
    shutil.copytree(source, folder)
    with open(os.path.join(folder, rel), "a") as fh:
        fh.write(text)
    return folder


def test_network_test_script_falls_back_to_pytest(tmp_path) -> None:
    folder = _copy_appending(tmp_path, TOML_TASK, "tests/test.sh", "curl -LsSf https://astral.sh/uv/install.sh | sh\n")
    task = load_task_dir(folder)
    assert task.check.kind == "pytest" and "-m pytest" in task.check.command
    assert task.grading.note.startswith("tests/test.sh installs from the network (curl)")
    forced = load_task_dir(folder, TerminalBenchConfig(grading="script"))
    assert forced.check.kind == "harbor" and '"$TEST_DIR/test.sh" ) > "$V/test-stdout.txt"' in forced.check.command


def test_copy_outside_the_work_dir_is_a_reason(tmp_path) -> None:
    folder = _copy_appending(tmp_path, TOML_TASK, "environment/Dockerfile", "COPY data/batch/a.csv /opt/ref/a.csv\n")
    task = load_task_dir(folder)
    # the local backend replays it into its private writable /opt (no reason left)
    assert list(task.grading.image_only) == [] and not task.grading.not_gradable
    assert task.build.plan["steps"] == [
        {"op": "copy_out", "pairs": [["data/batch/a.csv", "/opt/ref/a.csv"]]}]


def test_two_run_tests_scripts_do_not_overwrite_each_other(tmp_path) -> None:
    folder = _copy_appending(tmp_path, PAYLOAD, "tests/run-tests.sh", "echo from-tests-folder\n")
    hidden = load_task_dir(folder).check.hidden_files
    assert hidden[".tbench_tests/run-tests.sh"] == "echo from-tests-folder\n"
    assert hidden[".tbench_run/run-tests.sh"].startswith("#!/bin/bash\n# Graded by this script")


def test_a_set_loads_good_tasks_and_reports_each_bad_one_in_a_line(tmp_path) -> None:
    root = str(tmp_path / "set")
    shutil.copytree(BAD, root)
    shutil.copytree(TOML_TASK, os.path.join(root, "sum-numbers"))
    problems: list[str] = []
    tasks = load_terminal_bench(root, problems=problems)
    assert [t.id for t in tasks] == ["sum-numbers"]
    lines = {p.split(": ", 1)[0].replace(root + "/", ""): p.split(": ", 1)[1] for p in problems}
    assert all("\n" not in p and "Traceback" not in p for p in problems)
    assert lines["yaml-syntax/task.yaml"].startswith("line 3: YAML syntax error")
    assert lines["yaml-unknown-key/task.yaml"] == "max_agent_timout_sec: unknown key (did you mean max_agent_timeout_sec?)"
    assert lines["toml-syntax/task.toml"].startswith("syntax: TOML syntax error")
    assert lines["toml-wrong-type/task.toml"] == "verifier.timeout_sec: must be a number, got 'ten'"
    assert lines["no-task-file"].startswith("task file: no task.yaml (1.x) or task.toml (2.x)")
    assert len(problems) == 5
    with pytest.raises(TerminalBenchError, match="no loadable task"):
        load_terminal_bench(BAD)


@pytest.mark.parametrize("folder", [PAYLOAD, TOML_TASK], ids=["1.x-binary-rm-script", "2.x-reward"])
def test_gold_succeeds_and_noop_fails_through_the_cli(folder: str, capsys) -> None:
    if local_unavailable():
        pytest.skip(local_unavailable())
    results = {}
    for policy in ("gold", "noop"):
        assert main(["eval", "--tasks", folder, "--backend", "local", "--policy", policy, "--json"]) == 0
        results[policy] = json.loads(capsys.readouterr().out)["episodes"][0]
    gold, noop = results["gold"], results["noop"]
    assert gold["success"] and gold["sandbox_error"] is None, gold
    assert not noop["success"] and noop["sandbox_error"] is None, noop
    assert gold["info"]["test_summary"].startswith("Tests: 2 passed, 0 failed"), gold["info"]
    # the verdict names the failing tests
    assert "test_outputs.py::test_" in json.dumps(noop["info"]), noop["info"]


def test_eval_cli_on_a_set_reports_bad_tasks_notes_and_grading(tmp_path, capsys, caplog) -> None:
    if local_unavailable():
        pytest.skip(local_unavailable())
    root = str(tmp_path / "set")
    shutil.copytree(BAD, root)
    shutil.copytree(PAYLOAD, os.path.join(root, "decode-payload"))
    out = str(tmp_path / "episodes.jsonl")
    argv = ["eval", "--tasks", root, "--backend", "local", "--policy", "gold", "--tb-grading", "pytest", "--out", out]
    with caplog.at_level("WARNING", logger="compactrl.tasksets.terminal_bench.folders"):
        assert main(argv) == 0
    table = capsys.readouterr().out
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped task: ")]
    assert len(skipped) == 5 and all("\n" not in m for m in skipped)
    assert table.startswith("ok   decode-payload") and "notes=apt-get install xxd: installed" in table.splitlines()[0]
    with open(out) as fh:
        [record] = [json.loads(line) for line in fh]
    assert record["success"] and record["task_notes"][0] == "apt-get install xxd: installed on this machine"


def test_image_only_notes_are_left_out_where_the_docker_backend_builds_the_tasks_image() -> None:
    from compactrl.collectors.episodes import EpisodeStats
    from compactrl.eval.tasks import _record

    task = load_task_dir(PAYLOAD)
    assert task.grading.local_notes and task.runtime.image_build
    notes = task.grading.local_notes
    assert _record(0, task, EpisodeStats(0, 0, 0), builds_images=False)["task_notes"][:len(notes)] == list(notes)
    assert not set(notes) & set(_record(0, task, EpisodeStats(0, 0, 0), builds_images=True).get("task_notes", ()))


def test_compose_services_besides_the_client_are_a_reason(tmp_path) -> None:
    extra = "  db:\n    image: postgres:16\n"
    task = load_task_dir(_copy_appending(tmp_path, PAYLOAD, "docker-compose.yaml", extra))
    assert task.grading.image_only[-1] == "needs its image: docker-compose services db (not started)"
    assert task.build.error == "needs its image: docker-compose services db (not started)" and task.build.plan is None
    local = load_task_dir(_copy_appending(tmp_path / "b", PAYLOAD, "docker-compose.yaml", extra),
                          TerminalBenchConfig(backend="local"))
    assert local.grading.not_gradable == "needs its image: docker-compose services db (not started)"
    assert sorted(task.files) == ["notes/readme.txt", "payload/blob.bin"]  # the client's Dockerfile still read


def test_an_unknown_key_that_is_no_misspelling_is_ignored_and_listed(tmp_path) -> None:
    yaml_task = load_task_dir(_copy_appending(tmp_path / "a", PAYLOAD, "task.yaml", "author: someone\n"))
    assert yaml_task.origin["ignored_keys"] == ["author"]  # published 1.x folders carry it
    toml_task = load_task_dir(_copy_appending(tmp_path / "b", TOML_TASK, "task.toml", "[verifier.env]\nX = '1'\n"))
    assert toml_task.origin["ignored_keys"] == []
    extra = load_task_dir(_copy_appending(tmp_path / "c", TOML_TASK, "task.toml", "[agent.extra]\n"))
    assert extra.origin["ignored_keys"] == ["agent.extra"]


def test_an_unreadable_file_makes_one_task_bad_not_the_set(tmp_path) -> None:
    root = str(tmp_path / "set")
    shutil.copytree(TOML_TASK, os.path.join(root, "good"))
    shutil.copytree(TOML_TASK, os.path.join(root, "broken"))
    os.symlink("/nonexistent/target", os.path.join(root, "broken", "environment", "data", "batch", "c.csv"))
    problems: list[str] = []
    assert [t.id for t in load_terminal_bench(root, problems=problems)] == ["good"]
    assert len(problems) == 1 and problems[0].startswith(f"{root}/broken: (files): FileNotFoundError")


def test_dockerfile_heredocs(tmp_path) -> None:
    """BuildKit heredocs: ``COPY <<EOT dest`` gives the file its body; ``RUN <<EOF`` runs its body."""
    folder = _copy_appending(tmp_path, TOML_TASK, "environment/Dockerfile",
                             "COPY <<EOT /app/notes/a.txt\nfirst line\n  # not a comment here\nEOT\n"
                             "COPY <<-EOT /opt/ref/b.txt\n\tindented\n\tEOT\n"
                             "RUN <<EOF\nmkdir -p /app/made\necho made > /app/made/x\nEOF\n")
    task = load_task_dir(folder)
    assert task.files["notes/a.txt"] == "first line\n  # not a comment here\n"
    steps = task.build.plan["steps"]
    assert {"op": "copy_out", "pairs": [["<inline>/opt/ref/b.txt", "/opt/ref/b.txt"]],
            "inline": {"/opt/ref/b.txt": "indented\n"}} in steps
    assert steps[-1]["op"] == "run" and steps[-1]["command"] == "mkdir -p /app/made\necho made > /app/made/x"



# A 1.x task whose run-tests.sh holds its tests (the harness copies tests/ only where there is one): it
# writes a test file and runs pytest on it, as the SWE-bench-style tasks of the official set do.
_INLINE_RUN_TESTS = """#!/bin/bash
cat > /tmp/inline_test.py << 'END'
import pathlib

def test_answer():
    assert pathlib.Path("answer.txt").read_text().strip() == "42"
END
python -m pytest -rA -p no:cacheprovider /tmp/inline_test.py
"""


def _inline_task(tmp_path, run_tests: str) -> str:
    folder = tmp_path / "inline"
    folder.mkdir(parents=True)
    (folder / "task.yaml").write_text("instruction: Write 42 to answer.txt.\nparser_name: pytest\n")
    (folder / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\n")
    (folder / "solution.sh").write_text("echo 42 > answer.txt\n")
    (folder / "run-tests.sh").write_text(run_tests)
    return str(folder)


def test_a_1x_task_without_tests_folder_is_graded_by_its_run_tests_script(tmp_path) -> None:
    folder = _inline_task(tmp_path, _INLINE_RUN_TESTS)
    task = load_task_dir(folder)
    assert task.grading.mode == "script" and not task.grading.not_gradable
    assert not any(k.startswith(".tbench_tests/") for k in task.check.hidden_files)
    if local_unavailable():
        pytest.skip(local_unavailable())
    local = load_task_dir(folder, TerminalBenchConfig(backend="local"))
    gold, noop = run_task(local, GoldPolicy(), "local"), run_task(local, NoopPolicy(), "local")
    assert gold["success"] and gold["info"]["test_summary"].startswith("Tests: 1 passed, 0 failed"), gold["info"]
    assert not noop["success"] and noop["sandbox_error"] is None, noop["info"]


def test_a_network_run_tests_script_without_tests_folder_is_flagged_on_every_backend(tmp_path) -> None:
    folder = _inline_task(tmp_path, "curl -fsSL https://example.org/cases.csv -o cases.csv\n" + _INLINE_RUN_TESTS)
    for config in (TerminalBenchConfig(), TerminalBenchConfig(backend="local")):
        task = load_task_dir(folder, config)
        assert task.grading.not_gradable == (
            "needs network at test time: run-tests.sh installs from the network (curl), and the task has no "
            "tests/ for pytest to run instead")
    # an install this machine has already done is no network for the local backend (its script runs offline)
    offline = _inline_task(tmp_path / "o", "apt-get update && apt-get install -y bash\n" + _INLINE_RUN_TESTS)
    assert load_task_dir(offline).grading.not_gradable
    assert not load_task_dir(offline, TerminalBenchConfig(backend="local")).grading.not_gradable


def test_a_1x_task_needs_tests_or_a_run_tests_script(tmp_path) -> None:
    folder = _inline_task(tmp_path, "")
    os.remove(os.path.join(folder, "run-tests.sh"))
    with pytest.raises(TerminalBenchError, match="no tests/ folder with the task's tests and no run-tests.sh"):
        load_task_dir(folder)
