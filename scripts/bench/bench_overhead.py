"""What a trial costs outside its measurement: the old launcher (`python -m
autotune.trial` from scratch) against the warm fork server, side by side.

N eager trials of one config per launcher, interleaved (so a drift of the machine
hits both alike), profile and diagnosis off so only the fixed cost is left:
`first_step_s` (trial start to the first step done: imports, model, loader start)
and `fixed_cost_s` (the trial's wall time less warm-up and timed window), and
whether the window is as steady forked as spawned (`step_ms_max`, `step_time_cv`:
a forked child that runs a full garbage collection copies every page it shares
with the server, one stall inside the window, unless the server froze its objects).
Medians. The fork server's own start (paid once per search) is reported apart.

    python scripts/bench/bench_overhead.py --trials 5
    python scripts/bench/bench_overhead.py --workload resnet18_cifar --set num_workers=8 --set pin_memory=true

Needs torch only. Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.execution.launcher import _servers, run_in_process  # noqa: E402
from autotune.trial.runner import parse_set  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="tiny_cnn")
    p.add_argument("--args", default="{}", metavar="JSON", help="workload factory arguments")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
    p.add_argument("--trials", type=int, default=5, help="trials per launcher")
    p.add_argument("--window-s", type=float, default=1.0)
    args = p.parse_args()
    config = {
        "workload": {"name": args.workload, "args": json.loads(args.args)},
        "knobs": parse_set(args.set),
        "warmup_steps": 3,
        "measure_steps": 5,
        "min_window_s": args.window_s,
        "max_window_s": args.window_s,
        "profile_steps": 0,
        "diagnose": False,
    }
    tmp = Path(tempfile.mkdtemp(prefix="overhead"))
    rows = {"spawn": [], "fork": []}
    t = time.perf_counter()
    server_start_s = None
    print(
        f"{'trial':>5}  {'launcher':<8}  {'first_step_s':>12}  {'fixed_cost_s':>12}  {'trial_wall_s':>12}  {'samples/s':>10}"
        f"  {'step_ms_max':>11}  {'step_cv':>7}"
    )
    for i in range(args.trials):
        for launcher in ("spawn", "fork") if i % 2 == 0 else ("fork", "spawn"):
            fresh = launcher == "fork" and not _servers
            t = time.perf_counter()
            r = run_in_process(config, tmp / f"{i:03d}-{launcher}", 600, str(ROOT), {}, launcher=launcher)
            if r.status != "ok":
                raise SystemExit(f"trial failed: {r.error_type}: {r.error}")
            m = r.metrics
            row = {
                "first_step_s": m["first_step_s"],
                "fixed_cost_s": r.trial_wall_s - m["warmup_s"] - m["window_s"],
                "trial_wall_s": r.trial_wall_s,
                "samples_per_s": m["samples_per_s"],
                "step_ms_max": m["step_ms_max"],
                "step_time_cv": m["step_time_cv"],
            }
            if fresh:  # the server's imports, paid once per search, not per trial
                server_start_s = time.perf_counter() - t - r.trial_wall_s + row["fixed_cost_s"]
            rows[launcher].append(row)
            print(
                f"{i:>5}  {launcher:<8}  {row['first_step_s']:>12.2f}  {row['fixed_cost_s']:>12.2f}  "
                f"{row['trial_wall_s']:>12.2f}  {row['samples_per_s']:>10.1f}  {row['step_ms_max']:>11.1f}"
                f"  {row['step_time_cv']:>7.2f}"
            )

    def medians(launcher):
        return {
            k: statistics.median(r[k] for r in rows[launcher])
            for k in ("first_step_s", "fixed_cost_s", "samples_per_s", "step_ms_max", "step_time_cv")
        }

    import torch

    summary = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "trials": args.trials,
        "workload": args.workload,
        "old": medians("spawn"),
        "new": medians("fork"),
        "fork_server_first_trial_fixed_cost_s": server_start_s,
    }
    print(
        f"\nmedians over {args.trials} trials each: first_step_s {summary['old']['first_step_s']:.2f} -> "
        f"{summary['new']['first_step_s']:.2f} s, fixed cost {summary['old']['fixed_cost_s']:.2f} -> "
        f"{summary['new']['fixed_cost_s']:.2f} s per trial (the server's first trial: {server_start_s:.2f} s); "
        f"step-time CV {summary['old']['step_time_cv']:.2f} -> {summary['new']['step_time_cv']:.2f}, slowest step "
        f"{summary['old']['step_ms_max']:.1f} -> {summary['new']['step_ms_max']:.1f} ms"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
