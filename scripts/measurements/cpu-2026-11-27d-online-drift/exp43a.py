"""too_many, taken apart: fixed 4/1/2 workers side by side (rotating order, 10 s, 2 s skipped), and an online run
started at 4 workers with its change records."""

import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "scripts/bench"), str(ROOT)]

import bench_online as B  # noqa: E402
from trials.tiny_cnn import RandomImages, tiny_cnn  # noqa: E402

job = B.Job(RandomImages(10**6), tiny_cnn(), 64)
rates = {4: [], 1: [], 2: []}
orders = [(4, 1, 2), (1, 2, 4), (2, 4, 1)]
if "fixed" in sys.argv:
    for r in range(3):
        for n in orders[r]:
            t0 = os.times()
            v = job.fixed(10, num_workers=n)
            t1 = os.times()
            rates[n].append(v)
            print(
                f"round {r} workers {n}: {v:.1f} samples/s; main cpu {(t1.user + t1.system - t0.user - t0.system) / 10:.2f} cores, children {(t1.children_user + t1.children_system - t0.children_user - t0.children_system) / 10:.2f}",
                flush=True,
            )
    for n, v in rates.items():
        print(n, [round(x) for x in v], round(statistics.mean(v)))
if "online" in sys.argv:
    lines = []
    run, online = job.online(40, lines, knobs={"num_workers": 4})
    for c in B.changes(lines):
        b, a = c["before"], c["after"]
        print(
            f"{c['from']['num_workers']}->{c['to']['num_workers']} kept={c['kept']} before {b['steps_per_s']} ({b.get('wall_s')} s, wait {b['data_wait_pct']}%) after {a['steps_per_s']} ({a.get('wall_s')} s, wait {a['data_wait_pct']}%) ref {c['judged_against']['steps_per_s']}"
        )
    tr = run["trace"]
    for t in range(0, 40, 4):
        print(f"t={t}-{t + 4}: {B.trailing(tr, t + 4, 4):.0f} samples/s")
