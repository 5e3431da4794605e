"""run_on_ray: an experiment's cells as Ray tasks; a resumed run never re-runs a finished cell."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import ray.cloudpickle

from compactrl.distributed import run_on_ray

pytestmark = pytest.mark.timeout(120)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _cell(spec: dict) -> dict:
    """A cell as the experiments write one: the result to a temp file, then renamed into place."""
    with open(spec["log"], "a") as f:  # one line per run of the cell, from whichever worker ran it
        f.write(spec["name"] + "\n")
    if spec.get("fail"):
        raise RuntimeError(f"cell {spec['name']} failed")
    record = {"name": spec["name"], "value": spec["seed"] ** 2, "pid": os.getpid()}
    path = Path(spec["cell_path"])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)
    return record


def _specs(tmp_path: Path, n: int) -> list[dict]:
    return [{"name": f"arm{i % 2}__seed{i}", "seed": i, "cell_path": str(tmp_path / f"cell{i}.json"),
             "log": str(tmp_path / "runs.log")} for i in range(n)]


def _finished(spec: dict) -> bool:
    return Path(spec["cell_path"]).exists()


def test_cells_run_once_in_order_and_a_resume_skips_the_finished_ones(ray_cluster, tmp_path):
    specs = _specs(tmp_path, 6)
    for spec in specs[:2]:  # a first run got this far
        _cell(spec)
    results = run_on_ray(_cell, specs, max_concurrency=2, done=_finished, num_cpus=0.5)
    assert results[:2] == [None, None]
    assert [r["value"] for r in results[2:]] == [i * i for i in range(2, 6)]
    runs = (tmp_path / "runs.log").read_text().split()
    assert sorted(runs) == sorted(s["name"] for s in specs), "a cell ran twice or not at all"
    assert all(_finished(s) for s in specs)
    again = run_on_ray(_cell, specs, max_concurrency=2, done=_finished)
    assert again == [None] * 6 and (tmp_path / "runs.log").read_text().split() == runs


def test_a_failing_cell_stops_the_run_with_its_error(ray_cluster, tmp_path):
    specs = _specs(tmp_path, 2)
    specs[1]["fail"] = True
    with pytest.raises(RuntimeError, match="cell arm1__seed1 failed"):
        run_on_ray(_cell, specs, max_concurrency=1, num_cpus=0.5)
    with pytest.raises(ValueError, match="max_concurrency"):
        run_on_ray(_cell, specs, max_concurrency=0)


def test_wait_one_repeats_a_wait_that_raised_system_error_then_gives_up(monkeypatch):
    """Ray's ``CoreWorker.wait`` once raised ``SystemError`` in the driver as an actor died: the
    wait is repeated (it consumes nothing), and after ``retries`` repeats the error propagates."""
    from compactrl.distributed.cluster import wait_one

    calls = []

    def flaky_wait(refs, num_returns, timeout=None):  # ray.wait's signature
        calls.append(list(refs))
        if timeout is not None:
            return [], list(refs)  # nothing finished within the timeout
        if len(calls) <= 2:
            raise SystemError("<method 'wait' of 'ray._raylet.CoreWorker' objects> returned a result "
                              "with an exception set")
        return refs[1:2], refs[:1] + refs[2:]

    monkeypatch.setattr(ray, "wait", flaky_wait)
    assert wait_one({"a": 0, "b": 1, "c": 2}, retries=3) == "b"
    assert calls == [["a", "b", "c"]] * 3
    calls.clear()
    with pytest.raises(SystemError):
        wait_one(["a", "b"], retries=1)
    assert len(calls) == 2
    assert wait_one(["a", "b"], timeout=0.1) is None  # a wait that timed out finds nothing
