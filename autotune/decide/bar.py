"""The incumbent's bar: what a trial must beat to become the incumbent, as its config takes it (its window's
screening and promotion read it: `autotune.trial.request`), the same for every sampler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.knobs import UserKnobs
from autotune.records.best import risk
from autotune.safety.parity import PARITY_KNOBS


@dataclass
class Incumbent:
    """The best trial so far, as the bar reads it."""

    number: int
    params: dict[str, Any]  # the searched knobs
    value: float  # its throughput, in the study's unit
    ci: float  # its throughput's relative 95% CI (0 where its trial recorded none)


def incumbent_bar(
    best: Incumbent | None,
    point: dict | None,
    *,
    baseline: dict[str, Any],
    min_improvement: float,
    carry: dict | None = None,
    user_knobs: UserKnobs | None = None,
) -> dict:
    """What a trial of `point` must beat to become the incumbent, `best`:
    `incumbent_above`, in the study's unit (the best so far and min_improvement; at or
    below it a trial pays for its window alone), `incumbent_ci`, how well
    the best is known (its throughput's relative 95% CI, 0 where its trial
    recorded none), and `incumbent_trial`, its number (a tie kept names it).
    None and 0 before any best, and then `anchor` (the trial that becomes
    the first incumbent whatever it measures: its window is sized as a
    promoted one's, `TrialSettings.config`); with `point`, `carry`: what the trial
    need not measure again to be diagnosed (`Strategy.carry_for`), and `tie_keeps_incumbent`:
    `point` changes the numerics from the incumbent's and is riskier than it
    (`records.risk` against `baseline`, the search's `user_knobs` as declared: a higher safety class, or more
    changed knobs above the safe class), so a window that ties with it, reading inside the
    incumbent's interval above the bar (autotune.trial's `_not_incumbent`),
    leaves the incumbent as it is: `records.pick_best`
    exports the safer side of a tie, and adopting it would pay a loss-parity
    check and a diagnosis that nothing uses (on jpeg_pipeline 22-24 s, in 2 of
    3 searches). A tie in loader knobs alone is still adopted: it pays little
    (the diagnosis carried, the parity verdict reused) and the climb goes on."""
    riskier = (
        best is not None
        and point is not None
        and any(point[k] != best.params[k] for k in PARITY_KNOBS if k in point)
        and risk(point, baseline, user_knobs) > risk(best.params, baseline, user_knobs)
    )
    return {
        "incumbent_above": best.value * (1 + min_improvement) if best else None,
        "incumbent_ci": best.ci if best else 0.0,
        **({"incumbent_trial": best.number} if best else {}),
        **({"anchor": True} if best is None else {}),
        **({"carry": carry} if point is not None else {}),
        **({"tie_keeps_incumbent": True} if riskier else {}),
    }
