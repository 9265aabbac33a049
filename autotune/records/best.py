"""Which trial wins, read from the records alone: the fastest beyond the noise among the safe ones on the
baseline's device, a tie going to the safer config (`risk`: its changed knobs' safety class, then how many), and
only the knobs that counted (one that made no difference beyond the noise falls back to the baseline's value, as a
tie does). A search's hangs rule out what they rule out however early it was measured (autotune.trial.hung). The
same rule for the search's choice, a read's incumbent and `autotune report`."""

from __future__ import annotations

import math
from typing import Any

from autotune import knobs as K
from autotune.records.trial_record import TrialRecord, same_device
from autotune.records.verdicts import sig
from autotune.trial.hung import Hung, ruled_out


# safe < reproducibility < numerics < dynamics: what a changed knob may alter
SAFETY_RANK = {name: i for i, name in enumerate(K.SAFETY_CLASSES)}  # safe < reproducibility < numerics < dynamics


def risk(
    knobs: dict[str, Any], baseline_knobs: dict[str, Any], user_knobs: K.UserKnobs | None = None
) -> tuple[int, int, bool]:
    """How risky a config is to adopt (`pick_best`'s tie-break, and the strategy's:
    `Strategy.incumbent_bar`): the highest safety class among the knobs it changes
    from the baseline, then how many of them are in a class above safe, then
    whether it changes any (a change is exported for a gain, never a tie). A knob
    the registry classes safe adds nothing beyond that: loader and host knobs,
    and channels_last and set_to_none, whose numerics differ at rounding level
    (loss parity: 1e-7 on jpeg_pipeline, 1.4e-5 and 0 on an H200 at 224 px).
    Counting them traded measured throughput for no measured risk: on
    jpeg_pipeline 2 workers as a risk exported channels_last alone, 0.84x of the
    two together side by side, and channels_last as one exported bf16 alone,
    0.89x of bf16 + channels_last (5 pairs, 0.87-0.95). `user_knobs`: the search's, as declared (None: none
    declared)."""
    lookup = (user_knobs or K.UserKnobs()).lookup
    changed = [lookup(k) for k, v in knobs.items() if v != baseline_knobs.get(k)]
    return (
        max((SAFETY_RANK[k.safety] for k in changed), default=0),
        sum(k.safety != "safe" for k in changed),
        bool(changed),
    )


def _ci(record: TrialRecord) -> float:
    """The relative half-width of the 95% CI of the step-time mean; 0 where
    unknown (a trial with no measured precision cannot claim a tie)."""
    ci = record.metrics.get("step_mean_ci95")
    return ci if ci is not None and math.isfinite(ci) else 0.0


def beyond_noise(value_a: float, ci_a: float, value_b: float, ci_b: float) -> bool:
    """Two throughputs, each with the relative half-width of its window's 95% interval, differ beyond the noise:
    their intervals do not overlap."""
    (lo, lo_ci), (hi, hi_ci) = sorted(((value_a, ci_a), (value_b, ci_b)))
    return lo * (1 + lo_ci) < hi * (1 - hi_ci)


def _overlap(a: TrialRecord, b: TrialRecord) -> bool:
    """The two judged throughputs' windows' 95% CIs overlap (a throughput's relative CI is its
    step-time mean's: samples/s = batch / step time). Their reference's uncertainty is left out: a tie
    goes to the safer config, and on a drifting host the reference's would tie nearly every
    pair (a search read 150 -> 3378 samples/s for the baseline within 30 s while another job
    stopped: every trial tied with the baseline, and nothing was re-measured); the side by
    side settles what drift leaves open."""
    return not beyond_noise(a.judged, _ci(a), b.judged, _ci(b))


def pick_best(records: list[TrialRecord], user_knobs: K.UserKnobs | None = None) -> TrialRecord | None:
    """The fastest trial that can be the best (`TrialRecord.contends`), on the
    baseline's device type, as the search judged it (`TrialRecord.judged`: against
    the reference read near its time, where the search read one); a faster one that
    failed loss parity is never the one exported.

    Ties are ties: among the trials whose 95% CI overlaps the fastest's (its
    advantage is inside the measured uncertainty), the safer config wins
    (`risk`: lower safety class, safe < reproducibility < numerics < dynamics;
    then fewer changed knobs above the safe class, then the baseline's own
    knobs before any change; then the faster; the search's `user_knobs` as declared). A trial whose window tied with
    a safer incumbent (`tie_kept`) lost its tie there. The winner's `tie` then
    names the fastest such faster-but-riskier trial and both CIs.

    A trial measured under load from outside (`info["disturbed"]`) decides
    nothing while an undisturbed trial contends beside the baseline: its figure
    says more about the load than about its knobs (where every one was
    disturbed, the re-measurement's undisturbed pairs decide, autotune.decide.confirm).

    A config a hang ruled out (autotune.trial.hung: loader workers after a worker never returned a batch, a
    parallel setting after a rank stopped) is never the one exported, however early it was measured."""
    base = next((r for r in records if r.is_baseline), None)
    hung = hangs(records)
    ok = [r for r in records if r.contends and same_device(base, r) and not ruled_out(hung, r.knobs)]
    others = [r for r in ok if not r.is_baseline]
    calm = [r for r in others if not r.info.get("disturbed")]
    ok = [r for r in ok if r.is_baseline] + (calm or others)
    for r in records:
        r.tie = None
    if not ok:
        return None
    fastest = max(ok, key=lambda r: r.judged)
    if base is None:
        return fastest
    tied = [r for r in ok if _overlap(r, fastest)]
    best = min(tied, key=lambda r: (*risk(r.knobs, base.knobs, user_knobs), -r.judged))
    best, idle = _only_what_counts(best, ok, base)
    if idle:  # knobs that made no difference beyond the noise: the config without them, as a tie goes
        return _tied(best, idle[0][2], base, user_knobs, _idle_note(idle))
    kept = [
        r
        for r in records
        if r.throughput and r.safe and r.tie_holds and same_device(base, r) and not ruled_out(hung, r.knobs)
    ]
    faster = max([r for r in [fastest, *kept] if r.judged > best.judged], key=lambda r: r.judged, default=None)
    if faster is not None:
        how = (
            "its window tied with a safer incumbent, within the spread between processes"
            if faster in kept
            else "inside the measured uncertainty (95% CIs overlap)"
        )
        note = (
            f"trial #{faster.number} ({sig(faster.judged)} {best.unit.label} +-{_ci(faster):.1%}) is "
            f"{faster.judged / best.judged - 1:.1%} faster than #{best.number} "
            f"({sig(best.judged)} +-{_ci(best):.1%}), {how}: a tie, won by the safer config "
            f"({_risk_name(best, base.knobs, user_knobs)} vs {_risk_name(faster, base.knobs, user_knobs)})"
        )
        return _tied(best, faster, base, user_knobs, note)
    return best


def hangs(records: list[TrialRecord]) -> list[Hung]:
    """The search's hung trials, each with what it rules out (autotune.trial.hung), in trial order."""
    base = next((r for r in records if r.is_baseline), None)
    found = (Hung.of(r.number, r.hung, r.knobs, base.knobs if base else r.knobs) for r in records if r.status == "hung")
    return sorted((h for h in found if h is not None), key=lambda h: h.trial)


def _tied(best: TrialRecord, other: TrialRecord, base: TrialRecord, user_knobs, note: str) -> TrialRecord:
    """`best`, which won a tie with `other` (faster, or with knobs that made no difference), saying so."""
    unit = best.unit
    best.tie = {
        "faster_trial": other.number,
        unit.key("faster"): round(other.judged, 2),
        "faster_ci95": round(_ci(other), 4),
        "faster_risk": _risk_name(other, base.knobs, user_knobs),
        "chosen_trial": best.number,
        unit.key("chosen"): round(best.judged, 2),
        "chosen_ci95": round(_ci(best), 4),
        "chosen_risk": _risk_name(best, base.knobs, user_knobs),
        "note": note,
    }
    return best


def _only_what_counts(best: TrialRecord, ok: list[TrialRecord], base: TrialRecord):
    """`best` less each knob whose change made no difference beyond the noise: where the config without it (the
    knob at the baseline's value, every other as `best` has it) was measured and its window's interval overlaps
    `best`'s (`beyond_noise`), that config is the best, as a tie goes to the safer config; again from there.
    (the best, [(knob, value, the trial that had it)])."""
    idle = []
    while True:
        for name, value in best.knobs.items():
            if name not in base.knobs or value == base.knobs[name]:
                continue
            without = {**best.knobs, name: base.knobs[name]}
            other = next((r for r in ok if r.knobs == without), None)
            if other is not None and not beyond_noise(best.judged, _ci(best), other.judged, _ci(other)):
                idle.append((name, value, best))
                best = other
                break
        else:
            return best, idle


def _idle_note(idle: list) -> str:
    """Why the export left out knobs that made no difference (`_only_what_counts`)."""
    parts = [
        f"{name}={K.shown(value)} (trial #{had.number}, {sig(had.judged)} {had.unit.label} +-{_ci(had):.1%})"
        for name, value, had in idle
    ]
    return (
        f"{'; '.join(parts)} made no difference beyond the noise against the config without it (95% CIs "
        "overlap): the baseline's value is exported, as a tie goes to the safer config"
    )


def _risk_name(record: TrialRecord, baseline_knobs: dict[str, Any], user_knobs: K.UserKnobs | None) -> str:
    rank, n, changed = risk(record.knobs, baseline_knobs, user_knobs)
    cls = next(name for name, r in SAFETY_RANK.items() if r == rank)
    if not changed:
        return "the baseline's knobs"
    return f"{cls}, {n or 'no'} changed knob{'' if n == 1 else 's'} above the safe class"
