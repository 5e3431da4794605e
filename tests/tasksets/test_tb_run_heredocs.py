"""A Dockerfile ``RUN`` whose command reads a here-document (``RUN cat > /app/main.go << 'GO'``, BuildKit's
syntax) writes the body as the image's build does: parsed with its terminator, kept whole when the
step's segments are classified, and replayed in the real local sandbox."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from loader_helpers import local_unavailable, write_tb_task

from compactrl.eval import run_task
from compactrl.policies.scripted.gold import GoldPolicy, NoopPolicy
from compactrl.tasksets.terminal_bench import local_build as tlb
from compactrl.tasksets.terminal_bench.dockerfile import _instructions
from compactrl.tasksets.terminal_bench.folders import TerminalBenchConfig, load_task_dir

BODY = 'package main\nimport "fmt"\n// it\'s && not; a | command\nfunc main() { fmt.Println("hi") }'


def test_a_run_heredoc_keeps_its_body_and_terminator() -> None:
    steps = _instructions(f"FROM x\nRUN cat > /app/main.go << 'GO'\n{BODY}\nGO\nRUN echo hi\n"
                          "RUN <<EOF\necho script\nEOF\nRUN cat <<-A > f && cat <<B > g\n\tx\n\tA\ny\nB\n")
    assert steps == [("FROM", "x"), ("RUN", f"cat > /app/main.go << 'GO'\n{BODY}\nGO"), ("RUN", "echo hi"),
                     ("RUN", "<<EOF\necho script"), ("RUN", "cat <<-A > f && cat <<B > g\nx\nA\ny\nB")]


def test_segments_keep_a_heredoc_body_whole_when_asked() -> None:
    command = f"cat > /app/main.go << 'GO'\n{BODY}\nGO\necho done && cat <<< hi"
    assert tlb.split_segments(command, heredocs=True) == [
        (f"cat > /app/main.go << 'GO'\n{BODY}\nGO", "\n"), ("echo done ", "&&"), (" cat <<< hi", "")]
    # without, every body line is looked at (what a solution writes into a script it then runs)
    assert tlb.split_segments(command)[:2] == [("cat > /app/main.go << 'GO'", "\n"), ("package main", "\n")]


@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))
def test_files_a_run_heredoc_writes_are_in_the_replayed_state(tmp_path: Path, cache) -> None:
    folder = write_tb_task(
        tmp_path / "heredoc-input", instruction="Write the line count of /app/notes.txt to /app/count.txt.",
        dockerfile=("FROM python:3.12-slim\nWORKDIR /app\nRUN cat > /app/notes.txt << 'EOF'\none && two\nit's three\n"
                    "EOF\nRUN mkdir -p /app/src && cat > /app/src/gen.py <<-PY\n\tprint(len(open('notes.txt')"
                    ".readlines()))\n\tPY\n"),
        solution="python3 src/gen.py > count.txt\n",
        tests="def test_count():\n    assert open('/app/count.txt').read().strip() == '2'\n")
    task = load_task_dir(folder, TerminalBenchConfig(backend="local", prepare=True))
    work = os.path.join(task.runtime.state, "work")
    assert open(os.path.join(work, "notes.txt")).read() == "one && two\nit's three\n"
    assert open(os.path.join(work, "src", "gen.py")).read() == "print(len(open('notes.txt').readlines()))\n"
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert not noop["success"] and noop["sandbox_error"] is None


@pytest.mark.timeout(300)
@pytest.mark.skipif(bool(local_unavailable()), reason=str(local_unavailable()))
def test_a_run_before_any_workdir_runs_in_the_base_images_workdir(tmp_path: Path, cache) -> None:
    # t-bench's base images set WORKDIR /app: a RUN before the Dockerfile's own WORKDIR runs there (coq's
    # `apt-get install` in prove-plus-comm), so the replay makes /app as the base image has it
    folder = write_tb_task(
        tmp_path / "inherited-workdir", instruction="Copy /app/made.txt to /workspace/out.txt.",
        dockerfile=("FROM ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624\nRUN pwd > made.txt\n"
                    "WORKDIR /workspace\n"),
        solution="cp /app/made.txt out.txt\n",
        tests="def test_out():\n    assert open('/workspace/out.txt').read().strip() == '/app'\n")
    task = load_task_dir(folder, TerminalBenchConfig(backend="local", prepare=True))
    assert "/app" in task.runtime.writable_paths, task.grading.not_gradable
    gold, noop = run_task(task, GoldPolicy(), "local"), run_task(task, NoopPolicy(), "local")
    assert gold["success"], gold["info"]["test_log_tail"]
    assert not noop["success"] and noop["sandbox_error"] is None
