"""The suite's timeouts are hang guards scaled by COMPACTRL_TEST_TIMEOUT_SCALE (tests/conftest.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCALE = float(os.environ.get("COMPACTRL_TEST_TIMEOUT_SCALE", "3"))


@pytest.mark.timeout(7)
def test_a_marked_timeout_is_scaled(request):
    marker = request.node.get_closest_marker("timeout")
    assert marker.args[0] == pytest.approx(7 * SCALE)


def test_the_default_timeout_is_scaled(request):
    marker = request.node.get_closest_marker("timeout")
    assert marker.args[0] == pytest.approx(request.config._env_timeout * SCALE)


@pytest.mark.parametrize("raw", ["fast", "-2"])
def test_a_bad_scale_stops_the_run_and_names_the_variable(raw):
    env = {**os.environ, "COMPACTRL_TEST_TIMEOUT_SCALE": raw}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          f"{Path(__file__).name}::test_the_default_timeout_is_scaled"],
                         cwd=Path(__file__).parent, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
    assert "COMPACTRL_TEST_TIMEOUT_SCALE" in out.stdout + out.stderr
