"""What a trial costs outside its measurement: the old launcher (`python -m
autotune.trial` from scratch) against the warm fork server, side by side.

N eager trials of one config per launcher, interleaved (so a drift of the machine
hits both alike), profile and diagnosis off so only the fixed cost is left:
`first_step_s` (trial start to the first step done: imports, model, loader start)
and `fixed_cost_s` (the trial's wall time less warm-up and timed window), and
whether the window is as steady forked as spawned (`step_ms_max`, `step_time_cv`:
a forked child that runs a full garbage collection copies every page it shares
with the server, one stall inside the window, unless the server froze its objects).
Medians, a fork server's first trial left out (its start, paid once per search,
is reported apart).

With `--program`, the sides are a user's program against the built-in trial of
the same size (the workload written as a program: scripts/bench/builtin_program.py,
the same model, data and step): the built-in trial forked (`fork`), the program
forked from the same warm server (`program-fork`) and the program as a plain
process (`program`); the ratio is the forked program's fixed cost over the
built-in's (issue 42: at most 1.5x). A program's first step is in its fixed cost
(its warm-up starts after it), a built-in's in its warm-up. `--ranks 2`: the
trials of 2 ranks each (the built-in's forked by its trial process, the program's
forked a rank each from the warm server, or started fresh as torchrun would).

    python scripts/bench/bench_overhead.py --trials 5
    python scripts/bench/bench_overhead.py --trials 3 --program
    python scripts/bench/bench_overhead.py --trials 3 --program --ranks 2
    python scripts/bench/bench_overhead.py --workload resnet18_cifar --set num_workers=8 --set pin_memory=true

Needs torch only. Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.execution.launcher import Launch, preload_for, run_in_process  # noqa: E402
from autotune.trial.runner import parse_set  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="tiny_cnn")
    p.add_argument("--args", default="{}", metavar="JSON", help="workload factory arguments")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
    p.add_argument("--trials", type=int, default=5, help="trials per launcher")
    p.add_argument("--window-s", type=float, default=1.0)
    p.add_argument("--program", action="store_true", help="a program against the built-in trial of its size")
    p.add_argument("--ranks", type=int, default=1, help="ranks per trial (data-parallel, on this host)")
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
        **({"ranks": args.ranks} if args.ranks > 1 else {}),
    }
    program = {
        **config,
        "workload": {
            "command": ["python", str(ROOT / "scripts" / "bench" / "builtin_program.py"), "--workload", args.workload],
            "dir": str(ROOT),
        },
    }
    sides = {"fork": ("fork", config), "program-fork": ("fork", program), "program": ("spawn", program)}
    if not args.program:
        sides = {"spawn": ("spawn", config), "fork": ("fork", config)}
    tmp = Path(tempfile.mkdtemp(prefix="overhead"))
    rows = {side: [] for side in sides}
    t = time.perf_counter()
    server_start_s = None
    started = set()  # the servers started (one per preloaded module set; the program's own)
    load_start = os.getloadavg()[0]
    print(
        f"{'trial':>5}  {'launcher':<12}  {'first_step_s':>12}  {'fixed_cost_s':>12}  {'trial_wall_s':>12}  {'samples/s':>10}"
        f"  {'step_ms_max':>11}  {'step_cv':>7}"
    )
    for i in range(args.trials):
        for side in list(sides) if i % 2 == 0 else list(sides)[::-1]:  # interleaved
            launcher, trial = sides[side]
            server = (preload_for(trial), trial is program)  # a fork server: its preloaded modules, its program
            fresh = launcher == "fork" and server not in started
            if launcher == "fork":  # a spawned trial starts no server: the fork side's first trial is still fresh
                started.add(server)
            t = time.perf_counter()
            r = run_in_process(trial, tmp / f"{i:03d}-{side}", 600, str(ROOT), {}, launch=Launch(launcher))
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
            if not fresh:  # a server's first trial (its imports) is reported apart
                rows[side].append(row)
            print(
                f"{i:>5}  {side:<12}  {row['first_step_s']:>12.2f}  {row['fixed_cost_s']:>12.2f}  "
                f"{row['trial_wall_s']:>12.2f}  {row['samples_per_s']:>10.1f}  {row['step_ms_max']:>11.1f}"
                f"  {row['step_time_cv']:>7.2f}"
            )

    def medians(launcher):
        return {
            k: statistics.median(r[k] for r in rows[launcher])
            for k in ("first_step_s", "fixed_cost_s", "samples_per_s", "step_ms_max", "step_time_cv")
        }

    import torch

    load = os.getloadavg()
    summary = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "trials": args.trials,
        "workload": args.workload,
        "ranks": args.ranks,
        "loadavg_1m_start_end": [load_start, load[0]],
        "fork_server_first_trial_fixed_cost_s": server_start_s,
    }
    if args.program:
        summary.update({side: medians(side) for side in sides})
        ratio = summary["program-fork"]["fixed_cost_s"] / summary["fork"]["fixed_cost_s"]
        summary["program_fork_over_builtin_fixed_cost_x"] = ratio
        print(
            f"\nmedians over {args.trials} trials each (load {load_start:.1f} -> {load[0]:.1f}): fixed cost per trial "
            f"built-in {summary['fork']['fixed_cost_s']:.2f} s, program forked {summary['program-fork']['fixed_cost_s']:.2f}"
            f" s ({ratio:.2f}x), program as a fresh process {summary['program']['fixed_cost_s']:.2f} s"
        )
        print(json.dumps(summary))
        return
    summary.update({"old": medians("spawn"), "new": medians("fork")})
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
