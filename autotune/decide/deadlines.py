"""How long a trial may go without a step before its watch ends it as hung (autotune.execution.watch), from what
its search has measured, and when the search's time budget cuts it (`Deadlines.of_trial`, asked as each trial is
proposed):

- its first step: the baseline's own time to its first step x3 plus 30 s, never more than the probe's limit
  (trial.first_step_s, `--first-step-limit`), which the baseline itself gets;
- a compile's: a trial is not a hang while torch.compile works (its first-step clock stops, autotune.execution.watch),
  which has the compile's own limit, the first steps of the compile trials this search measured x3 (each compile
  mode from its own, else scaled from another's: `budget.COMPILE_COST`), 10 minutes before any was measured; the
  same limit holds while it compiles mid-run, in any trial (a new shape compiles again); a compile trial whose
  loader hangs before its first batch (no compile yet) is ended at the eager first-step limit;
- between two steps, once the first is done: 10x the baseline's p95 step time plus 10 s (trial.stall_s sets it);
  before the baseline measured its steps, its probe's (a program's), else its first-step limit;
- the budget's end, less what the re-measurement keeps of it (`budget.remeasure_cost`): neither limit runs past
  it, and a trial still running there is cut (never the baseline: the one trial every answer needs, which the
  budget lets start late too, `stoppers.Budget`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from autotune.decide.budget import COMPILE_COST

FIRST_STEP_FACTOR, FIRST_STEP_PAD_S = 3.0, 30.0
COMPILE_FACTOR, COMPILE_S = 3.0, 600.0
STALL_FACTOR, STALL_PAD_S = 10.0, 10.0
PROBE_SET_BY = "`--first-step-limit` or trial.first_step_s sets it"


@dataclass(frozen=True)
class Deadlines:
    """A search's limits on its trials' steps (see the module doc): `first_step_s`, the probe's and the
    baseline's (trial.first_step_s); `stall_s`, trial.stall_s (None: from the baseline's step time); `probe_p95_ms`,
    a program's probe's p95 step time (the baseline's stall limit before it has its own)."""

    first_step_s: float
    stall_s: float | None = None
    probe_p95_ms: float | None = None

    def of_trial(self, knobs: dict, records: list, *, baseline: bool, cut_unix: float | None) -> dict:
        """The watch's limits for a trial of `knobs` (autotune.execution.watch.Limits' fields), from the trials
        recorded so far (`records`); `baseline`: the search's first trial; `cut_unix`: the budget's end (None:
        no budget)."""
        base = next((r for r in records if r.is_baseline and r.throughput), None)
        first, set_by = self.first_step_s, PROBE_SET_BY
        took = base.metrics.get("first_step_s") if base is not None and not baseline else None
        if took and FIRST_STEP_FACTOR * took + FIRST_STEP_PAD_S < first:
            first = FIRST_STEP_FACTOR * took + FIRST_STEP_PAD_S
            set_by = f"{FIRST_STEP_FACTOR:g} x the baseline's first step ({took:.3g} s) + {FIRST_STEP_PAD_S:g} s"
        compile_s, _ = self.compile_limit(knobs.get("compile") or "none", records)
        stall, stall_by = self.stall(base, first)
        return {
            "first_step_s": first,
            "set_by": set_by,
            "stall_s": stall,
            "stall_set_by": stall_by,
            "compile_s": max(compile_s, first),
            "cut_unix": None if baseline else cut_unix,
        }

    def compile_limit(self, mode: str, records: list) -> tuple[float, str]:
        """A compile's limit for compile `mode` ("none": the default mode's, for a compile the program does
        itself) and what sets it."""
        firsts: dict[str, list[float]] = {}
        for r in records:
            if r.knobs.get("compile", "none") != "none" and r.throughput and r.metrics.get("first_step_s"):
                firsts.setdefault(r.knobs["compile"], []).append(r.metrics["first_step_s"])
        took = _median_of("default" if mode == "none" else mode, firsts)
        if took is None:
            return COMPILE_S, f"{COMPILE_S / 60:g} minutes while no compile is measured"
        return COMPILE_FACTOR * took, f"{COMPILE_FACTOR:g} x this search's compiled first steps ({took:.3g} s)"

    def stall(self, base, first: float) -> tuple[float, str]:
        """The stall limit and what sets it: trial.stall_s, else from the baseline's p95 step time (its probe's
        before it has its own), else the first-step limit."""
        if self.stall_s is not None:
            return self.stall_s, "trial.stall_s"
        p95 = base.metrics.get("step_ms_p95") if base is not None else None
        whose = "the baseline's"
        if p95 is None and self.probe_p95_ms is not None:
            p95, whose = self.probe_p95_ms, "the probe's"
        if p95 is None:
            return first, "its first-step limit, before a step time is measured; trial.stall_s sets it"
        return (
            STALL_FACTOR * p95 / 1e3 + STALL_PAD_S,
            f"{STALL_FACTOR:g} x {whose} p95 step time ({p95:.3g} ms) + {STALL_PAD_S:g} s; trial.stall_s sets it",
        )


def _median_of(mode: str, firsts: dict[str, list[float]]) -> float | None:
    """The compiled first steps' median for compile `mode`, else scaled from another mode's (the most so
    scaled: budget.COMPILE_COST); None where no compile was measured."""
    if firsts.get(mode):
        return statistics.median(firsts[mode])
    scaled = [
        statistics.median(c) / COMPILE_COST[m] * COMPILE_COST[mode]
        for m, c in firsts.items()
        if c and m in COMPILE_COST and mode in COMPILE_COST
    ]
    return max(scaled) if scaled else None
