"""Measured = exported, for a user's program (workload.command): runs the
program itself in production mode, as its user will, and compares with the
search's claimed speedup.

For a finished search of a program, runs its baseline (its own command, with
`AUTOTUNE_CONFIG` naming a config that sets nothing) and its best (best_config.yaml's
command, searched flags included, with `AUTOTUNE_CONFIG=best_config.yaml`), each a
fresh process, in interleaved pairs (the order alternating, so a drift of the machine
hits both alike). The program's own steps are timed through autotune.config()'s
step log (`AUTOTUNE_STEP_LOG`): samples over the steps after `--warmup`, up to
`--steps` steps, where the process is ended. A step interval over PAUSE times the
median is the program's own pause (a validation every N steps, a checkpoint: what a
trial turns off) and is left out of samples/s, as a trial's window has none; the
rate with them is given too (`samples_per_s_wall`, `paused_s`). A language model's search (best_config.yaml's
`measured.unit`: tokens) is compared in tokens/s, the tokens its steps report (`cfg.step(tokens=...)`, a Trainer's
batches), samples/s beside. The speedup of each
pair, their mean and a 95% interval (Student's t over the pairs) are compared with the
claimed speedup (best_config.yaml's `measured.speedup_x`).

    python scripts/bench/bench_program.py runs/<search> --pairs 3 --steps 60 --warmup 10

Needs torch only (and pyyaml). Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.execution.launcher import program_command  # noqa: E402
from autotune.export import load as best_config  # noqa: E402
from autotune.spec import WorkloadSpec  # noqa: E402
from autotune import instrument  # noqa: E402
from autotune.trial.loop import STEP_LOG_ENV, STOP_AFTER_ENV  # noqa: E402
from autotune.stats import T95, Z95  # noqa: E402

PAUSE = 10  # a step interval over this many times the median is a pause of the program's, not a training step


def run_once(
    command: list[str],
    cwd: str,
    config: Path,
    steps: int,
    warmup: int,
    timeout: float,
    own_env: dict[str, str] | None = None,
) -> dict:
    """One fresh process of the program in production mode: its samples/s after warm-up."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "steps.json"
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "AUTOTUNE_TRIAL")}
        env.update(
            {
                "AUTOTUNE_CONFIG": str(config),
                STEP_LOG_ENV: str(log),
                STOP_AFTER_ENV: str(steps),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            }
        )
        env = {k: v for k, v in {**env, **(own_env or {})}.items() if v != ""}  # its searched environment ('': unset)
        env = instrument.with_env(env)  # a Trainer script's knobs and step log come through the instrumentation
        started = time.perf_counter()
        proc = subprocess.run(
            program_command(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
        wall = time.perf_counter() - started
        if not log.exists():
            raise SystemExit(
                f"error: `{' '.join(command)}` wrote no step log (exit {proc.returncode}): "
                f"{proc.stderr.strip().splitlines()[-1:] or proc.stdout[-200:]}"
            )
        data = json.loads(log.read_text())
    marks, samples, tokens = data["marks"], data["samples"], data.get("tokens")
    if len(marks) <= warmup + 2:
        raise SystemExit(f"error: the program ran {len(marks)} steps; --warmup {warmup} needs more (--steps)")
    span = marks[-1] - marks[warmup]
    gaps = [b - a for a, b in zip(marks[warmup:], marks[warmup + 1 :])]
    typical = statistics.median(gaps)
    paused = sum(g - typical for g in gaps if g > PAUSE * typical)  # validation, a checkpoint: not a training step
    n = sum(samples[warmup + 1 :])
    rates = {"samples_per_s": n / (span - paused), "samples_per_s_wall": n / span}  # training steps only: a trial's
    if tokens:  # a language model's steps (trial.loop.PassThrough logs them where every step reported them)
        rates.update(
            tokens_per_s=sum(tokens[warmup + 1 :]) / (span - paused), tokens_per_s_wall=sum(tokens[warmup + 1 :]) / span
        )
    return {
        **rates,
        "paused_s": paused,
        "steps": len(marks) - warmup - 1,
        "wall_s": wall,
        "log": data,  # every step's end, samples and tokens (scripts/dev/remeasure_ways.py reads other windows of it)
    }


def interval(xs: list[float]) -> tuple[float, float]:
    """The mean and its 95% half-width (Student's t; inf for fewer than 2)."""
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return mean, float("inf")
    return mean, T95.get(len(xs) - 1, Z95) * statistics.stdev(xs) / len(xs) ** 0.5


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=60, help="steps a process runs before it is ended")
    p.add_argument("--warmup", type=int, default=10, help="steps not timed")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args(argv)
    run = Path(args.run_dir)
    best = best_config.read(run / "best_config.yaml")
    spec = yaml.safe_load((run / "spec.yaml").read_text())
    wl = spec["workload"]
    if not wl.get("command"):
        print(
            f"error: {run} is not a search of a program (no workload.command); see scripts/bench/bench_exported.py",
            file=sys.stderr,
        )
        return 2
    cwd = wl.get("dir") or "."
    own = WorkloadSpec.model_validate(wl).line()  # the user's own line: a launcher's (`torchrun ...`) as given
    with tempfile.TemporaryDirectory() as tmp:
        nothing = Path(tmp) / "baseline.yaml"
        nothing.write_text(yaml.safe_dump({"knobs": {}, "device": best.get("device") or {}}))
        sides = {
            "baseline": (own, nothing, {}),
            "best": (
                best["workload"].get("command") or own,
                (run / "best_config.yaml").resolve(),
                best["workload"].get("env") or {},
            ),
        }
        rows = {"baseline": [], "best": []}
        load = []
        for i in range(args.pairs):
            order = ("baseline", "best") if i % 2 == 0 else ("best", "baseline")
            for side in order:
                command, config, own_env = sides[side]
                rows[side].append(run_once(command, cwd, config, args.steps, args.warmup, args.timeout, own_env))
                load.append(os.getloadavg()[0])
    unit = best["measured"].get("unit", "samples")  # the search's (trial.result.unit_of): tokens for a language model
    rate = f"{unit}_per_s"
    speedups = [b[rate] / a[rate] for a, b in zip(rows["baseline"], rows["best"])]
    mean, half = interval(speedups)
    claimed = best["measured"]["speedup_x"]
    agrees = abs(mean / claimed - 1) <= 0.05 or mean - half <= claimed <= mean + half
    print(f"{'pair':>4}  {f'baseline {unit}/s':>18}  {f'best {unit}/s':>14}  {'speedup':>7}")
    for i, (a, b, s) in enumerate(zip(rows["baseline"], rows["best"], speedups)):
        print(f"{i:>4}  {a[rate]:>18.2f}  {b[rate]:>14.2f}  {s:>6.3f}x")
    print(
        f"program's own speedup {mean:.3f}x +-{half:.3f} (95%, {args.pairs} pairs); claimed {claimed:.3f}x: "
        f"{'agrees' if agrees else 'DISAGREES'} (within 5% or inside the interval); load avg "
        f"{min(load):.1f}-{max(load):.1f}"
    )
    best_cmd = " ".join(sides["best"][0])
    print(
        json.dumps(
            {
                "run_dir": str(run),
                "best_command": best_cmd,
                "claimed_speedup_x": claimed,
                "program_speedup_x": round(mean, 4),
                "program_speedup_ci95": round(half, 4),
                "pairs": speedups,
                "unit": unit,
                **{
                    f"{side}_{r}": [row[r] for row in rows[side]]
                    for side in rows
                    for r in dict.fromkeys(("samples_per_s", rate))
                },
                "program_speedup_wall_x": round(
                    statistics.fmean(
                        b[f"{rate}_wall"] / a[f"{rate}_wall"] for a, b in zip(rows["baseline"], rows["best"])
                    ),
                    4,
                ),
                "paused_s": {side: [round(r["paused_s"], 3) for r in rows[side]] for side in rows},
                "agrees": agrees,
                "loadavg_min": min(load),
                "loadavg_max": max(load),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
