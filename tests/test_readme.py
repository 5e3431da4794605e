"""The README's Python snippets run, in order, as one program (the second continues the first), with the
training loop cut to one batch of two two-turn episodes with 16-token responses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALLER = {"total_batches=10": "total_batches=1", "episodes_per_batch=16": "episodes_per_batch=2",
           "max_new_tokens=256": "max_new_tokens=16",
           '[lambda: gym.make("CompactCode-v0")] * 8': '[lambda: gym.make("CompactCode-v0", max_turns=2)] * 2'}


def readme_program() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.DOTALL)
    program = "\n".join(blocks)
    for old, new in SMALLER.items():
        assert old in program, f"README.md no longer says {old!r}; update SMALLER"
        program = program.replace(old, new)
    return program


@pytest.mark.timeout(600)
def test_the_readme_snippets_run(tmp_path):
    script = tmp_path / "readme.py"
    script.write_text(readme_program())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=580)
    assert done.returncode == 0, done.stderr[-3000:]
