"""The measurement scripts run on a CPU (GPU parts skipped) and end with one JSON line."""

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.timeout(300)
def test_gpu_check_runs_on_cpu_and_reports_fidelity():
    env = {**os.environ, "PYTHON": sys.executable, "REPS": "2", "FIDELITY_ARGS": "--min-window-s 0.3 --max-window-s 1"}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], capture_output=True, text=True, env=env, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    fidelity = report["fidelity"]
    assert fidelity["device_type"] == "cpu" and fidelity["reps"] == 2
    for key in ("cv_throughput", "trial_vs_plain_ratio", "profiler_overhead"):
        assert isinstance(fidelity[key], float), key
    assert 0.5 < fidelity["trial_vs_plain_ratio"] < 2  # the same job, measured two ways
    assert report["classic"] == {"skipped": "no CUDA device"}
    assert "throughput CV over 2 fresh trials" in proc.stderr
