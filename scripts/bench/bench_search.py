"""How fast does each search strategy find the best region? Replays recorded
landscapes (CSV: knobs -> status, throughput, trial cost; written by
scripts/dev/record_landscape.py or a grid search's trials.csv) with autotune's own
`Strategy` (the code a real search runs), random search (without replacement)
and Optuna's plain TPE, each from the baseline (the landscape's diagnosed
point, else PyTorch defaults at the smallest batch), over many seeds. Reports the median number of trials and of
seconds (the sum of the recorded trial costs) until a trial reaches 95% of the
landscape's best throughput. Needs optuna only (no torch, no Ray).

What a replay can and cannot show: a point is diagnosed in the replay only
where its row records a bottleneck (the recorded landscapes: the baseline
only), so the strategy's climb past the first incumbent runs as it does without
a diagnosis (each knob its turn). Re-diagnosing every incumbent (a bottleneck
that moves) is tested on synthetic landscapes (tests/test_strategy.py), and
live on a GPU; the time budget's compile scheduling is not replayed.

    python scripts/bench/bench_search.py [LANDSCAPE.csv ...] [--seeds 100]

Each trial is charged what it would cost under the search's rules
(docs/search.md): pruned, or stopped by its screening window once it cannot
beat the incumbent, or by its promoted window once it clearly beats it, or by
its tied window once inside the incumbent's interval and known as well, and
the baseline (the first incumbent) at a promoted window's precision (the
recorded landscapes ran no profile, diagnosis or parity off the baseline, so
nothing else changes).

Readable table; the last line is one JSON object: per landscape and strategy,
median_trials_to_95 and median_seconds_to_95. A strategy that never reaches
95% within --max-trials counts as --max-trials (and is reported as censored).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import random
import statistics
import sys
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

from autotune import knobs as K  # noqa: E402
from autotune.stats import gap_ci, incumbent_interval, promote_floor  # noqa: E402
from autotune.trial.request import DEFAULTS  # noqa: E402
from autotune.decide.strategy import MAX_INCUMBENT_CI, Strategy  # noqa: E402

LANDSCAPES = sorted((ROOT / "scripts" / "bench" / "landscapes").glob("*.csv"))
# the realistic GPU landscapes (scripts/gpu/gpu_day.sh records them over several lent GPUs): replayed from 200 points on
GROWING, GROWING_MIN_POINTS = "_gpunorm.csv", 200
STRATEGIES = ("autotune", "random", "tpe")
TARGET = 0.95
PRUNE_MARGIN = 0.2  # the search's default trial.prune_margin
MIN_WINDOW_S = 1.0  # a pruned trial stops its window at about this
REREAD_START_S = 1.0  # the anchor's second read beyond its window: a forked process and its warm-up (on a CPU: 1 s)


class Landscape:
    """A recorded landscape, restricted to its largest complete grid."""

    def __init__(self, path: Path):
        self.path, self.name = path, path.stem
        with path.open() as f:
            rows = list(csv.DictReader(f))
        for r in rows:
            r["knobs"] = {k: K.from_cell(k, r.get(k)) for k in K.KNOBS}  # a column it lacks: the default
        self.restricted = {}
        while True:  # knobs recorded off the grid: keep their most common value
            values = {k: sorted({r["knobs"][k] for r in rows}, key=str) for k in K.KNOBS}
            searched = {k: v for k, v in values.items() if len(v) > 1}
            points = {tuple(r["knobs"][k] for k in searched) for r in rows}
            size = 1
            for v in searched.values():
                size *= len(v)
            if len(points) == size:
                break
            # restrict the knob whose most common value keeps the most rows
            k = max(searched, key=lambda k: Counter(r["knobs"][k] for r in rows).most_common(1)[0][1])
            keep = Counter(r["knobs"][k] for r in rows).most_common(1)[0][0]
            self.restricted[k] = keep
            rows = [r for r in rows if r["knobs"][k] == keep]
        self.space = {k: sorted(v, key=lambda x: (isinstance(x, str), x)) for k, v in searched.items()}
        # ladders in their natural order; the rest as recorded
        self.names = list(self.space)
        self.rows = {tuple(r["knobs"][k] for k in self.names): r for r in rows}
        # the baseline: the diagnosed point (record_landscape.py's baseline), else
        # PyTorch's defaults at the smallest batch
        # (a grid search's trials.csv marks its baseline, and diagnoses every trial)
        diagnosed = [r for r in rows if str(r.get("baseline")) == "True"] or [r for r in rows if r.get("bottleneck")]
        defaults = diagnosed[0]["knobs"] if diagnosed else K.pytorch_defaults(min(values["batch_size"]))
        self.baseline = {k: defaults[k] for k in self.names}
        base_row = self.rows[tuple(self.baseline[k] for k in self.names)]
        self.bottleneck = base_row.get("bottleneck") or None
        self.device_type = "cpu" if base_row.get("device_name") == "cpu" else "cuda"
        ok = [float(r["samples_per_s"]) for r in rows if r["status"] in ("ok", "pruned")]
        self.best = max(ok)
        self.near_best = sum(v >= TARGET * self.best for v in ok)

    def lookup(self, params: dict) -> tuple[str, float | None, float, float]:
        r = self.rows[tuple(params[k] for k in self.names)]
        value = float(r["samples_per_s"]) if r["status"] in ("ok", "pruned") else None
        window = float(r["window_s"] or 0)
        return r["status"], value, float(r["trial_wall_s"]), window

    def ci(self, params: dict) -> float:
        """The recorded window's step-time CI (95%, relative); inf where not recorded."""
        cell = self.rows[tuple(params[k] for k in self.names)].get("step_mean_ci95")
        return float(cell) if cell not in (None, "") else float("inf")

    def diagnosis(self, params: dict) -> dict | None:
        """The point's recorded bottleneck, as a diagnosis the strategy moves
        from (its moves: the playbook's for that bottleneck); None where the
        landscape has none (all but the baseline, today)."""
        bottleneck = self.rows[tuple(params[k] for k in self.names)].get("bottleneck")
        return {"bottleneck": bottleneck} if bottleneck else None


def replay(land: Landscape, kind: str, seed: int, max_trials: int) -> tuple[int, float, bool]:
    """Trials and seconds until a trial reaches 95% of the landscape's best."""
    spent, trials = 0.0, 0
    if kind == "random":  # without replacement: the fair random baseline
        order = [dict(zip(land.names, p)) for p in itertools.product(*land.space.values())]
        random.Random(seed).shuffle(order)
        order.sort(key=lambda p: p != land.baseline)  # the baseline first (a stable sort)
        for params in order[:max_trials]:
            status, value, cost, _ = land.lookup(params)
            trials, spent = trials + 1, spent + cost
            if value is not None and value >= TARGET * land.best:
                return trials, spent, True
        return max_trials, spent, False
    if kind == "tpe":  # Optuna's TPE as it comes; its repeats run again, as they would
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
        study.enqueue_trial(land.baseline)
        for _ in range(max_trials):
            trial = study.ask()
            params = {k: trial.suggest_categorical(k, land.space[k]) for k in land.names}
            status, value, cost, _ = land.lookup(params)
            trials, spent = trials + 1, spent + cost
            study.tell(trial, value) if value is not None else study.tell(trial, state=optuna.trial.TrialState.FAIL)
            if value is not None and value >= TARGET * land.best:
                return trials, spent, True
        return max_trials, spent, False
    study = optuna.create_study(direction="maximize")
    strategy = Strategy(study, land.space, land.baseline, "autotune", seed=seed)
    promote_ci = promote_floor(DEFAULTS["target_ci"], land.device_type)  # a promoted window's, by default
    while trials < max_trials:
        proposal = strategy.ask()
        if proposal is None:
            break
        status, value, cost, window = land.lookup(proposal.params)
        floor, bar = strategy.prune_below(PRUNE_MARGIN), strategy.incumbent_bar(proposal.params)
        above, ci, kept = bar["incumbent_above"], land.ci(proposal.params), False
        known = incumbent_interval(bar["incumbent_ci"], land.device_type)
        if value is not None and bar.get("anchor"):
            # the anchor (the baseline, the first incumbent): it stops at +-promote_ci, a promoted window's floor,
            # and is read again in a fresh process, its window alone (confirm.reread_anchor), charged once more
            # with REREAD_START_S (a landscape holds one read: the two reads' gap is not replayed)
            anchor = max(MIN_WINDOW_S, window * (ci / promote_ci) ** 2) if ci < promote_ci else window
            cost += 2 * anchor - window + REREAD_START_S
            ci = max(ci, promote_ci)
        elif value is not None and floor and value < floor:  # stopped after a short window
            status, cost = "pruned", cost - max(0.0, window - MIN_WINDOW_S)
        elif value is not None and above and value * (1 + ci) < above * (1 - known):
            # a screening window (docs/search.md) stops once its CI says it cannot beat the
            # incumbent (charged at the window's minimum; the recorded CI, at the window's end, stands in for
            # the CI at that point, an optimistic stand-in); no profile, diagnosis or parity
            cost -= max(0.0, window - MIN_WINDOW_S)
        elif (
            value is not None
            and above
            and value * (1 - ci) > above * (1 + known)
            and ci < (allowed := gap_ci(value / (above * (1 + known)) - 1, promote_ci))
        ):
            # a promoted window: clearly ahead, it stops at +-promote_ci, or a quarter of its lead where looser
            # (steps ~ 1 / CI^2: the recorded window scaled down, never below its minimum)
            cost -= max(0.0, window - max(MIN_WINDOW_S, window * (ci / allowed) ** 2))
        elif value is not None and above and ci < known and value * (1 - ci) <= above * (1 + known):
            # a tied window: reaching into the incumbent's own interval, it stops once known as well as the incumbent
            cost -= max(0.0, window - max(MIN_WINDOW_S, window * (ci / known) ** 2))
            # riskier numerics read inside the incumbent's interval above its bar: the incumbent stays
            kept = above < value <= above * (1 + known) and bar.get("tie_keeps_incumbent", False)
        trials, spent = trials + 1, spent + cost
        strategy.tell(
            proposal.trial,
            status,
            value,
            diagnosis=land.diagnosis(proposal.params) if value else None,
            attrs={"ci": min(ci, MAX_INCUMBENT_CI), **({"tie_kept": True} if kept else {})},
        )
        if value is not None and value >= TARGET * land.best:
            return trials, spent, True
    return max_trials, spent, False


def default_landscapes() -> list[Path]:
    """The committed landscapes, less a growing one still short of GROWING_MIN_POINTS (said so)."""
    out = []
    for path in LANDSCAPES:
        points = sum(1 for _ in csv.DictReader(path.open())) if path.name.endswith(GROWING) else None
        if points is not None and points < GROWING_MIN_POINTS:
            print(
                f"{path.name}: {points} points, replayed from {GROWING_MIN_POINTS} on (scripts/gpu/gpu_day.sh adds more)"
            )
        else:
            out.append(path)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "landscapes",
        nargs="*",
        type=Path,
        help=f"CSVs (default: scripts/bench/landscapes/, a *_gpunorm.csv once it has {GROWING_MIN_POINTS} points)",
    )
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--max-trials", type=int, default=100)
    args = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    if not args.landscapes:
        args.landscapes = default_landscapes()
    if not args.landscapes:
        raise SystemExit("no landscape CSVs given and none in scripts/bench/landscapes/")
    report = {}
    print(f"{'landscape':28} {'strategy':9} {'trials to 95%':>14} {'seconds to 95%':>15} {'not reached':>12}")
    for path in args.landscapes:
        land = Landscape(path)
        size = len(land.rows)
        fixed = ", ".join(f"{k}={v}" for k, v in land.restricted.items())
        print(
            f"\n{land.name}: {size} points ({' x '.join(f'{k}{len(v)}' for k, v in land.space.items())}"
            f"{'; off-grid rows dropped: kept ' + fixed if fixed else ''}), best {land.best:.0f} samples/s, "
            f"{land.near_best} points within 95%, baseline bottleneck {land.bottleneck or 'unknown'}"
        )
        entry = {"points": size, "near_best_points": land.near_best, "best_samples_per_s": land.best}
        for kind in STRATEGIES:
            runs = [replay(land, kind, seed, args.max_trials) for seed in range(args.seeds)]
            t = statistics.median(r[0] for r in runs)
            s = statistics.median(r[1] for r in runs)
            censored = sum(not r[2] for r in runs)
            entry[kind] = {"median_trials_to_95": t, "median_seconds_to_95": round(s, 1), "not_reached": censored}
            print(f"{land.name[:28]:28} {kind:9} {t:>14g} {s:>15.0f} {censored:>9}/{args.seeds}")
        a, r = entry["autotune"]["median_trials_to_95"], entry["random"]["median_trials_to_95"]
        entry["trials_vs_random_x"] = r / a
        entry["meets_target"] = a <= 15 and r / a >= 2
        print(
            f"autotune: {a:g} trials median (target <= 15), {r / a:.1f}x fewer than random (target >= 2x): "
            f"{'met' if entry['meets_target'] else 'NOT met'}"
        )
        report[land.name] = entry
    print(json.dumps({"seeds": args.seeds, "target": TARGET, "landscapes": report}))


if __name__ == "__main__":
    main()
