"""Why a search stops: each cause a stopper with its reason, joined by `Combined` (Ray Tune's
`CombinedStopper` shape). Both backends of `autotune.execution.proposer` ask the same objects: the local loop
before each trial, the Ray backend through a `tune.Stopper` adapter (Ray Tune also holds the trial count and the
budget itself). A stopper reads what the search has recorded; it decides nothing else.

The first cause that holds names why the search ended (`Combined.reason`), in this order: a failed baseline,
Ctrl-C, no gain for `patience` trials, nothing left to run, the trial count, the time budget. The trial count
and the budget are both limits: the first reached ends the search.
"""

from __future__ import annotations

import time
from typing import Callable

from autotune.decide.budget import NOTHING_LEFT, no_improvement_for


class Stopper:
    """One reason to stop: `stop()` says whether it holds now, `reason` says why, in the words `search.json`'s
    `ended` keeps."""

    reason = ""

    def stop(self) -> bool:
        raise NotImplementedError


class Flag(Stopper):
    """A cause the loop observes and sets: Ctrl-C (`interrupted`), or a strategy with nothing left (`exhausted`)."""

    def __init__(self, reason: str):
        self.reason, self.set = reason, False

    def stop(self) -> bool:
        return self.set


class BaselineFailed(Stopper):
    """Nothing can be compared once the baseline failed (`recorder.baseline_failed`)."""

    reason = "the baseline failed"

    def __init__(self, recorder):
        self.recorder = recorder

    def stop(self) -> bool:
        return self.recorder.baseline_failed is not None


class Patience(Stopper):
    """`patience` trials in a row improved the best by no more than `min_improvement` (a trial that cannot be the
    best, `TrialRecord.contends`, improved nothing)."""

    def __init__(self, records: list, patience: int | None, min_improvement: float):
        self.records, self.patience, self.min_improvement = records, patience, min_improvement
        self.reason = f"no gain above {min_improvement:.0%} in {patience} trials"

    def stop(self) -> bool:
        return (
            bool(self.patience)
            and no_improvement_for([r.throughput if r.contends else None for r in self.records], self.min_improvement)
            >= self.patience
        )


class TrialCount(Stopper):
    def __init__(self, records: list, n_trials: int):
        self.records, self.n_trials, self.reason = records, n_trials, f"{n_trials} trials"

    def stop(self) -> bool:
        return len(self.records) >= self.n_trials


class Budget(Stopper):
    """`budget_s` seconds of searching spent (`elapsed`: the search's own clock, a resumed search's earlier runs
    and a wait for the device lock accounted); never before the first trial (`records`, where given, empty): a
    start-up that spent the budget (a program's probe on a loaded host) still runs the baseline, the one trial
    every answer needs. `reserve()`: seconds kept for what follows the trials (the re-measurement), so the budget
    bounds the whole search."""

    reason = "the time budget"

    def __init__(
        self,
        budget_s: float | None,
        elapsed: Callable[[], float],
        records: list | None = None,
        reserve: Callable[[], float] = lambda: 0.0,
    ):
        self.budget_s, self.elapsed, self.records, self.reserve = budget_s, elapsed, records, reserve

    def stop(self) -> bool:
        if self.records is not None and not self.records:
            return False
        return bool(self.budget_s) and self.elapsed() >= self.budget_s - self.reserve()


class Combined(Stopper):
    """Stops when any of its stoppers does; its reason is the first one's that holds."""

    def __init__(self, *stoppers: Stopper):
        self.stoppers = stoppers

    def fired(self) -> Stopper | None:
        return next((s for s in self.stoppers if s.stop()), None)

    def stop(self) -> bool:
        return self.fired() is not None

    @property
    def reason(self) -> str:
        fired = self.fired()
        return fired.reason if fired else ""


def search_stoppers(
    recorder,
    *,
    n_trials: int,
    budget_s: float | None,
    patience: int | None,
    min_improvement: float,
    started: float,
    wall_before: float = 0.0,
    reserve: Callable[[], float] = lambda: 0.0,
) -> tuple[Combined, Flag, Flag]:
    """The search's stop rules, combined in their order, with the two flags the loop sets (`interrupted`,
    `exhausted`). `started`: `time.perf_counter()` when this run of the search began."""
    interrupted, exhausted = Flag("interrupted"), Flag(NOTHING_LEFT)
    combined = Combined(
        BaselineFailed(recorder),
        interrupted,
        Patience(recorder.records, patience, min_improvement),
        exhausted,
        TrialCount(recorder.records, n_trials),
        Budget(budget_s, lambda: time.perf_counter() - started + wall_before, recorder.records, reserve),
    )
    return combined, interrupted, exhausted
