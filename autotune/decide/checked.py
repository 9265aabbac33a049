"""Loss parity paid when a decision needs it: a trial runs
parity only when its window makes it the incumbent, so a config that did not
(a little faster than the incumbent, inside min_improvement) may end as the
fastest without a verdict. Before it is exported it is checked late (a short
request: parity alone, no window); one that fails is unsafe and the next is
picked. Nothing unchecked is exported as safe: a search stopped before the
check (Ctrl-C) exports it marked unchecked.

Needs neither torch nor Ray: the driver hands in `run(knobs, label) -> result`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from autotune.knobs import UserKnobs
from autotune.safety.parity import needs_parity
from autotune.records.trial_record import TrialRecord
from autotune.records.best import pick_best
from autotune.trial.result import TrialResult


def unchecked(record: TrialRecord | None, baseline: TrialRecord | None) -> bool:
    """A measured config that changes numerics, whose loss parity never ran."""
    return bool(
        record
        and record.throughput
        and baseline
        and record is not baseline
        and record.parity is None
        and needs_parity(record.knobs, baseline.knobs)
    )


NOT_CHECKED = ("not judged", "not measured")  # a program's verdicts that neither pass nor fail a config


def status(record: TrialRecord | None, baseline: TrialRecord | None) -> str:
    """The safety status of a config: `baseline`, `safe` (no numerics knob
    changed), `parity passed`, `parity failed`, `unchecked`, or a program's `parity not judged` / `parity not
    measured` (autotune.safety.program_parity: never checked)."""
    if record is None or baseline is None or record is baseline:
        return "baseline"
    if unchecked(record, baseline):
        return "unchecked"
    if record.parity is None:
        return "safe"
    if record.parity.get("passed"):
        return "parity passed"
    return f"parity {record.parity['verdict']}" if record.parity.get("verdict") in NOT_CHECKED else "parity failed"


def pick_checked(
    records: list[TrialRecord],
    run: Callable[[dict, str], TrialResult],
    announce: Callable[[str], None] | None = None,
    exclude=(),
    *,
    user_knobs: UserKnobs | None = None,
) -> TrialRecord | None:
    """`records.pick_best` over the records not in `exclude` (trial numbers), the search's `user_knobs` as declared,
    each unchecked pick checked late (`run` with the parity-only request): it
    stays the pick when its parity passes; else it is unsafe and the next pick
    is checked in turn."""
    pool = [r for r in records if r.number not in exclude]
    baseline = next((r for r in records if r.is_baseline), None)
    while True:
        best = pick_best(pool, user_knobs)
        if not unchecked(best, baseline):
            return best
        if announce:
            announce(f"loss parity of trial #{best.number} (about to be the best, its trial did not check it)")
        result = run(best.knobs, f"parity-{best.number:04d}")
        best.parity = result.parity or late_failure(result)
        best.info["parity_late"] = True


def late_failure(result: TrialResult) -> dict[str, Any]:
    """A late check that did not finish: not passed, with why."""
    why = f"the late loss-parity check did not finish: {result.status} ({result.error_type}: {result.error})"
    return {"passed": False, "reason": why, "steps": 0, "max_rel_dev": float("nan")}


MAX_CANDIDATES = 3  # configs re-measured against the baseline, at most, before it keeps the lead


def confirm_candidates(
    records: list[TrialRecord],
    baseline: TrialRecord | None,
    remeasure,
    check,
    announce,
    *,
    min_improvement: float,
    budget_left: Callable[[], float | None] = lambda: None,
    user_knobs: UserKnobs | None = None,
) -> tuple[TrialRecord | None, dict | None, list[dict]]:
    """The best, its parity checked late where needed (`check(knobs, label)`),
    re-measured against the baseline (`remeasure(baseline, best)`, the driver's
    autotune.decide.confirm); when the re-measurement rejects it, the next candidate
    by measured throughput (checked and re-measured in turn), while the time
    budget lasts (`budget_left()` seconds, None: no budget), up to
    MAX_CANDIDATES, before the baseline keeps the lead (`user_knobs`: the search's, for `pick_checked`). Returns the
    best, its re-measurement and the rejected re-measurements."""
    rejected: list[dict] = []
    best = pick_checked(records, check, announce, user_knobs=user_knobs)
    save_parity(records)
    confirm = remeasure(baseline, best)
    while confirm and confirm.get("verdict") in ("tie", "slower") and len(rejected) + 1 < MAX_CANDIDATES:
        left = budget_left()
        if left is not None and left <= 0:
            break
        reopened = reopen_ties(records, best)
        tried = {c["best_trial"] for c in rejected + [confirm]}
        nxt = pick_checked(records, check, announce, exclude=tried, user_knobs=user_knobs)
        save_parity(records)
        if nxt is None or nxt is baseline or nxt.judged <= baseline.judged * (1 + min_improvement):
            break  # nothing left that could beat the baseline: the last word stays
        if announce:
            opened = f"; the ties it kept are open again: {', '.join(f'#{n}' for n in reopened)}" if reopened else ""
            announce(
                f"trial #{best.number} was not faster in every pair{opened}; the next candidate: trial #{nxt.number}"
            )
        rejected.append(confirm)
        best, confirm = nxt, remeasure(baseline, nxt)
    for r in records:  # the ties named are of the last pick's pool: the chosen best's stay
        if r is not best:
            r.tie = None
    return best, confirm, rejected


def reopen_ties(records: list[TrialRecord], rejected: TrialRecord) -> list[int]:
    """The trials whose window tied with `rejected` while it was the incumbent, and
    left it the incumbent as the safer config (`tie_kept_incumbent`): the
    re-measurement found it no faster than the baseline, so the tie it won says
    nothing about them any more, and they can be the best again
    (`TrialRecord.tie_holds`). Before, such a trial stayed out: a quickstart kept
    trial 1 (batch 64) over trial 4 (channels_last too, read 1.29x the baseline,
    a tie with trial 1), the re-measurement rejected trial 1 (pairs 0.66, 1.06),
    and the baseline was exported with trial 4 never re-measured. Returns their numbers."""
    opened = [r for r in records if r.tie_holds and r.metrics.get("tie_kept_incumbent") == rejected.number]
    for r in opened:
        r.info["tie_reopened"] = rejected.number
    return [r.number for r in opened]


def save_parity(records: list[TrialRecord]) -> None:
    """A late parity verdict goes into its trial's result.json (what `records.read_run` reads back)."""
    for r in records:
        path = Path(r.trial_dir) / "result.json" if r.info.get("parity_late") and r.trial_dir else None
        if path is not None and path.exists():
            result = TrialResult.read(path)
            if result.parity != r.parity:
                result.parity, result.parity_late = r.parity, True
                result.write(path)
