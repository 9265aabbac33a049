"""autotune.execution.raytune: starting the local Ray a search runs on."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def test_a_local_ray_starts_under_a_relative_tmpdir():
    """Ray puts its sockets under $TMPDIR/ray; under a relative TMPDIR its raylet
    took the socket path for a TCP address and aborted, and ray.init gave up after
    30 s ("the node timed out during startup"): init_ray makes TMPDIR absolute."""
    tmp_path = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths have a length limit
    (tmp_path / "tmp").mkdir()
    code = (
        "import os, ray; from autotune.execution import raytune as RT; RT.init_ray(None); "
        "print(ray.cluster_resources().get('CPU'), os.environ['TMPDIR']); RT.shutdown_ray()"
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=90,
            env={**os.environ, "TMPDIR": "tmp", "PYTHONPATH": str(Path(__file__).parent.parent)},
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        cpus, tmpdir = proc.stdout.split()[-2:]
        assert float(cpus) >= 1 and tmpdir == str(tmp_path / "tmp")
        assert list((tmp_path / "tmp" / "ray").glob("session_*"))  # Ray's files went where TMPDIR says
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
