import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """The tiny models here are too small to gain from intra-op threads, and with other jobs on the
    machine two threads wait on each other: one episode loop took 81 s with 2 threads and 15 s with
    1 at load average ~9 on 2 cores (about 1 s on a quiet machine either way)."""
    import torch

    torch.set_num_threads(1)
