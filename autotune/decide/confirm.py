"""The speedup's last word: after the trials, the baseline and the winner are
measured again side by side, a fresh process each, alternating (A B, B A, A B,
...), and the speedup reported is the median of the paired ratios.

Why: a trial is one fresh process, and on a small shared host one process of
the same config varies 5-10% from the next (jpeg_pipeline on 2 cores: 99.8,
105.2, 111.1 and 111.3 samples/s). A speedup from one baseline trial and one
best trial measured minutes apart carries that error twice; a pair measured
back to back shares the host's state, so its ratio is steadier, and the spread
of the pairs' ratios is the speedup's uncertainty.

When the pairs do not all say "faster", the winner's advantage is inside that
uncertainty: a tie, and a tie goes to the safer config, the baseline.

A pair measured while load from outside took the host's CPU (autotune.trial.disturbance:
either side's window) does not count: it is measured again, up to RERUNS times
in all; with fewer than 2 undisturbed pairs (where 2 were asked) the speedup is
unknown, and says why.

Needs neither torch nor Ray: the driver hands in `run(knobs, label) -> result`
(an autotune.trial.result.TrialResult), through Ray or in a plain process.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable

from autotune.records.verdicts import SETTLE_AGREE, SETTLED
from autotune.trial.result import SAMPLES, TrialResult, Unit, unit_of

ROLES = ("baseline", "best")
RERUNS = 2  # disturbed pairs measured again, in all, per re-measurement (each pair: two fresh processes)


REREAD_DIR = "reread"  # the anchor's second read, under its trial's dir
ANCHOR_READS = ("anchor_first", "anchor_reread")  # + its unit's metric: anchor_first_samples_per_s
# a trial's metrics in proportion to its throughput
RATES = ("samples_per_s", "tokens_per_s", "tokens_per_s_per_device", "steps_per_s", "achieved_tflops", "mfu")


def reread_anchor(
    result: TrialResult, again: dict[str, Any], run: Callable[[dict, Path], TrialResult], trial_dir
) -> TrialResult:
    """The search's anchor (the baseline: every early trial's bar) read a
    second time, in a fresh process, its timed window alone: `again`, the runner's
    config for that (`TrialSettings.timed_only().config(knobs, PerTrial(anchor=True))`), run
    by `run(config, dir)`. Two processes of one config differ by more than a
    window's CI: jpeg_pipeline's baseline read 104.9 samples/s in its trial and
    86.5 and 81.2 in the confirm's, and the climb, judged against 104.9, missed
    the winner's family. The result's throughput (in its unit, trial.result.unit_of) becomes the two reads' mean,
    its step_mean_ci95 at least half their relative gap (the anchor is known no
    better than two processes agree); both reads are kept (ANCHOR_READS), the
    rates and the mean step time follow the mean (RATES, step_ms_mean), the other
    window figures (percentiles, CV, data wait) are the first read's, and the
    second read's cost is added to trial_wall_s. A second read disturbed by load
    from outside (autotune.trial.disturbance; one quickstart's re-read read 912
    samples/s beside 3,961 while others took 39% of the host, and the search
    judged every trial against their mean) is read once more; disturbed again,
    the first read stands alone. A one-rank trial that finished only."""
    metrics = result.metrics or {}
    unit = unit_of(metrics)
    first = metrics.get(unit.metric)
    if not result.ok or not first or again.get("ranks", 1) > 1:
        return result
    for _ in range(2):  # a read under load from outside (its window's `disturbed`): once more, else the first stands
        reread = run(again, Path(trial_dir) / REREAD_DIR)
        result.trial_wall_s = (result.trial_wall_s or 0.0) + (reread.trial_wall_s or 0.0)
        if not (reread.ok and reread.disturbed):
            break
    second = reread.metric(unit.metric) if reread.ok and not reread.disturbed else None
    if second:
        scale = (first + second) / 2 / first
        metrics.update({k: metrics[k] * scale for k in RATES if metrics.get(k) is not None})
        if metrics.get("step_ms_mean"):
            metrics["step_ms_mean"] /= scale
        metrics.update(
            {
                unit.metric: (first + second) / 2,
                unit.key(ANCHOR_READS[0]): first,
                unit.key(ANCHOR_READS[1]): second,
                "step_mean_ci95": max(metrics.get("step_mean_ci95") or 0.0, abs(first - second) / (first + second)),
                # what a read of the baseline costs: the search's first reference read is timed by it
                # (autotune.execution.reads)
                **({"anchor_reread_s": reread.trial_wall_s} if reread.trial_wall_s else {}),
            }
        )
    return result


def roles(i: int) -> tuple[str, ...]:
    """Round `i`'s measuring order: A B, B A, A B, ... so a drift of the host
    over the rounds weighs on both sides alike."""
    return ROLES if i % 2 == 0 else ROLES[::-1]


def order(rounds: int) -> list[tuple[int, str]]:
    """(round, role) in measuring order."""
    return [(i, role) for i in range(rounds) for role in roles(i)]


def confirm_best(
    run: Callable[[dict[str, Any], str], dict[str, Any]],
    baseline,
    best,
    rounds: int,
    announce: Callable[[str], None] | None = None,
    budget_left: Callable[[], float | None] = lambda: None,
) -> dict[str, Any] | None:
    """The best trial (a `records.TrialRecord`) re-measured against the
    baseline's: the `remeasure` summary with the two trial numbers, in the baseline's unit (its `unit`); None where
    there is nothing to re-measure (no rounds, no measured baseline, or the
    baseline is the best). It stops after a round that settles the verdict
    (`settles`)."""
    if not rounds or not (baseline and baseline.throughput and best) or best is baseline:
        return None
    if announce:
        announce(
            f"re-measuring the best against the baseline: {'up to ' if rounds > 1 else ''}{rounds} "
            "interleaved round(s), a fresh process each"
        )
    # the search's figure of the best (its fresh reads', or its ratio to the reference near its time), else the trials'
    trials = ((best.figure or {}).get("x") or best.throughput / baseline.throughput) if best.throughput else None
    unit = baseline.unit
    out = {
        "baseline_trial": baseline.number,
        "best_trial": best.number,
        **remeasure(run, baseline.knobs, best.knobs, rounds, trials, unit, budget_left=budget_left),
    }
    if out.get(unit.key("baseline")):  # how far the anchor every trial was compared with was off
        out.update(
            {
                "baseline_drift": round(out[unit.key("baseline")] / baseline.throughput - 1, 4),
                unit.key("baseline_trial"): round(baseline.throughput, 2),
                "baseline_trial_ci95": baseline.metrics.get("step_mean_ci95"),
            }
        )
    return out


def window_ci(baseline, best, target_ci: float) -> float:
    """The re-measurement's windows, sized by the decision they make: each side's step-time mean to within a quarter of the gap the trials
    measured (`stats.gap_ci`: 1.2x, +-5%), never tighter than the spec's
    `target_ci` nor looser than ±10%; a close call (a 1.05x gap) keeps the full
    window. The pairs' verdict stays the test."""
    from autotune.stats import gap_ci

    if not (baseline and best and baseline.throughput and best.throughput):
        return target_ci
    return gap_ci(best.throughput / baseline.throughput - 1, target_ci)


def settles(pairs: list[dict[str, float]], trials: float | None) -> bool:
    """The pairs so far settle the verdict "faster" and its number, later rounds would
    refine it inside their agreement: two pairs at least, within SETTLE_AGREE of
    each other, and every pair and the trials' own ratio (`trials`; None: never
    settled early) more than SETTLED above 1. One pair is never the last word."""
    ratios = [p["best"] / p["baseline"] for p in pairs]
    return (
        trials is not None
        and len(ratios) >= 2
        and min(ratios + [trials]) > 1 + SETTLED
        and max(ratios) / min(ratios) <= 1 + SETTLE_AGREE
    )


def remeasure(
    run: Callable[[dict[str, Any], str], dict[str, Any]],
    baseline: dict[str, Any],
    best: dict[str, Any],
    rounds: int,
    trials: float | None = None,
    unit: Unit = SAMPLES,
    *,
    budget_left: Callable[[], float | None] = lambda: None,
) -> dict[str, Any]:
    """Measure `baseline` and `best` (knob dicts) `rounds` times each,
    interleaved, each read in `unit` (a language model's search: tokens/s); the summary of `summarize`. A pair either side of which was
    disturbed by outside load is kept aside (`disturbed_pairs`) and the round
    measured again (label suffix `-again<N>`), RERUNS times at most in all. A
    run that does not finish ends the re-measurement with its error: the
    figures up to there are kept. `trials`: the trials' ratio, best over
    baseline: with it, the rounds stop once they settle the verdict (`settles`)
    and no pair was disturbed; the summary's `settled` is then that ratio. No round after the first starts once
    the time budget is spent (`budget_left()` <= 0; None: no budget): the summary says `cut_by_budget`."""
    pairs: list[dict[str, float]] = []
    aside: list[dict[str, Any]] = []  # the disturbed pairs
    error, settled, cut = None, False, False
    for i in range(rounds):
        if i > 0 and not aside and settles(pairs, trials):
            settled = True
            break
        left = budget_left() if i > 0 else None
        if left is not None and left <= 0:
            cut = True
            break
        while error is None:
            again = sum(1 for d in aside if d["round"] == i)
            pair, why = {}, []
            for role in roles(i):
                label = f"{i:02d}-{role}" + (f"-again{again}" if again else "")
                result = run(baseline if role == "baseline" else best, label)
                value = result.metric(unit.metric) if result.ok else None
                if value is None:
                    error = f"round {i + 1}, {role}: {result.status} ({result.error_type}: {result.error})"
                    break
                pair[role] = value
                if result.disturbed:  # load from outside during its window (autotune.trial.disturbance)
                    why.append(f"{label}: {result.disturbed}")
            if error is None and not why:
                pairs.append(pair)
            elif why:
                aside.append({"round": i, **{k: round(v, 2) for k, v in pair.items()}, "why": "; ".join(why)})
            if not why or len(aside) > RERUNS:
                break
        if error:
            break
    out = summarize(pairs, error, aside, min(rounds, 2, max(1, len(pairs)) if cut else 2), unit)
    out = {**out, "cut_by_budget": True} if cut else out
    return {**out, "settled": round(trials, 4)} if settled else out


def summarize(
    pairs: list[dict[str, float]],
    error: str | None = None,
    aside: list[dict[str, Any]] | None = None,
    needed: int = 2,
    unit: Unit = SAMPLES,
) -> dict[str, Any]:
    """The undisturbed paired measurements -> the confirmed speedup (median of
    the pairs' ratios), its range, and the verdict: `faster` when every pair
    says so, `slower` when every pair says so, else `tie`; `unknown` when
    disturbed pairs (`aside`) left fewer than `needed` undisturbed ones. Its rates are named by their `unit`
    (baseline_tokens_per_s), which it names (records.verdicts.confirmed_unit reads it)."""
    ratios = [p["best"] / p["baseline"] for p in pairs]
    out: dict[str, Any] = {
        "unit": unit.name,
        "rounds": len(pairs),
        "pairs": [
            {"baseline": round(p["baseline"], 2), "best": round(p["best"], 2), "ratio": round(r, 4)}
            for p, r in zip(pairs, ratios)
        ],
    }
    if error:
        out["error"] = error
    if aside:
        out["disturbed_pairs"] = aside
    if aside and len(pairs) < needed:
        out.update(
            verdict="unknown",
            unknown=(
                f"{len(aside)} pair(s) measured while load from outside took the host's CPU ({aside[-1]['why']}), "
                f"{len(pairs)} undisturbed: fewer than {needed}"
            ),
        )
        return out
    if not ratios:
        out["verdict"] = None
        return out
    out.update(
        {
            unit.key("baseline"): round(statistics.median(p["baseline"] for p in pairs), 2),
            unit.key("best"): round(statistics.median(p["best"] for p in pairs), 2),
        },
        speedup_x=round(statistics.median(ratios), 4),
        speedup_low=round(min(ratios), 4),
        speedup_high=round(max(ratios), 4),
        verdict="faster" if min(ratios) > 1 else "slower" if max(ratios) < 1 else "tie",
    )
    return out
