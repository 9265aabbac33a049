"""Load from outside a trial's window is measured, its own work is not counted."""

import subprocess
import sys
import time

from autotune.disturbance import CpuWatch, verdict


def burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_another_process_burning_a_core_is_seen():
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        watch = CpuWatch()
        watch.start()
        time.sleep(1.5)
        m = watch.stop(1.5)
    finally:
        hog.kill()
        hog.wait()
    import os

    assert m["host_other_cpu_frac"] > 0.6 / os.cpu_count()  # one busy core of the host's
    assert "other processes used" in verdict({**m, "host_other_cpu_frac": max(m["host_other_cpu_frac"], 0.3)})


def test_the_trials_own_work_and_its_workers_are_not_outside_load():
    def window(work: bool) -> float:
        child_code = "import time\nend = time.perf_counter() + 1.5\nwhile time.perf_counter() < end: pass"
        watch = CpuWatch()
        watch.start()
        if work:  # the trial's main process and a loader-worker-like child burn both cores
            worker = subprocess.Popen([sys.executable, "-c", child_code])
            burn(1.5)
        else:
            time.sleep(1.5)
        m = watch.stop(1.5)  # measured while the worker still runs: its CPU time counts as the trial's
        if work:
            worker.wait()
        return m["host_other_cpu_frac"]

    # whatever else the machine is doing, the trial's own CPU time adds nothing to "outside"
    assert window(work=True) < window(work=False) + 0.2
    assert verdict({"host_other_cpu_frac": 0.1}) is None
