"""What the instrumentation costs a program in production: `autotune run` at the baseline's config (a
best_config.yaml that changes nothing: torch's hooks installed, every knob the program's own) against the bare
program, the same command, side by side.

A step's time is read without the instrumentation's help, so the bare side can be timed too: each side runs the
program to S1 and to S2 optimizer steps (its own `--steps` flag), fresh processes, and a step costs
(wall(S2) - wall(S1)) / (S2 - S1): the start-up, the imports, the model's build and the first steps cancel. The
four runs of a pair are interleaved (bare S1, tuned S1, bare S2, tuned S2; the order alternating from pair to
pair), so a drift of the host hits both alike. Each pair's cost is tuned/bare - 1; their median and a 95%
interval (Student's t over the pairs) are reported.

    python scripts/bench/bench_instrument_cost.py --pairs 6                       # plain_lm.py, 200 and 800 steps
    python scripts/bench/bench_instrument_cost.py --program nanogpt_loop.py --short 100 --long 600

Needs torch only (and pyyaml). Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.stats import T95  # noqa: E402

PROGRAMS = ROOT / "tests" / "programs"
STEPS_FLAG = {"plain_lm.py": "--steps={}", "nanogpt_loop.py": "--max_iters={}", "loader_loop.py": "--steps={}"}


def wall(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(command)}` exit {proc.returncode}: {proc.stderr.strip()[-600:]}")
    return time.perf_counter() - started


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--program", default="plain_lm.py", choices=sorted(STEPS_FLAG))
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--short", type=int, default=200, help="S1: optimizer steps of the short runs")
    p.add_argument("--long", type=int, default=800, help="S2: optimizer steps of the long runs")
    p.add_argument("--args", default="", help="the program's other arguments")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="instrument-cost-"))
    shutil.copy(PROGRAMS / a.program, work / a.program)
    np.random.default_rng(0).integers(0, 65, 200_000, dtype=np.uint16).tofile(work / "train.bin")
    config = work / "baseline.yaml"  # changes nothing: the program's own settings, the instrumentation installed
    config.write_text(yaml.safe_dump({"knobs": {}, "device": {"type": "cpu"}, "safety": []}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    cli = [sys.executable, "-m", "autotune.cli", "run", str(config), "--"]

    def command(tuned: bool, steps: int) -> list[str]:
        own = [sys.executable, a.program, STEPS_FLAG[a.program].format(steps), *a.args.split()]
        return [*cli, *own] if tuned else own

    rows, costs, loads = [], [], []
    for i in range(a.pairs):
        loads.append(os.getloadavg()[0])
        first = bool(i % 2)  # every other pair the tuned side first
        order = [(first, a.short), (not first, a.short), (first, a.long), (not first, a.long)]
        got = {(t, s): wall(command(t, s), work, env) for t, s in order}
        bare = (got[False, a.long] - got[False, a.short]) / (a.long - a.short)
        tuned = (got[True, a.long] - got[True, a.short]) / (a.long - a.short)
        costs.append(tuned / bare - 1)
        rows.append((i, bare * 1e3, tuned * 1e3, costs[-1]))
        print(f"pair {i}: bare {bare * 1e3:.3f} ms/step, tuned {tuned * 1e3:.3f} ms/step, cost {costs[-1]:+.2%}")
    mean = statistics.fmean(costs)
    half = T95.get(len(costs) - 1, 1.96) * statistics.stdev(costs) / len(costs) ** 0.5 if len(costs) > 1 else None
    print(f"\n{'pair':>4} {'bare ms/step':>13} {'autotune run ms/step':>21} {'cost':>8}")
    for i, bare, tuned, cost in rows:
        print(f"{i:>4} {bare:>13.3f} {tuned:>21.3f} {cost:>+8.2%}")
    low, high = (mean - half, mean + half) if half is not None else (None, None)
    print(
        f"median {statistics.median(costs):+.2%}, mean {mean:+.2%}"
        + (f" (95%: {low:+.2%} to {high:+.2%})" if half is not None else "")
        + f"; load average {min(loads):.1f}-{max(loads):.1f}"
    )
    shutil.rmtree(work, ignore_errors=True)
    out = {
        "program": a.program,
        "steps": [a.short, a.long],
        "pairs": [round(c, 4) for c in costs],
        "cost_median": round(statistics.median(costs), 4),
        "cost_mean": round(mean, 4),
        "cost_ci95": [round(low, 4), round(high, 4)] if half is not None else None,
        "loadavg": [round(min(loads), 2), round(max(loads), 2)],
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
