"""When a search stops and what its time budget affords: patience (trials without
a gain above min_improvement), the cost of a trial by its compile mode; and when
the search has paid for itself (break-even)."""

from __future__ import annotations

import math
import statistics
from typing import Callable

from autotune.decide.limits import graph_of
from autotune.decide.samplers import kind


UNITS = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600}


def parse_duration(text: str, option: str = "--budget") -> float:
    """`--budget` (or another `option` of a duration): seconds from 300, 90s, 5m, 1.5h; a ValueError names what
    is allowed."""
    number = text.strip().rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text.strip()[len(number) :]
    try:
        seconds = float(number) * UNITS[unit]
    except (ValueError, KeyError):
        seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"{option}: {text!r} is not a duration; give a positive number of seconds, or with a unit: 90s, 5m, 1h"
        )
    return seconds


DEFAULT_TRIALS = 20  # search.n_trials left out, with no time budget


def trial_cap(search: dict[str, list], n_trials: int | None, budget: float | None, sampler: str) -> int:
    """How many trials a search may run: `n_trials` where given (with a time
    budget too, the first reached ends the search); left out, every point of
    the space under a time budget, else DEFAULT_TRIALS; an exhaustive sampler (the grid) runs each point once."""
    points = math.prod(len(v) for v in search.values())
    cap = n_trials or (points if budget else DEFAULT_TRIALS)
    return min(cap, points) if kind(sampler).exhaustive else cap


def no_improvement_for(values: list[float | None], min_improvement: float = 0.02) -> int:
    """Trials since the best improved by more than `min_improvement` (values in
    the order trials finished; None for failed ones)."""
    best, since = None, 0
    for v in values:
        if v is not None and (best is None or v > best * (1 + min_improvement)):
            best, since = v, 0
        else:
            since += 1
    return since


# A compile trial's cost is its warm-up (compilation) above all: relative to mode
# "default", from the live H100 searches of 2026-11-23 (resnet18_cifar: default
# 40-118 s a trial, reduce-overhead 101 s, max-autotune past a 60 s timeout).
COMPILE_COST = {"default": 1.0, "reduce-overhead": 1.5, "max-autotune": 3.0}


# a compile never measured in this search: design.md's cold compile on this project's 2-core CPU (22-29 s a
# process); the first compile trial replaces it with what it measured
COMPILE_PRIOR_S = 25.0


def compile_cost(point: dict, spent: list[tuple[dict, float, float | None]]) -> float | None:
    """Seconds `point`'s trial will spend compiling (0 for an eager one), from what the trials so far compiled
    (`spent`: each one's knobs, wall seconds and `compile_s`): a graph compiled before is a hit in the search's
    cache (the least such a repeat took); a new graph, the cold compile of its mode measured (the most it took:
    the first of each graph was cold), else another mode's scaled (COMPILE_COST); None where no compile ran."""
    mode = point.get("compile", "none")
    if mode == "none":
        return 0.0
    compiled = [(k, c) for k, _, c in spent if c and k.get("compile", "none") != "none"]
    repeats = [c for k, c in compiled if graph_of(k) == graph_of(point)]
    if repeats:
        return min(repeats)
    own = [c for k, c in compiled if k["compile"] == mode]
    if own:
        return max(own)
    scaled = [c / COMPILE_COST[k["compile"]] * COMPILE_COST[mode] for k, c in compiled if k["compile"] in COMPILE_COST]
    return max(scaled) if scaled and mode in COMPILE_COST else None


def trial_cost(point: dict, spent: list[tuple[dict, float, float | None]]) -> float | None:
    """Seconds a trial of `point` will take: the median trial's without its compile, and its compile
    (`compile_cost`; a compile never measured: COMPILE_PRIOR_S). None before any trial finished."""
    walls = [w - (c or 0.0) for _, w, c in spent if w]
    if not walls:
        return None
    compile_s = compile_cost(point, spent)
    return statistics.median(walls) + (COMPILE_PRIOR_S if compile_s is None else compile_s)


# why a search ends when the strategy has nothing left that `budget_fits` lets run
NOTHING_LEFT = (
    "no config left to try: every point measured, known infeasible, estimated to overrun the time budget, or a "
    "combination of knobs that did not each help alone"
)


RESERVE_SHARE = 0.25  # at most this share of a time budget is kept aside for the re-measurement


def remeasure_cost(records: list, rounds: int, budget: float | None = None) -> float:
    """Seconds to keep aside at the budget's end for the re-measurement after the trials, from the trials so far:
    the pairs that settle a verdict (min(`rounds`, 2); each the baseline and the best in a fresh process, costed
    at the baseline's wall time and the median of the others': the best is not known yet), at most RESERVE_SHARE
    of `budget`, so a short budget of slow trials still runs trials; what does not fit in it is cut at the
    budget's end (no round after the first starts past it). 0 before any trial."""
    walls = [r.info["trial_wall_s"] for r in records if r.info.get("trial_wall_s") and r.throughput]
    if not rounds or not walls:
        return 0.0
    base = next((r.info["trial_wall_s"] for r in records if r.is_baseline and r.info.get("trial_wall_s")), walls[0])
    cost = min(rounds, 2) * (base + statistics.median(walls))
    return min(cost, RESERVE_SHARE * budget) if budget else cost


def spent_of(records: list) -> list[tuple[dict, float, float | None]]:
    """What each finished trial cost (`trial_cost`'s `spent`): its knobs, its wall seconds less a parity
    reference built inside (paid once per search), its compile seconds."""
    return [
        (r.knobs, r.info["trial_wall_s"] - (r.metrics.get("parity_reference_s") or 0.0), r.metrics.get("compile_s"))
        for r in records
        if r.info.get("trial_wall_s")
    ]


def budget_fits(
    records: list,
    baseline: dict,
    budget: float | None,
    started: float,
    conflicts: Callable[[dict], list] | None = None,
    reserve: Callable[[], float] = lambda: 0.0,
) -> Callable[[dict], bool]:
    """`fits(params)` for `Strategy.ask`: can this config run (no two knobs in
    `conflicts`, e.g. prefetch_factor without workers), and will it finish within
    the time budget (`budget` s from `started`, a perf_counter time)? Estimated
    from the finished trials (`records`: their `knobs`, `info["trial_wall_s"]` less a parity reference built
    inside and `compile_s`, read at each call: `trial_cost`): a graph compiled before costs its cache hit, a new
    one its mode's cold compile or another mode's scaled: the compile modes the budget affords. `reserve()`: seconds kept aside at the budget's end (the
    re-measurement's, `remeasure_cost`)."""
    import time

    def fits(params: dict) -> bool:
        if conflicts is not None and conflicts(params):
            return False
        if not budget:
            return True
        point, spent = {**baseline, **params}, spent_of(records)
        if compile_cost(point, spent) is None:
            return True  # the first compile trial runs, and says what a compile costs
        cost = trial_cost(point, spent)
        return cost is None or cost <= budget - reserve() - (time.perf_counter() - started)

    return fits
