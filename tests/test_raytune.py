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
    30 s ("the node timed out during startup"): init_ray makes TMPDIR absolute. The Ray it started and stopped
    leaves no session dir behind (a README walk: one per search under /tmp/ray)."""
    tmp_path = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths have a length limit
    (tmp_path / "tmp").mkdir()
    code = (
        "import os, ray; from autotune.execution import raytune as RT; RT.init_ray(None); "
        "print(ray.cluster_resources().get('CPU'), os.environ['TMPDIR'], ray._private.worker._global_node"
        ".get_session_dir_path()); RT.shutdown_ray()"
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
        cpus, tmpdir, session = proc.stdout.split()[-3:]
        assert float(cpus) >= 1 and tmpdir == str(tmp_path / "tmp")
        assert Path(session).parent == tmp_path / "tmp" / "ray"  # Ray's files went where TMPDIR says ...
        assert list((tmp_path / "tmp" / "ray").glob("session_*")) == []  # ... and the stopped Ray's are gone
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
