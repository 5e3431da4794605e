"""One process at a time trains into a run directory: a second (a resume started while the run goes on)
stops with a ValueError naming the holder, the kernel frees the directory when its holder dies, and a
run that fails before writing anything leaves no directory behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from compactrl.training.config import preset
from compactrl.training.run_dir import RunDir
from compactrl.training.trainer import train


def test_a_second_holder_in_the_same_process_is_refused(tmp_path):
    with RunDir(tmp_path / "run").claimed():
        with pytest.raises(ValueError, match=r"out: .* in use by another training process \(pid \d+ on "):
            with RunDir(tmp_path / "run").claimed():
                pass
    with RunDir(tmp_path / "run").claimed():  # released at the end of the block
        pass


def test_a_run_held_by_another_process_is_refused_until_that_process_dies(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from compactrl.training.run_dir import RunDir\n"
         f"with RunDir({str(out)!r}).claimed():\n    print('held', flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=f"pid {holder.pid} "):
            train(preset("smoke"), out)
        assert not (out / "config.json").exists()  # refused before anything was written
    finally:
        holder.kill()
        holder.wait()
    with RunDir(out).claimed():  # the kernel dropped the dead holder's lock
        pass


def test_a_resume_of_nothing_leaves_no_directory(tmp_path):
    with pytest.raises(ValueError, match="has no config.json"):
        train(preset("smoke"), tmp_path / "missing", resume=True)
    assert not (tmp_path / "missing").exists()
