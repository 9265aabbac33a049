"""When a search stops and what its time budget affords: patience (trials without
a gain above min_improvement), the cost of a trial by its compile mode; and when
the search has paid for itself (break-even)."""

from __future__ import annotations

import math
import statistics
from typing import Callable

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


def estimate_cost(mode: str, costs: dict[str, list[float]]) -> float | None:
    """Seconds a trial with compile `mode` will take, from the trials so far
    (`costs`: compile mode -> their wall times): the median of its own mode,
    else scaled from another compile mode's (COMPILE_COST); None when nothing
    says (the first compile trial runs, and says)."""
    if costs.get(mode):
        return statistics.median(costs[mode])
    scaled = [
        statistics.median(c) / COMPILE_COST[m] * COMPILE_COST[mode]
        for m, c in costs.items()
        if c and m in COMPILE_COST and mode in COMPILE_COST
    ]
    return max(scaled) if scaled else None


# why a search ends when the strategy has nothing left that `budget_fits` lets run
NOTHING_LEFT = "no config left to try: every point measured, known infeasible, or estimated to overrun the time budget"


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
    from the finished trials (`records`: their `knobs` and `info["trial_wall_s"]`
    less a parity reference built inside, read at each call) with its compile mode, or scaled from another compile
    mode's: the compile modes the budget affords. `reserve()`: seconds kept aside at the budget's end (the
    re-measurement's, `remeasure_cost`)."""
    import time

    def fits(params: dict) -> bool:
        if conflicts is not None and conflicts(params):
            return False
        if not budget:
            return True
        costs: dict[str, list[float]] = {}
        for r in records:
            if r.info.get("trial_wall_s"):  # less the parity reference it built: paid once per search
                cost = r.info["trial_wall_s"] - (r.metrics.get("parity_reference_s") or 0.0)
                costs.setdefault(r.knobs["compile"], []).append(cost)
        cost = estimate_cost({**baseline, **params}["compile"], costs)
        return cost is None or cost <= budget - reserve() - (time.perf_counter() - started)

    return fits
