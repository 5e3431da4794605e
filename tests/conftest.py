import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _torch_threads():
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))



# Parallel runs (`pytest -n 2 --dist loadfile --no-loadscope-reorder`, what scripts/test.sh runs when
# pytest-xdist is there): each test file runs whole on one worker, so its module and session fixtures
# (tests/vllm/test_engine.py's engine per architecture, tests/distributed's local Ray) start once per
# file and worker. The workers take the files in the order below, longest first (as measured on 2
# cores), the rest in file order, so that no long file starts last.
_LONGEST_FIRST = ("tests/training/test_trainer.py", "tests/vllm/test_engine.py", "tests/vllm/test_train.py",
                  "tests/distributed/test_ray_collector.py", "tests/vllm/test_architectures.py",
                  "tests/distributed/test_no_leftovers.py", "tests/training/test_summary_keep_rate.py",
                  "tests/training/test_ablation.py", "tests/policies/test_transformers_policy.py")


# Every test's timeout (pytest-timeout: the ini's 300 s, or the test's own `timeout` mark) is a hang
# guard, not a speed target: it is multiplied by COMPACTRL_TEST_TIMEOUT_SCALE (default 3), so a CPU-bound
# test on a 2-core machine that other jobs load to 5-10 runnable processes per core still finishes,
# and a hang still ends. 1 gives the timeouts as written.
def _timeout_scale() -> float:
    raw = os.environ.get("COMPACTRL_TEST_TIMEOUT_SCALE", "3")
    try:
        scale = float(raw)
    except ValueError:
        raise pytest.UsageError(f"COMPACTRL_TEST_TIMEOUT_SCALE must be a number, got {raw!r}") from None
    if not scale > 0:
        raise pytest.UsageError(f"COMPACTRL_TEST_TIMEOUT_SCALE must be > 0, got {raw!r}")
    return scale


def pytest_configure(config):
    _timeout_scale()  # a bad value stops the run before any worker starts


def _scale_timeouts(config, items) -> None:
    scale = _timeout_scale()
    default = getattr(config, "_env_timeout", None)  # pytest-timeout's ini/command-line value
    for item in items:
        marker = item.get_closest_marker("timeout")
        timeout = marker.args[0] if marker is not None and marker.args else (
            marker.kwargs.get("timeout") if marker is not None else default)
        if timeout:  # None or 0: no timeout, left as it is
            rest = {k: v for k, v in (marker.kwargs.items() if marker is not None else ()) if k != "timeout"}
            item.add_marker(pytest.mark.timeout(float(timeout) * scale, **rest), append=False)


def pytest_collection_modifyitems(config, items):
    _scale_timeouts(config, items)
    if not hasattr(config, "workerinput"):  # not an xdist worker: one process, tests in file order
        return
    root = str(config.rootpath).replace("\\", "/").rstrip("/") + "/"
    rank = {path: i for i, path in enumerate(_LONGEST_FIRST)}
    # stable: the tests of a file stay in their order
    items.sort(key=lambda item: rank.get(str(item.path).replace("\\", "/").removeprefix(root), len(rank)))
