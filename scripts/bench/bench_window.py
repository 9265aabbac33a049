"""How many steps does a timed window need? One config, fresh processes: each
warms up as a trial does (`warmup_steps`), then runs one long window through the
trial's own session and `measure.timed_window`, keeping every step's time. Each
prefix of that window (its first 10, 20, 30 ... steps, and its first 0.5, 1, 2 s)
is what a shorter window would have read, in the same process: its throughput
against the whole window's (the prefix's bias, paired, so the process's own
level cancels), whether the whole window's mean lies inside the prefix's 95% CI
(Student's t: the claim that window would have made), and the spread of each
prefix's throughput across the processes (against which a prefix's bias is a
tie or not).

    python scripts/bench/bench_window.py --workload jpeg_pipeline --arg batch_size=64 --steps 60 --reps 4
    python scripts/bench/bench_window.py --workload tiny_cnn --arg batch_size=32 --steps 400 --reps 6 \
        --set precision=bf16-mixed

Measured on the 2-core CPU host (quiet, 2026-11-24; prefix throughput / its whole
window's, median and worst; "in CI": processes whose whole-window mean lay in the
prefix's t-CI; CV: the prefix's throughput across processes):

| workload, config | prefix | bias med | worst | in CI | CV |
|---|---|---:|---:|---:|---:|
| jpeg_pipeline b64, defaults (60 steps, 4 procs) | 10 steps | -2.5% | -2.9% | 4/4 | 4.6% |
| | 30 steps | -2.8% | +3.8% | 2/4 | 8.7% |
| | 60 steps (whole) | | | | 5.8% |
| jpeg_pipeline b64, 2 workers, 1 thread, bf16, channels_last | 10 steps | +0.4% | -9.2% | 3/4 | 8.5% |
| | 30 steps | -2.2% | -3.3% | 4/4 | 4.2% |
| | 60 steps (whole) | | | | 3.5% |
| jpeg_pipeline b64, defaults, `--warmup 2` (40 steps, 4 procs) | 10 steps | +1.2% | +3.0% | 2/4 | 8.4% |
| jpeg_pipeline b64, 2 workers, 1 thread, bf16, channels_last, `--warmup 2` | 10 steps | -0.5% | -3.3% | 3/4 | 3.0% |
| tiny_cnn b32, defaults (400 steps, 5 procs) | 10 steps | -9.5% | -27.9% | 1/5 | 19.6% |
| | 0.5 s (76 steps) | -3.7% | -19.4% | 2/5 | 18.4% |
| | 1.0 s (159 steps) | -0.2% | +7.2% | 3/5 | 17.6% |
| tiny_cnn b64 bf16 | 10 steps | -0.8% | -28.2% | 3/5 | 17.3% |
| | 1.0 s (121 steps) | -2.9% | -5.2% | 3/5 | 5.2% |

So the first second after a 5-step warm-up reads low whatever its step count (tiny_cnn:
its steps drift faster over that second, and the per-step CI, which takes them as
independent, misses it), and past it 10 steps read what 60 do, inside the spread
between fresh processes (5-18%), which no window length removes: the time floor
(`min_window_s`) is the one that matters, and the step floor is 10 (it was 30).

Several `--config 'knob=v,knob=v'` run interleaved (A B A B ...), each against its
own long window. Needs torch only. Readable table; the last line is one JSON
object: {"configs": [{"knobs", "processes": [...], "prefixes": [{"steps" or
"seconds", "bias_median", "bias_worst", "covered", "cv"}]}]}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
STEP_PREFIXES = (10, 20, 30, 40, 60, 100, 200)
SECOND_PREFIXES = (0.25, 0.5, 1.0, 2.0, 5.0)


def child(config: dict) -> dict:
    """One process: warm-up, then one window of exactly `steps` steps; every step's time (ms)."""
    from autotune.trial import measure as M
    from autotune.trial import runner as T
    from autotune import workload as W
    from autotune.trial.request import check_config

    steps = int(config.pop("steps"))
    cfg = check_config(config)
    device = T.detect_device(cfg["device"])
    workload = W.load(W.trial_source(cfg["workload"], "."), cfg["workload"].get("args"))  # as run_trial loads it
    knobs = {**cfg["knobs"], "batch_size": cfg["knobs"]["batch_size"] or workload.batch_size}

    class Keep(M.WindowRule):  # a fixed window that hands over its step times at its end
        times: list = []

        def done(self, n, elapsed, step_times, capped=False):
            if n >= steps + 1:  # one step more: the first `steps` are complete on a GPU too (its events lag)
                Keep.times = step_times()[:steps]
                return True
            return False

    session = T.prepare(workload, knobs, device, cfg["warmup_steps"] + steps + 3, seed=cfg["seed"])
    batches = iter(session.loader)
    for _ in range(cfg["warmup_steps"]):
        session.step(next(batches))
    session.sync()
    M.timed_window(session, batches, Keep(max_s=1e9, max_steps=10**9, settle=False))
    return {"batch_size": knobs["batch_size"], "steps_ms": Keep.times}


def prefix_stats(times: list[float]) -> dict:
    from autotune.stats import t_rel_ci95

    return {"mean_ms": sum(times) / len(times), "ci": t_rel_ci95(times)}


def analyze(processes: list[dict]) -> list[dict]:
    """Per prefix: its throughput / the whole window's (per process), whether the
    whole window's mean lay inside the prefix's t-CI, the prefix's CV across processes."""
    rows = []
    longest = min(len(p["steps_ms"]) for p in processes)
    cuts = [("steps", s, lambda t, s=s: t[:s]) for s in STEP_PREFIXES if s < longest]
    cuts += [("seconds", s, lambda t, s=s: _first_seconds(t, s)) for s in SECOND_PREFIXES]
    for unit, size, cut in cuts:
        bias, covered, rates, n = [], 0, [], []
        for p in processes:
            whole = sum(p["steps_ms"]) / len(p["steps_ms"])
            part = cut(p["steps_ms"])
            if len(part) < 3 or len(part) >= len(p["steps_ms"]):
                break
            st = prefix_stats(part)
            bias.append(whole / st["mean_ms"] - 1)  # throughput read by the prefix / the whole window's
            covered += abs(st["mean_ms"] - whole) <= st["ci"] * st["mean_ms"]
            rates.append(p["batch_size"] / st["mean_ms"] * 1e3)
            n.append(len(part))
        else:
            rows.append(
                {
                    unit: size,
                    "n_steps": round(statistics.median(n)),
                    "bias_median": statistics.median(bias),
                    "bias_worst": max(bias, key=abs),
                    "covered": f"{covered}/{len(processes)}",
                    "cv": statistics.stdev(rates) / statistics.mean(rates) if len(rates) > 1 else None,
                }
            )
    whole = [p["batch_size"] / (sum(p["steps_ms"]) / len(p["steps_ms"])) * 1e3 for p in processes]
    rows.append(
        {
            "steps": longest,
            "n_steps": longest,
            "bias_median": 0.0,
            "bias_worst": 0.0,
            "covered": "-",
            "cv": statistics.stdev(whole) / statistics.mean(whole) if len(whole) > 1 else None,
        }
    )
    return rows


def _first_seconds(times: list[float], seconds: float) -> list[float]:
    out, total = [], 0.0
    for t in times:
        if total >= seconds * 1e3:
            break
        out.append(t)
        total += t
    return out


def parse_knobs(text: str) -> dict:
    from autotune.trial.runner import parse_set

    return parse_set([item for item in text.split(",") if item]) if text else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workload", default="tiny_cnn")
    ap.add_argument("--arg", action="append", default=[], help="workload argument, name=value")
    ap.add_argument("--set", action="append", default=[], help="a knob of every config, name=value")
    ap.add_argument("--config", action="append", default=[], help="one config's knobs, 'knob=v,knob=v' (repeatable)")
    ap.add_argument("--steps", type=int, default=60, help="the long window's steps")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--reps", type=int, default=4, help="fresh processes per config")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(Path(args.child).read_text()))))
        return 0
    from autotune.trial.runner import parse_set

    base = {
        "workload": {"name": args.workload, "args": parse_set(args.arg)},
        "warmup_steps": args.warmup,
        "steps": args.steps,
    }
    configs = [{**parse_set(args.set), **parse_knobs(c)} for c in (args.config or [""])]
    runs: list[list[dict]] = [[] for _ in configs]
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_window-{os.getpid()}.json"
    started = time.time()
    for rep in range(args.reps):
        for i, knobs in enumerate(configs):
            tmp.write_text(json.dumps({**base, "knobs": knobs}))
            proc = subprocess.run(
                [sys.executable, __file__, "--child", str(tmp)], capture_output=True, text=True, env=ENV
            )
            if proc.returncode:
                sys.stderr.write(proc.stderr[-3000:])
                raise SystemExit(f"config {knobs}: the process exited {proc.returncode}")
            runs[i].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    tmp.unlink(missing_ok=True)
    out = {"workload": base["workload"], "reps": args.reps, "wall_s": round(time.time() - started, 1), "configs": []}
    for knobs, processes in zip(configs, runs):
        rows = analyze(processes)
        whole = [p["batch_size"] / (sum(p["steps_ms"]) / len(p["steps_ms"])) * 1e3 for p in processes]
        print(
            f"\n{args.workload} {knobs or '(defaults)'}: {args.reps} processes of {args.steps} steps, "
            f"samples/s {', '.join(f'{w:.1f}' for w in whole)}"
        )
        print(f"{'prefix':>10} {'steps':>6} {'bias med':>9} {'worst':>8} {'mean in CI':>11} {'CV procs':>9}")
        for r in rows:
            name = f"{r['steps']} st" if "steps" in r else f"{r['seconds']} s"
            cv = f"{r['cv']:.1%}" if r["cv"] is not None else "-"
            print(
                f"{name:>10} {r['n_steps']:>6} {r['bias_median']:>+9.1%} {r['bias_worst']:>+8.1%} "
                f"{r['covered']:>11} {cv:>9}"
            )
        out["configs"].append(
            {
                "knobs": knobs,
                "samples_per_s": [round(w, 2) for w in whole],
                "prefixes": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
            }
        )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
