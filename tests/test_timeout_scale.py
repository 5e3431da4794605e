"""The suite's timeouts are hang guards scaled by COMPACTRL_TEST_TIMEOUT_SCALE (tests/conftest.py)."""

import pytest
from conftest import _timeout_scale


@pytest.mark.timeout(7)
def test_a_marked_timeout_is_scaled(request):
    marker = request.node.get_closest_marker("timeout")
    assert marker.args[0] == pytest.approx(7 * _timeout_scale())


def test_the_default_timeout_is_scaled(request):
    marker = request.node.get_closest_marker("timeout")
    assert marker.args[0] == pytest.approx(request.config._env_timeout * _timeout_scale())


@pytest.mark.parametrize("raw", ["fast", "0", "-2"])
def test_a_bad_scale_is_a_usage_error(monkeypatch, raw):
    monkeypatch.setenv("COMPACTRL_TEST_TIMEOUT_SCALE", raw)
    with pytest.raises(pytest.UsageError, match="COMPACTRL_TEST_TIMEOUT_SCALE"):
        _timeout_scale()
