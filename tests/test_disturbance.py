"""Load from outside a trial's window is measured, its own work is not counted."""

import os
import subprocess
import sys
import time

from autotune.disturbance import CpuWatch, verdict


def burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_another_process_burning_a_core_is_seen(outside_hogs):
    outside_hogs(1)
    watch = CpuWatch()
    watch.start()
    time.sleep(1.5)
    m = watch.stop(1.5)
    assert m["host_other_cpu_frac"] > 0.6 / os.cpu_count()  # one busy core of the host's
    assert "other processes used" in verdict({**m, "host_other_cpu_frac": max(m["host_other_cpu_frac"], 0.3)})
    assert verdict({**m, "host_other_cpu_frac": 0.9}, "cuda") is None  # on a GPU the device decides


def test_the_trials_own_work_and_its_workers_are_not_outside_load():
    def window(work: bool) -> float:
        # a loader-worker-like child, alive for the whole window as a trial's workers are
        child_code = "import time\nend = time.perf_counter() + 2.5\nwhile time.perf_counter() < end: pass"
        watch = CpuWatch()
        worker = subprocess.Popen([sys.executable, "-c", child_code]) if work else None
        watch.start()
        burn(1.5) if work else time.sleep(1.5)
        m = watch.stop(1.5)
        if worker:
            worker.wait()
        return m["host_other_cpu_frac"]

    # whatever else the machine is doing, the trial's own CPU time adds nothing to "outside"
    assert window(work=True) < window(work=False) + 0.2
    assert verdict({"host_other_cpu_frac": 0.1}) is None
