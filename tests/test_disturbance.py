"""Load from outside a trial's window is measured, its own work is not counted."""

import json
import os
import subprocess
import sys
import time

from autotune.trial.disturbance import CpuWatch, verdict


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


def test_the_other_ranks_of_the_same_trial_are_not_outside_load():
    """A rank forked by the trial process (autotune.trial.ranks) counts the whole trial's
    tree as its own: a sibling rank's CPU (here the test process, which the rank
    names as its trial) is not load from outside."""
    rank_code = (
        "import json, time\nfrom autotune.trial.disturbance import CpuWatch\n"
        "w = CpuWatch(); w.start(); time.sleep(1.5); print(json.dumps(w.stop(1.5)))"
    )

    def window(in_trial: bool) -> float:
        env = (
            {**os.environ, "AUTOTUNE_TRIAL_PID": str(os.getpid())}
            if in_trial
            else {k: v for k, v in os.environ.items() if k != "AUTOTUNE_TRIAL_PID"}
        )
        rank = subprocess.Popen([sys.executable, "-c", rank_code], env=env, stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)  # its watch has started
        burn(1.5)  # the sibling rank's work
        return json.loads(rank.communicate(timeout=60)[0])["host_other_cpu_frac"]

    assert window(in_trial=False) - window(in_trial=True) > 0.6 / os.cpu_count()  # one busy core, counted or not
