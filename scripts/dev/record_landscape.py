"""Record a landscape: every point of a knob grid measured as one fresh trial
(`python -m autotune.trial`, torch only, no Ray or MLflow), one CSV row per point
as it finishes: the knobs, status (ok / oom / error / timeout), throughput and
the trial's cost in seconds. `scripts/bench/bench_search.py` replays such CSVs.

Points run in a seeded shuffled order (machine drift spreads over the grid rather
than following one knob). Rerunning with the same -o skips the points already
recorded, so a landscape can be recorded over several sessions (--budget-s).
Values that cannot apply on this device are dropped, and the table says so.
The baseline point (PyTorch's defaults, the workload's batch size) runs with the
profiled window and the diagnosis: its `bottleneck` column is what autotune's
strategy orders its first moves by (--diagnose-baseline re-measures it so in a
landscape recorded without).

    python scripts/dev/record_landscape.py -o landscape.csv --workload tiny_cnn \\
        --grid num_workers=0,1,2 --grid batch_size=32,64,128,256 --grid precision=32-true,bf16-mixed

A landscape that looks like the real space (GPU only; not recorded yet: the
H100 sessions so far had no time for it), every point diagnosed so a replay
follows the moving bottleneck:

    python scripts/dev/record_landscape.py -o scripts/bench/landscapes/h100_resnet18_gpunorm.csv \\
        --workload resnet18_cifar --args '{"gpu_normalize": true}' --diagnose-all --budget-s 3000 \\
        --grid num_workers=0,4,8,16 --grid pin_memory=false,true --grid batch_size=32,128,512,1024 \\
        --grid precision=32-true,bf16-mixed,16-mixed --grid channels_last=false,true --grid compile=none,default
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune import knobs as K  # noqa: E402
from autotune.execution.launcher import run_in_process  # noqa: E402
from autotune.trial.runner import detect_device, parse_set  # noqa: E402

RESULT_COLUMNS = [
    "samples_per_s",
    "step_ms_mean",
    "step_mean_ci95",
    "warmup_s",
    "window_s",
    "trial_wall_s",
    "mem_peak_allocated_gib",
    "mem_rss_peak_gib",
    "data_wait_frac",
    "compile_s",
    "compute_ceiling_samples_per_s",
    "loader_samples_per_s_per_worker",
]
COLUMNS = ["point", "status", *K.KNOBS, *RESULT_COLUMNS, "bottleneck", "error_type", "device_name", "host", "workload"]
TRIAL = {
    "warmup_steps": 5,
    "measure_steps": 10,
    "min_window_s": 1.0,
    "max_window_s": 4.0,
    "target_ci": 0.03,
    "profile_steps": 0,
    "diagnose": False,
}


def parse_grid(items: list[str]) -> dict[str, list]:
    grid = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or name not in K.KNOBS:
            raise SystemExit(f"--grid expects knob=v1,v2,... with a knob of {', '.join(K.KNOBS)}; got `{item}`")
        grid[name] = [parse_set([f"x={v}"])["x"] for v in raw.split(",")]
    return grid


def points(grid: dict[str, list], fixed: dict, device: K.Device, seed: int) -> tuple[list[dict], list[str]]:
    """Every applicable point of the grid, in a seeded shuffled order; and what was dropped."""
    dropped, lists = [], {}
    for name, values in grid.items():
        keep = []
        for v in values:
            why = K.KNOBS[name].unavailable(v, device)
            (dropped.append(f"{name}={v!r}: {why}") if why else keep.append(v))
        lists[name] = keep
    out = [{**fixed, **dict(zip(lists, combo))} for combo in itertools.product(*lists.values())]
    random.Random(seed).shuffle(out)
    return out, dropped


def key(knobs: dict) -> str:
    return json.dumps({k: knobs[k] for k in K.KNOBS}, sort_keys=True)


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def header(path: Path) -> list[str]:
    with path.open() as f:
        return next(csv.reader(f), [])


def row_key(row: dict) -> str:
    return key({k: K.from_cell(k, row.get(k)) for k in K.KNOBS})


def forget(path: Path, point: dict | None) -> None:
    """Rewrite the CSV without `point` (and with today's columns)."""
    rows = [r for r in read_rows(path) if point is None or row_key(r) != key(point)]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({c: r.get(c) for c in COLUMNS} for r in rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--out", required=True, help="landscape CSV (appended to; recorded points are skipped)")
    p.add_argument("--workload", default="tiny_cnn", help="built-in name or pkg.module:factory")
    p.add_argument("--grid", action="append", default=[], metavar="KNOB=V1,V2", help="a searched knob and its values")
    p.add_argument(
        "--set", action="append", default=[], metavar="KNOB=VALUE", help="a fixed knob (else PyTorch's default)"
    )
    p.add_argument(
        "--trial", action="append", default=[], metavar="KEY=VALUE", help=f"trial setting (defaults {TRIAL})"
    )
    p.add_argument(
        "--cpus", type=int, default=None, help="torch threads per trial: the num_threads knob (default: torch's)"
    )
    p.add_argument("--timeout-s", type=float, default=300)
    p.add_argument("--budget-s", type=float, default=None, help="stop starting points after this long")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--diagnose-baseline", action="store_true", help="re-measure the baseline point with its diagnosis")
    p.add_argument(
        "--diagnose-all",
        action="store_true",
        help="profile and diagnose every point (its bottleneck: a replay moves from each incumbent's own)",
    )
    p.add_argument(
        "--args", default="{}", metavar="JSON", help="workload factory arguments, e.g. '{\"gpu_normalize\": true}'"
    )
    args = p.parse_args()
    device = detect_device()
    grid = parse_grid(args.grid)
    from autotune.workload import load

    wl_args = json.loads(args.args)
    base_batch = load(args.workload, wl_args).batch_size
    fixed = {
        **K.pytorch_defaults(base_batch),
        **({"num_threads": args.cpus} if args.cpus else {}),
        **parse_set(args.set),
    }
    todo, dropped = points(grid, fixed, device, args.seed)
    out = Path(args.out)
    if out.exists() and (args.diagnose_baseline or header(out) != COLUMNS):
        forget(out, fixed if args.diagnose_baseline else None)  # (an older CSV gets today's columns)
    done = {row_key(r) for r in read_rows(out)}
    todo = [pt for pt in todo if key(pt) not in done]
    for d in dropped:
        print(f"dropped {d}")
    print(f"{device.type}:{device.name}, {len(done)} points recorded, {len(todo)} to go")
    trial = {**TRIAL, **parse_set(args.trial)}
    workload = {"factory": args.workload} if ":" in args.workload else {"name": args.workload}
    workload["args"] = wl_args
    new = not out.exists()
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with out.open("a", newline="") as f, tempfile.TemporaryDirectory(prefix="landscape") as tmp:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        if new:
            writer.writeheader()
        cols = [k for k in grid]
        print(" ".join(f"{c[:12]:>12}" for c in cols) + f" {'status':>7} {'samples/s':>10} {'cost s':>7}")
        for i, knobs in enumerate(todo):
            if args.budget_s and time.perf_counter() - started > args.budget_s:
                print(f"budget of {args.budget_s:g} s spent; rerun with the same -o to continue")
                break
            config = {"workload": workload, "knobs": knobs, **trial, "seed": args.seed}
            if knobs == fixed or args.diagnose_all:  # the baseline (or every point): profiled and diagnosed
                config.update(diagnose=True, profile_steps=max(trial["profile_steps"], 5))
            r = run_in_process(config, Path(tmp) / f"{i:04d}", args.timeout_s, str(Path.cwd()))
            m = r.metrics or {}
            row = {
                "point": len(done) + i,
                "status": r.status,
                **{k: K.to_cell(v) for k, v in knobs.items()},
                **{c: m.get(c) for c in RESULT_COLUMNS},
                "trial_wall_s": r.trial_wall_s,
                "bottleneck": (r.diagnosis or {}).get("bottleneck"),
                "error_type": r.error_type,
                "device_name": r.device.name if r.device else None,
                "host": r.host,
                "workload": args.workload,
            }
            writer.writerow(row)
            f.flush()
            tput = m.get("samples_per_s")
            print(
                " ".join(f"{str(knobs[c]):>12}" for c in cols)
                + f" {row['status']:>7} {tput or 0:>10.1f} {r.trial_wall_s:>7.1f}",
                flush=True,
            )
    recorded = len(read_rows(out))
    print(
        json.dumps(
            {
                "landscape": str(out),
                "points_recorded": recorded,
                "points_in_grid": len(done) + len(todo),
                "device": f"{device.type}:{device.name}",
                "wall_s": time.perf_counter() - started,
            }
        )
    )


if __name__ == "__main__":
    main()
