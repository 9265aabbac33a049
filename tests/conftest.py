import os
import shutil
import tempfile

import pytest

# Every Ray socket on 127.0.0.1, no usage reporting, no token warning (DESIGN.md facts)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole test run (ray.init costs ~5 s)."""
    import ray

    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths have a length limit
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, _temp_dir=temp,
             logging_level="ERROR")
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
