import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """These tests run many tiny ops: one thread avoids OpenMP barrier stalls on a shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
