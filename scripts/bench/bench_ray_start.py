"""What a local Ray's start costs a search, by option: `ray.init` as autotune
calls it (loopback, no dashboard), the first actor ready (what the first trial
waits for), and `ray.shutdown`, each variant in a fresh process, interleaved
over rounds (a drift of the host weighs on every variant alike).

Variants: `prestart` (Ray's default, RAY_prestart_worker_first_driver=1: the
raylet starts num_cpus idle workers when the driver registers), `autotune`
(what autotune.execution.raytune.init_ray does: no prestart), `num-cpus` (no prestart,
and ray.init(num_cpus=N) given, N the host's CPUs).

    python scripts/bench/bench_ray_start.py [--rounds 3] [--variants autotune,prestart]

Readable table; the last line of stdout is one JSON object:
{"variants": {"<name>": {"init_s", "first_actor_s", "shutdown_s"}}} (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {"prestart": {"RAY_prestart_worker_first_driver": "1"}, "autotune": {}, "num-cpus": {"NUM_CPUS": "1"}}
CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
from autotune.execution import raytune as RT  # binds Ray to loopback before it is imported
import ray
t1 = time.perf_counter()
kw = {"num_cpus": os.cpu_count()} if os.environ.get("NUM_CPUS") else {}
if kw:
    orig = ray.init
    ray.init = lambda *a, **k: orig(*a, **{**k, **kw})
RT.init_ray(None)
t2 = time.perf_counter()

@ray.remote(num_cpus=1)
class A:
    def ping(self):
        return os.getpid()

a = A.remote()
ray.get(a.ping.remote())
t3 = time.perf_counter()
RT.shutdown_ray()
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "init_s": t2 - t1, "first_actor_s": t3 - t2, "shutdown_s": t4 - t3}))
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    args = p.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    if not names or set(names) - set(VARIANTS):
        p.error(f"--variants {args.variants}: allowed: {', '.join(VARIANTS)}")
    runs: dict[str, list[dict]] = {v: [] for v in names}
    for _ in range(args.rounds):
        for name in names:
            env = VARIANTS[name]
            with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
                proc = subprocess.run(
                    [sys.executable, "-c", CHILD, str(ROOT)],
                    capture_output=True,
                    text=True,
                    env={**os.environ, **env, "RAY_TMPDIR": tmp},
                    timeout=300,
                )
            if proc.returncode:
                sys.stderr.write(proc.stderr[-2000:])
                raise SystemExit(f"{name}: exited {proc.returncode}")
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    out = {}
    print(
        f"{'variant':12} {'import s':>9} {'init s':>8} {'1st actor s':>12} {'shutdown s':>11}  (medians of {args.rounds})"
    )
    for name, rows in runs.items():
        med = {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}
        out[name] = med
        print(
            f"{name:12} {med['import_s']:9.2f} {med['init_s']:8.2f} {med['first_actor_s']:12.2f} {med['shutdown_s']:11.2f}"
        )
    print(json.dumps({"variants": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
