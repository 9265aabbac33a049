"""Where a search's seconds go: one `autotune search SPEC -q` run in this
process (the CLI's own code path), with the real calls of each phase timed
(start-up imports, Ray start, the workload built in the driver, the study and
MLflow run opened, the trials, the late parity check, the re-measurement, the
export, the plots, MLflow's last writes, Ray's shutdown, the summary) and each
trial's own phases from its result.json (`phases_s`: setup, warm-up, window,
profile, two sides, FLOPs, 2x probe, parity; the launcher's share is its wall
time less the runner's).

    python scripts/dev/search_phases.py [SPEC] [--out DIR] [--trials N] [--backend local]

`--trials N` runs the spec with `search.n_trials: N` (a copy beside the run dir);
`--trials 1` gives the floor: what a search costs before its trials add anything
(start-up, the baseline's trial, the finish). On an AVX2-only 2-core host
(2026-11-25) the quickstart's floor was 27.9-30.2 s, its 10 trials 42.1-66.7 s.

SPEC defaults to search_spaces/examples/quickstart.yaml. Readable table; the
last line of stdout is one JSON object: {"wall_s", "phases": {name: seconds},
"trials": [{"number", "wall_s", "launcher_s", "phases": {...}}]}.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
T0 = time.perf_counter()
SPANS: list[tuple[str, float, float]] = []  # (phase, start, end), perf_counter seconds


def timed(owner, name: str, label: str) -> None:
    """Time every call of `owner.name` (the real function, called as it is) as `label`."""
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPANS.append((label, start, time.perf_counter()))

    setattr(owner, name, wrapper)


def instrument() -> None:
    from ray import tune

    from autotune.decide import checked
    from autotune.decide import confirm
    from autotune.execution import driver
    from autotune.export import best_config as export
    from autotune.records import plots
    from autotune.execution import raytune
    from autotune.cli import report
    from autotune.execution import startup
    from autotune.integrations import tracking

    SPANS.append(("imports (cli, driver: Ray, Optuna, torch)", T0, time.perf_counter()))
    timed(raytune, "init_ray", "ray start")
    timed(raytune, "shutdown_ray", "ray shutdown")
    timed(startup, "prepare", "workload, its optimizer, MLflow store (beside ray start)")
    from autotune import knobs
    from autotune.records import cache
    from autotune.trial import ranks

    timed(startup, "open_search", "study, MLflow parent run opened")
    timed(cache, "machine", "the machine's key (cache)")
    timed(cache, "Lookup", "an earlier search of the same question looked for")
    timed(raytune, "detect_device", "device detected through Ray")
    timed(knobs, "resolve_space", "space resolved")
    timed(ranks, "search_problem", "multi-rank checks")
    timed(tracking, "adopt_store", "MLflow store adopted")
    timed(driver, "reconcile", "study reconciled with trials.csv")
    timed(driver.optuna, "create_study", "Optuna study (SQLite)")
    timed(tune.Tuner, "fit", "trials (Ray Tune)")
    timed(checked, "pick_checked", "late parity check")
    timed(confirm, "remeasure", "re-measurement (confirm)")
    timed(export, "write_best_config", "best_config.yaml")
    timed(plots, "write_all", "plots and knob importance (fANOVA)")
    timed(tracking.Tracker, "finish", "MLflow: summary, artifacts, plots")
    timed(report, "summary", "summary printed")


def trial_phases(run_dir: Path) -> list[dict]:
    """Each trial's and re-measurement's phases; `wall_s`: the trial as the
    driver's side saw it (start-up included; the runner's own time for a
    re-measurement, whose wall is not recorded), `launcher_s` the difference."""
    from autotune.records.run_dir import read_run
    from autotune.trial.result import TrialResult

    walls = {Path(r.trial_dir).name: r.info.get("trial_wall_s") for r in read_run(run_dir).records if r.trial_dir}
    out = []
    for path in sorted((run_dir / "trials").glob("*/result.json")) + sorted(
        (run_dir / "confirm").glob("*/result.json")
    ):
        result = TrialResult.read(path)
        own = result.trial_s or 0.0
        wall = walls.get(path.parent.name) or own
        out.append(
            {
                "number": path.parent.name,
                "status": result.status,
                "wall_s": round(wall, 2),
                "launcher_s": round(wall - own, 2),
                "phases": {k: round(v, 2) for k, v in (result.phases_s or {}).items()},
            }
        )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("spec", nargs="?", default=str(ROOT / "search_spaces" / "examples" / "quickstart.yaml"))
    p.add_argument("--out", type=Path, default=None, help="the search's run dir (default: a temp dir)")
    p.add_argument("--trials", type=int, default=None, help="override the spec's search.n_trials")
    p.add_argument("--backend", default=None, help="`autotune search --backend` (default: the search's own)")
    args = p.parse_args(argv)
    run_dir = args.out or Path(tempfile.mkdtemp(prefix="search_phases-", dir=os.environ.get("TMPDIR"))) / "run"
    if args.trials is not None:
        import yaml

        spec = yaml.safe_load(Path(args.spec).read_text())
        spec.setdefault("search", {})["n_trials"] = args.trials
        args.spec = str(run_dir.parent / f"{run_dir.name}-spec.yaml")
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        Path(args.spec).write_text(yaml.safe_dump(spec))
    instrument()
    from autotune.cli.main import app

    log = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(log):
        try:
            backend = ["--backend", args.backend] if args.backend else []
            app(["search", args.spec, "-q", "-o", str(run_dir), *backend], standalone_mode=False)
        except SystemExit:
            pass
    ended = time.perf_counter()
    print(log.getvalue()[-2000:], file=sys.stderr)
    phases: dict[str, float] = {}
    print(f"{'phase':58} {'from s':>7} {'to s':>7} {'took s':>7}")
    for label, a, b in sorted(SPANS, key=lambda s: s[1]):
        phases[label] = round(phases.get(label, 0.0) + b - a, 2)
        print(f"{label:58} {a - T0:7.1f} {b - T0:7.1f} {b - a:7.2f}")
    trials = trial_phases(run_dir)
    names = sorted(
        {k for t in trials for k in t["phases"]},
        key=lambda k: ["setup", "warmup", "window"].index(k) if k in ("setup", "warmup", "window") else 3,
    )
    print(f"\n{'trial':>12} {'status':>7} {'wall':>6} {'launch':>6} " + " ".join(f"{n[:9]:>9}" for n in names))
    for t in trials:
        print(
            f"{t['number']:>12} {t['status']:>7} {t['wall_s']:6.1f} {t['launcher_s']:6.2f} "
            + " ".join(f"{t['phases'].get(n, 0):9.2f}" for n in names)
        )
    totals = {n: round(sum(t["phases"].get(n, 0) for t in trials), 2) for n in names}
    totals["launcher"] = round(sum(t["launcher_s"] for t in trials), 2)
    print(
        f"{'all':>12} {'':>7} {sum(t['wall_s'] for t in trials):6.1f} {totals['launcher']:6.2f} "
        + " ".join(f"{totals[n]:9.2f}" for n in names)
    )
    wall = ended - T0
    print(
        f"\nwall {wall:.1f} s from the script's start ({ended - started:.1f} s from the command's); run dir {run_dir}"
    )
    print(
        json.dumps(
            {
                "wall_s": round(wall, 2),
                "command_s": round(ended - started, 2),
                "phases": phases,
                "trial_phase_totals": totals,
                "trials": trials,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
