"""What a search decided, as its run dir keeps it, read back the same way by the search and by every reader of
the run dir: the re-measurement's summary in one line (`describe`), its verdict applied to the best (`settle`: a best
not faster in every pair ties with the baseline, and the baseline wins the tie), and when the search pays for itself
(`break_even`). The thresholds the summary's line names are the search's (`autotune.decide.confirm` decides with
them); they live here so that reading a run dir needs nothing of the search.
"""

from __future__ import annotations

import math
from typing import Any

from autotune.trial.result import SAMPLES, TOKENS, Unit

# the baseline re-measured this far off its trial's read (and outside twice that window's CI) is said: every
# trial was compared with that read (measured: jpeg_pipeline's baseline read 105.9 in its trial, 88.0 and 87.3
# here, and the climb's first moves, each read below it, were screened)
ANCHOR_DRIFT = 0.10
# a first pair this far above 1 (and the trials too) settles the verdict, later rounds would
# refine the number only. The widest spread measured between fresh processes of one config on 2 cores is a 17.6%
# CV (tiny_cnn, scripts/bench/bench_window.py): a pair's log-ratio then has a sd of 0.25, and a pair at 1.5x is 1.645 sd
# above 1: at one-sided 95% the best is faster, even at that spread (jpeg_pipeline's pairs: 2.2x)
SETTLED = 0.5
# ... and two such pairs within this of each other (the larger over the smaller, less 1) settle the number too: a third
# pair would refine it inside that. One pair alone settles nothing: on this 2-core host, whose speed drifts +-20% over
# tens of seconds, lightning_clip's one pair read 1.72x where the program itself ran 2.18x (three pairs 2.15-2.21x,
# scripts/measurements/cpu-2026-11-27f-programs/), and the trials' own ratio is no check of a pair: the best of many
# noisy trials reads high (winner's curse: trials over their pair by 0-40% in 9 program searches, hf_bert 3.47x / 2.09x)
SETTLE_AGREE = 0.10


def sig(value: float, digits: int = 3) -> str:
    """A measured number as a person reads it, outside a table: `digits` significant figures, thousands
    separated (8187.6 -> 8,190; 1.436 -> 1.44; 1.0 -> 1.00; 0.0394 -> 0.0394)."""
    rounded = float(f"{value:.{digits}g}")
    if abs(rounded) >= 10 ** (digits - 1):
        return f"{rounded:,.0f}"
    return f"{rounded:#.{digits}g}"


def describe(confirm: dict[str, Any]) -> str:
    """One line for the summary and best_config.yaml."""
    if confirm.get("verdict") is None:
        return f"not re-measured: {confirm.get('error') or 'no round finished'}"
    if confirm["verdict"] == "unknown":
        return f"speedup unknown: {confirm['unknown']}" + (
            f"; stopped early: {confirm['error']}" if confirm.get("error") else ""
        )
    if confirm["verdict"] == "unsettled":  # autotune.decide.confirm.unsettled: no single number
        spread = (
            f"{confirm['speedup_low']:.2f}-{confirm['speedup_high']:.2f}x over {confirm['rounds']} pairs"
            if confirm.get("speedup_low")
            else "no pair"
        )
        return f"unsettled: side by side in fresh processes, {spread}; {confirm['unsettled']}" + (
            f"; stopped early: {confirm['error']}" if confirm.get("error") else ""
        )
    n = confirm["rounds"]
    spread = (
        f"pairs {confirm['speedup_low']:.2f}-{confirm['speedup_high']:.2f}x"
        if n > 1
        else f"one pair: {confirm['speedup_x']:.2f}x"
    )
    if confirm.get("settled"):
        spread += (
            f"; within {SETTLE_AGREE:.0%} of each other, and they and the trials' {confirm['settled']:.2f}x all over "
            f"{1 + SETTLED:.1f}x, they settle it, so no more rounds"
        )
    line = (
        f"re-measured side by side, {n} interleaved round{'s' if n > 1 else ''} in fresh processes: "
        f"{confirm['speedup_x']:.2f}x ({spread})"
    )
    if confirm["verdict"] != "faster":
        line += "; not faster in every pair: a tie, won by the safer config (the baseline)"
    drift, ci = confirm.get("baseline_drift"), confirm.get("baseline_trial_ci95") or 0.0
    unit = confirmed_unit(confirm)
    if drift is not None and abs(drift) > max(ANCHOR_DRIFT, 2 * ci):
        line += (
            f"; the baseline re-measured {drift:+.0%} off its trial's {sig(confirm[unit.key('baseline_trial')])} "
            f"{unit.label} (its window: ±{ci:.1%}), the read every trial was compared with: the host drifted or "
            "that process was unusual, and configs screened or pruned near the baseline may deserve a second look"
        )
    if confirm.get("error"):
        line += f"; stopped early: {confirm['error']}"
    if confirm.get("disturbed_pairs"):
        line += (
            f"; {len(confirm['disturbed_pairs'])} pair(s) measured under load from outside, not counted: "
            + "; ".join(d["why"] for d in confirm["disturbed_pairs"])
        )
    taken = confirm.get("taken_again")
    if taken:  # the first pairs disagreed with the search's reads: these were taken later, spaced (issue 64)
        line += (
            f"; these were taken again, {sig(taken['spacing_s'], 2)} s apart, where the first "
            f"{taken['first']['rounds']} pair(s) were no claim ({taken['why']})"
        )
    return line


def confirmed_unit(confirm: dict[str, Any]) -> Unit:
    """The unit a re-measurement's figures are in, and named by (its `unit`: baseline_tokens_per_s for a language
    model's search; a summary without one, samples: baseline_samples_per_s)."""
    return TOKENS if confirm.get("unit") == TOKENS.name else SAMPLES


def settle(result) -> None:
    """Apply the re-measurement to a `records.SearchResult` (from the search or
    read back from its run dir): a best that was not faster in every pair
    ties with the baseline, and the baseline wins the tie. An unknown or unsettled claim keeps the best (its speedup
    is what is not known: `SearchResult.speedup` is None)."""
    confirm, best, base = result.confirm, result.best, result.baseline
    if (
        not confirm
        or confirm.get("verdict") in (None, "faster", "unknown", "unsettled")
        or best is None
        or base is None
        or best is base
    ):
        return
    unit = base.unit
    base.tie = {
        "faster_trial": best.number,
        unit.key("faster"): round(best.throughput, 2),
        "chosen_trial": base.number,
        unit.key("chosen"): round(base.throughput, 2),
        "note": (
            f"trial #{best.number} measured {result.search_speedup:.2f}x the baseline in the "
            f"search, but {describe(confirm).removeprefix('re-measured ')}"
        ),
    }
    result.best = base


def break_even(
    search_s: float,
    speedup: float | None,
    rate: float | None,
    per_step: float | None,
    changed: bool = True,
    unit: Unit = SAMPLES,
) -> dict[str, Any] | None:
    """When the search pays for itself: its wall time against what the winner saves
    per training step. A step of `per_step` samples (its batch size; a language model's: its tokens a step, `unit`
    TOKENS) takes per_step/rate seconds at the winner's measured `rate` (in `unit`) and `speedup` times that at the
    baseline's, so it saves per_step x (speedup - 1) / rate; the search is paid back
    after search_s / that many steps, which take search_s / (speedup - 1) seconds
    of training at the winner's rate. `changed`: the winner is not the baseline.
    None when there is no speedup to weigh (no measured baseline)."""
    if speedup is None or not rate or not per_step:
        return None
    out: dict[str, Any] = {
        "search_s": round(search_s, 1),
        "speedup_x": round(speedup, 4),
        ("tokens_per_step" if unit is TOKENS else "batch_size"): per_step,
        unit.metric: round(rate, 2),
    }
    if not changed or speedup <= 1:
        why = (
            "the best config is the baseline's own"
            if not changed
            else f"the best config is not faster than the baseline ({speedup:.2f}x)"
        )
        return {
            **out,
            "saved_ms_per_step": 0.0,
            "steps": None,
            "hours": None,
            "note": f"never pays back: {why}, so no training step saves anything",
        }
    saved_s = per_step * (speedup - 1) / rate
    step = f"of {per_step:,.0f} tokens" if unit is TOKENS else f"of batch {per_step}"
    steps = math.ceil(search_s / saved_s - 1e-9)  # 600 s / 50 ms is 12000 steps, not 12001 by rounding
    hours = search_s / (speedup - 1) / 3600
    return {
        **out,
        "saved_ms_per_step": round(saved_s * 1e3, 4),
        "steps": steps,
        "hours": round(hours, 4),
        "note": (
            f"the search ({_duration(search_s)}) pays for itself after {steps:,} training steps {step}, "
            f"{_duration(hours * 3600)} of training at the best config's {sig(rate)} "
            f"{unit.label} (it saves {saved_s * 1e3:.3g} ms a step, {speedup:.2f}x)"
        ),
    }


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
