"""Fixtures for the real sandboxes (see ``sandbox_helpers`` for what each needs)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sandbox_helpers import REAL_BACKENDS, make_backend, small_task


@pytest.fixture(params=REAL_BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def sandbox(backend) -> Iterator:
    """A started sandbox (local or docker) on ``small_task()``; closed afterwards."""
    sb = make_backend(backend)
    sb.start(small_task())
    try:
        yield sb
    finally:
        sb.close()
