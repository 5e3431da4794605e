import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    """One private local Ray (2 CPUs, loopback, no dashboard) for the whole test session; yields its temp dir."""
    from compactrl.distributed import local_ray

    with local_ray(num_cpus=2, object_store_bytes=128 * 1024**2) as temp_dir:
        yield temp_dir
