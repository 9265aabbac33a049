"""Why does the side-by-side re-measurement read the baseline low (issue 64)? One baseline and one best, measured
side by side in each of the ways a re-measurement could differ from the process the user runs, so that a cause in
the re-measurement itself shows as a way that reads the baseline (or the ratio) apart from the others:

- `fork`: as a search re-measures: forked from a warm fork server (the search's shared one), 5 warm-up steps, a
  timed window of `--window-s`, the window alone (no profile, diagnosis or parity);
- `spawn`: the same, each process a fresh interpreter (`python -m autotune.trial`);
- `production` (a program only): its own loop in a fresh process as `autotune run` starts it (AUTOTUNE_CONFIG),
  timed by its step log: the same `--window-s` after 5 steps, and steps 30-200 (`production_long`: what
  scripts/bench/bench_program.py and the issue's production figures read);
- `warm30`: forked, 30 warm-up steps before the same window;
- `window4`: forked, a 4-s window;
- `threads1`: forked, one intra-op thread on both sides (OMP_NUM_THREADS=1): 2 threads on 2 cores wait at every
  op's barrier for a core that anything else may hold;
- `gap5`: forked, 5 s with nothing running before each process (the search's processes run back to back);
- `after_compile`: forked, each baseline right after a cold `compile=default` process of the same workload (a
  compiled trial, a parity check of a compiled best: what comes right before a search's first pair);
- `ray`: forked, a local Ray started by this script idling beside (as the search's Ray does while it re-measures).

Each rep runs every way once, the ways' order rotated and each way's pair in turn (A B, then B A), so the host's
drift falls on all. Per process: its throughput (tokens/s for a language model), the others' share of the host's CPU
during its window (autotune.trial.disturbance), its intra-op threads, and this script's own CPU while it waited (the
search's driver is such a process). Per way: each side's median and range, the pairs' ratios, and the baseline
against the `spawn` way's.

    python scripts/dev/remeasure_ways.py --kind quickstart --reps 4
    python scripts/dev/remeasure_ways.py --kind plain_lm --reps 4
    python scripts/dev/remeasure_ways.py --kind quickstart --reps 1 --ways fork,spawn --window-s 0.2   # does it run

A readable table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts" / "bench")]

from autotune.execution.launcher import Launch, run_in_process, start_shared  # noqa: E402
from autotune.trial.request import parse_set  # noqa: E402
from autotune.trial.result import unit_of  # noqa: E402

PROGRAMS = ROOT / "tests" / "programs"
KINDS = {
    # the quickstart's workload and its usual winner on a 2-core CPU (README: 1.44x)
    "quickstart": ({"name": "tiny_cnn", "args": {"batch_size": 32}}, "batch_size=64,precision=bf16-mixed"),
    # an eager language-model loop against it compiled with a fused AdamW (nanoGPT's winner in the issue)
    "plain_lm": (
        {"command": ["python", "plain_lm.py", "--steps", "100000", "--batch_size", "16"], "dir": str(PROGRAMS)},
        "compile=default,fused_optimizer=true",
    ),
    "accelerate_lm": (
        {
            "command": [
                "python",
                "accelerate_lm.py",
                "--max_train_steps",
                "100000",
                "--per_device_train_batch_size",
                "8",
            ],
            "dir": str(PROGRAMS),
        },
        "compile=default,channels_last=true",
    ),
}
WAYS = ("fork", "spawn", "production", "warm30", "window4", "threads1", "gap5", "after_compile", "ray")
LONG = (30, 200)  # production_long: the steps bench_program.py times


def trial_config(workload: dict, knobs: dict, warmup: int, window_s: float) -> dict:
    """A re-measurement's request: the window alone, of a fixed length (so every way times as long)."""
    return {
        "workload": workload,
        "knobs": knobs,
        "warmup_steps": warmup,
        "measure_steps": 10,
        "min_window_s": window_s,
        "max_window_s": window_s,
        "target_ci": 0.5,
        "profile_steps": 0,
        "diagnose": False,
    }


class Harness:
    """What runs one process of a way: the experiment's work dir, its shared fork server (as a search's), and a
    warm inductor cache shared by the measured processes (a compile is paid once; the window follows it)."""

    def __init__(self, kind: str, workload: dict, a):
        self.kind, self.workload, self.a = kind, workload, a
        self.work = Path(tempfile.mkdtemp(prefix=f"remeasure-{kind}-"))
        self.cache = {"TORCHINDUCTOR_CACHE_DIR": str(self.work / "inductor"), "TRITON_CACHE_DIR": str(self.work / "t")}
        self.forks = start_shared(workload, str(ROOT), {})
        self.n = 0

    def trial(self, way: str, knobs: dict, cold: bool = False) -> dict:
        """One trial-mode process of `knobs` as `way` launches it."""
        warmup = 30 if way == "warm30" else 5
        window = 4.0 if way == "window4" else self.a.window_s
        threads = {"OMP_NUM_THREADS": "1"} if way == "threads1" else {}
        launch = Launch("spawn") if way == "spawn" else Launch(shared=self.forks.path if self.forks else None)
        self.n += 1
        cpu = _own_cpu()
        result = run_in_process(
            trial_config(self.workload, knobs, warmup, window),
            self.work / f"{self.n:03d}-{way}",
            self.a.timeout,
            str(ROOT),
            threads,
            launch=launch,
            env=None if cold else self.cache,
        )
        if not result.ok:
            return {"error": f"{result.status}: {result.error}"}
        m = result.metrics
        unit = unit_of(m)
        return {
            "rate": m[unit.metric],
            "unit": unit.label,
            "window_s": m.get("window_s"),
            "others_cpu": m.get("host_other_cpu_frac"),
            "threads": result.device.torch_threads if result.device else None,
            "launcher": result.launcher,
            "driver_cpu": (_own_cpu() - cpu) / max(result.trial_wall_s or 1.0, 1e-9),
        }

    def production(self, knobs: dict) -> dict:
        """The program's own loop in a fresh process as production starts it, its step log read over the same
        window as a trial's (its first `--window-s` after 5 steps) and over steps 30-200."""
        from bench_program import run_once

        config = self.work / f"config-{len(knobs)}-{abs(hash(json.dumps(knobs, sort_keys=True)))}.yaml"
        config.write_text(yaml.safe_dump({"knobs": knobs, "device": {"type": "cpu"}}))
        out = run_once(self.workload["command"], self.workload["dir"], config, LONG[1], 5, self.a.timeout)
        log = out["log"]
        counts = log.get("tokens") if all(log.get("tokens") or [None]) else log["samples"]
        return {
            "rate": _rate(log["marks"], counts, 5, self.a.window_s),
            "long": _rate(log["marks"], counts, LONG[0], None),
            "unit": "tokens/s" if counts is log.get("tokens") else "samples/s",
        }

    def close(self) -> None:
        if self.forks:
            self.forks.close()


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rate(marks: list[float], counts: list, start: int, seconds: float | None) -> float | None:
    """Samples (or tokens) a second over the steps after step `start`: for `seconds` (a window's length), or to
    the end."""
    if len(marks) <= start + 2:
        return None
    end = len(marks) - 1
    if seconds is not None:
        end = next((i for i in range(start + 1, len(marks)) if marks[i] - marks[start] >= seconds), end)
    span = marks[end] - marks[start]
    return sum(counts[start + 1 : end + 1]) / span if span > 0 else None


def run_way(h: Harness, way: str, sides: dict, rep: int) -> list[dict]:
    """One pair of `way`: the two sides in this rep's order, each a process."""
    order = ("baseline", "best") if rep % 2 == 0 else ("best", "baseline")
    pair = {}
    for side in order:
        if way == "gap5":
            time.sleep(5)
        if way == "after_compile" and side == "baseline":
            h.trial("fork", {**sides["baseline"], "compile": "default"}, cold=True)  # not counted
        pair[side] = h.production(sides[side]) if way == "production" else h.trial(way, sides[side])
    return [{"way": way, "rep": rep, "side": s, **pair[s]} for s in order]


def measure(kind: str, a) -> list[dict]:
    workload, best = KINDS[kind]
    sides = {"baseline": {}, "best": parse_set([k for k in (a.best or best).split(",") if k])}
    ways = [w for w in a.ways.split(",") if w and not (w == "production" and "command" not in workload)]
    h = Harness(kind, workload, a)
    rows: list[dict] = []
    try:
        for rep in range(a.reps):
            for way in ways[rep % len(ways) :] + ways[: rep % len(ways)]:  # each way first in turn
                ray = way == "ray" and _ray_up()
                try:
                    rows += run_way(h, way, sides, rep)
                finally:
                    if ray:
                        _ray_down()
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        h.close()
    return rows


def _ray_up() -> bool:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from autotune.execution.raytune import init_ray

    return init_ray(None)


def _ray_down() -> None:
    from autotune.execution.raytune import shutdown_ray

    shutdown_ray()


def summarize(rows: list[dict]) -> dict:
    """Per way: each side's median and range, the pairs' ratios, the others' CPU and this script's, the threads;
    the baseline against the `spawn` way's median (a fresh interpreter, the process a user starts)."""
    out = {}
    for way in dict.fromkeys(r["way"] for r in rows):
        mine = [r for r in rows if r["way"] == way and r.get("rate")]
        side = {s: [r["rate"] for r in mine if r["side"] == s] for s in ("baseline", "best")}
        pairs = [
            b["rate"] / a["rate"]
            for a in mine
            for b in mine
            if a["side"] == "baseline" and b["side"] == "best" and a["rep"] == b["rep"]
        ]
        out[way] = {
            **{f"{s}_median": _median(v) for s, v in side.items()},
            **{f"{s}_range": [round(min(v), 1), round(max(v), 1)] if v else None for s, v in side.items()},
            "ratio_median": _median(pairs, 3),
            "ratio_range": [round(min(pairs), 3), round(max(pairs), 3)] if pairs else None,
            "others_cpu_median": _median([r["others_cpu"] for r in mine if r.get("others_cpu") is not None], 3),
            "driver_cpu_median": _median([r["driver_cpu"] for r in mine if r.get("driver_cpu") is not None], 3),
            "threads": sorted({r["threads"] for r in mine if r.get("threads")}),
            "errors": [r["error"] for r in rows if r["way"] == way and r.get("error")],
        }
        if way == "production":
            out["production_long"] = {"baseline_median": _median([r["long"] for r in mine if r["side"] == "baseline"])}
            out["production_long"]["best_median"] = _median([r["long"] for r in mine if r["side"] == "best"])
    spawn = (out.get("spawn") or {}).get("baseline_median")
    for s in out.values():
        s["baseline_vs_spawn"] = round(s["baseline_median"] / spawn, 3) if spawn and s.get("baseline_median") else None
    return out


def _median(values: list, digits: int = 1):
    return round(statistics.median(values), digits) if values else None


def table(kind: str, unit: str, summ: dict) -> str:
    lines = [
        f"{kind}: baseline and best, side by side, {unit}",
        f"{'way':<16} {'baseline (range)':>24} {'best (range)':>24} {'best/base (range)':>22} "
        f"{'base/spawn':>10} {'others':>7} {'driver':>7}  threads",
    ]
    for way, s in summ.items():
        base = _cell(s.get("baseline_median"), s.get("baseline_range"))
        best = _cell(s.get("best_median"), s.get("best_range"))
        ratio = _cell(s.get("ratio_median"), s.get("ratio_range"), "{:.3f}")
        vs = f"{s['baseline_vs_spawn']:.3f}" if s.get("baseline_vs_spawn") else "-"
        others = f"{s['others_cpu_median']:.0%}" if s.get("others_cpu_median") is not None else "-"
        driver = f"{s['driver_cpu_median']:.0%}" if s.get("driver_cpu_median") is not None else "-"
        lines.append(
            f"{way:<16} {base:>24} {best:>24} {ratio:>22} {vs:>10} {others:>7} {driver:>7}  {s.get('threads') or '-'}"
        )
        lines += [f"{'':<16} error: {e}" for e in s.get("errors") or []]
    return "\n".join(lines)


def _cell(median, span, fmt: str = "{:,.0f}") -> str:
    if median is None:
        return "-"
    return f"{fmt.format(median)} ({fmt.format(span[0])}-{fmt.format(span[1])})" if span else fmt.format(median)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", default="quickstart", choices=sorted(KINDS))
    p.add_argument("--best", default=None, help="the best's knobs, 'knob=v,knob=v' (default: the kind's)")
    p.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of: {', '.join(WAYS)}")
    p.add_argument("--reps", type=int, default=4, help="pairs of each way")
    p.add_argument("--window-s", type=float, default=1.0, help="the timed window (a re-measurement's: ~1 s)")
    p.add_argument("--timeout", type=float, default=300)
    a = p.parse_args(argv)
    unknown = set(w for w in a.ways.split(",") if w) - set(WAYS)
    if unknown or a.reps < 1:
        print(f"error: --ways: of {', '.join(WAYS)}; --reps: 1 or more", file=sys.stderr)
        return 2
    load = [os.getloadavg()[0]]
    started = time.perf_counter()
    rows = measure(a.kind, a)
    load.append(os.getloadavg()[0])
    summ = summarize(rows)
    unit = next((r["unit"] for r in rows if r.get("unit")), "samples/s")
    print(table(a.kind, unit, summ))
    print(f"load average {load[0]:.2f} at the start, {load[1]:.2f} at the end; {time.perf_counter() - started:.0f} s")
    print(json.dumps({"kind": a.kind, "unit": unit, "ways": summ, "rows": rows, "load": load}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
