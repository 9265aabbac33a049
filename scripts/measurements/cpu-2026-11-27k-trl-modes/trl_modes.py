"""trl_sft's baseline in production, N processes of 300 steps each: samples/s over steps 30-299, the host's CPU
ticks over the process (user, system, idle, steal) and its busiest threads (every 0.25 s), read through procfs.

    python trl_modes.py RUN_DIR ROUNDS [PREFIX]   # RUN_DIR: a trl_sft search's run dir; PREFIX e.g. "setarch x86_64 -R"
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from autotune.execution.launcher import program_command  # noqa: E402
from autotune.export import load as best_config  # noqa: E402
from autotune.host import procfs  # noqa: E402
from autotune.integrations import instrument  # noqa: E402
from autotune.trial.loop import STEP_LOG_ENV, STOP_AFTER_ENV  # noqa: E402


def sample(proc, stats: dict, stop: threading.Event) -> None:
    """Every 0.25 s: each thread of the process and its children, its CPU time and the core it last ran on."""
    while not stop.is_set():
        for pid in procfs.descendants(proc.pid):
            for t in procfs.threads(pid):
                stats[(pid, t.tid, t.name)] = (t.cpu_s, t.last_cpu)
        time.sleep(0.25)


def main() -> None:
    run, rounds = Path(sys.argv[1]), int(sys.argv[2])
    prefix = sys.argv[3].split() if len(sys.argv) > 3 else []
    spec = yaml.safe_load((run / "spec.yaml").read_text())
    best = best_config.read(run / "best_config.yaml")
    nothing = Path(tempfile.mkdtemp()) / "baseline.yaml"
    nothing.write_text(yaml.safe_dump({"knobs": {}, "device": best.get("device") or {}}))
    for i in range(rounds):
        log = Path(tempfile.mkdtemp()) / "steps.json"
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "AUTOTUNE_TRIAL")}
        env.update(
            {
                "AUTOTUNE_CONFIG": str(nothing),
                STEP_LOG_ENV: str(log),
                STOP_AFTER_ENV: "300",
                "HF_DATASETS_CACHE": str(run.parent / "hf_datasets"),
            }
        )
        stats, stop, before, started = {}, threading.Event(), procfs.host_cpu_ticks(), time.time()
        proc = subprocess.Popen(
            prefix + program_command(spec["workload"]["command"]),
            cwd=run.parent,
            env=instrument.with_env(env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        watcher = threading.Thread(target=sample, args=(proc, stats, stop))
        watcher.start()
        proc.wait()
        stop.set()
        watcher.join()
        host = [b - a for a, b in zip(before, procfs.host_cpu_ticks())]
        data = json.loads(log.read_text())
        marks, samples = data["marks"], data["samples"]
        rate = sum(samples[31:300]) / (marks[299] - marks[30])
        busy = sorted(((round(v[0], 1), k[2], v[1]) for k, v in stats.items() if v[0] > 0.5), reverse=True)
        print(
            f"round {i}: {rate:.1f} samples/s, wall {time.time() - started:.0f} s; host ticks user {host[0]} "
            f"system {host[2]} idle {host[3]} steal {host[7]}; busy threads (CPU s, name, last core) {busy[:4]}",
            flush=True,
        )


if __name__ == "__main__":
    main()
