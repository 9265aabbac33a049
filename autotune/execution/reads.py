"""The reference reads of a search as it goes (issue 53; the model is `autotune.decide.reference`): between trials,
when the schedule says, the baseline config read again in a fresh process (a timed window alone, through the search's
fork server: ~1-3 s for a built-in workload on 2 cores), and the incumbent read afresh beside it while it has no fresh
read. Each read goes where the strategy judges from (the study's user attributes) and is recorded as its own row
(trials.csv, MLflow: tagged `reference` or `confirm`, never counted as a trial); each trial record carries its
figures against the reference (`figures`, the recorder's hook), again at the end with every read (`Recorder.rejudge`).

By default (`reference_reads: drifting`, issue 64) the reads start only once the search's own reads show the host
drifting beyond the pairs' noise (`reference.drift_seen`: the baseline's two reads too far apart, a trial under
outside load): on a quiet host they change no decision and cost 3-32% of a search. `note()` says whether they were
taken, and why (search.json, the report); a resumed search keeps the reason (the study's READS_WHY_KEY).

The reads run here, between trials, so they need the trials to run one at a time on this host (the local backend, a
local Ray on a CPU host: the backend's `reader`); elsewhere each trial is judged by its own figure, as before."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from autotune.decide.reference import (
    CI_CAP,
    CONFIRMS_KEY,
    READS_KEY,
    SHARE,
    Judge,
    Read,
    Schedule,
    capped,
    drift_seen,
    figures,
)
from autotune.decide.bar import Incumbent
from autotune.records.trial_record import TrialRecord
from autotune.records.best import pick_best
from autotune.trial.result import TrialResult

READS_DIR = "reads"  # under the run dir: one dir a read (NN-reference, NN-confirm-TRIAL)
READS_WHY_KEY = "reference_reads_why"  # the study's user attribute: why the reads started (a resumed search's too)


class Reads:
    """The search's reads: `before_trial()` (the proposer, before each proposal: a read where the schedule says),
    `at_end()` (the driver, once the trials are done: the best read afresh where it is not yet, else the reference
    once more, where the schedule affords it), `figures(record)` (the recorder's hook, on the reads as last
    refreshed: before each proposal and after each read). `read(knobs, label, dir) -> TrialResult`: one timed window
    of `knobs` in a fresh process (the backend's `reader`)."""

    def __init__(
        self,
        study,
        strategy,
        recorder,
        read: Callable[[dict, str, Path], TrialResult],
        baseline: dict,
        *,
        started: float,
        device: str,
        when: tuple[float, str] = (SHARE, "drifting"),
    ):
        self.study, self.strategy, self.recorder, self.read, self.baseline = study, strategy, recorder, read, baseline
        self.judge = Judge(study, device)
        strategy.judge = self.judge
        recorder.judge = self.figures
        share, mode = when  # the spec's reference_share and reference_reads
        self.schedule = Schedule(started=started, share=share)
        self.mode, self.device = mode, device
        self.why: str | None = study.user_attrs.get(READS_WHY_KEY) or (
            "reference_reads: always (the spec)" if mode == "always" else None
        )
        for r in recorder.reads:  # a resumed search: what its reads cost so far
            self.schedule.done(r.info.get("trial_wall_s") or 0.0)

    def drifting(self) -> bool:
        """Whether the reads are on: always, or once the search's reads show drift (kept from then on)."""
        if self.why is None:
            self.why = drift_seen(self.recorder.records, self.device)
            if self.why is not None:
                self.study.set_user_attr(READS_WHY_KEY, self.why)
        return self.why is not None

    def note(self) -> dict:
        """Whether the reads were on (`on`: drift seen, or always) and taken, and why (search.json's
        `reference_reads`, the report's line)."""
        taken = bool(self.schedule.reads)
        if self.why is None:
            why = "the search's own reads showed no drift beyond the pairs' noise (the baseline's two reads agreed, no "
            why += "trial under outside load)"
        else:
            why = self.why if taken else f"{self.why}, but the search ended before its share afforded one"
        return {"mode": self.mode, "on": self.why is not None, "taken": taken, "why": why}

    def before_trial(self) -> None:
        self.judge.refresh()  # the figures against the baseline's read (its interval), with reads or without
        if self.judge.base is None or not self.drifting():
            return
        if self.schedule.cost_s is None:  # before the first read: the baseline trial's second read cost as much
            self.schedule.cost_s = self._baseline_cost()
        waiting = self._waiting()
        if self.schedule.due(time.time(), 2 if waiting else 1):
            self._slot(waiting)

    def at_end(self) -> None:
        """The best as the run dir will pick it (`records.pick_best`: a safer config's tie, an undisturbed trial
        first), where it has no fresh read yet, read afresh beside a reference read; else the reference once more
        (the last trials' reference is then interpolated, not extrapolated). Within the schedule's share like every
        read: a search too short to afford them keeps its best's figure its trial's (`TrialRecord.figure`, not read
        again), which the report says. The reads at the end used to come on top of the share, and a 30-s search
        paid 30% for them (issue 53: memmap_loop 1.32x the time). None on a host that showed no drift."""
        self.judge.refresh()
        if self.judge.base is None or not self.drifting():
            return
        self.recorder.rejudge(final=False)
        best = pick_best(self.recorder.records, self.strategy.user_knobs)
        unread = best is not None and self._unread(best.number)
        if self.schedule.due(time.time(), 2 if unread else 1):
            self._slot(Incumbent(best.number, best.knobs, best.judged or 0.0, 0.0) if unread else None)

    def _baseline_cost(self) -> float:
        base = next((r for r in self.recorder.records if r.is_baseline), None)
        metrics = base.metrics if base else {}
        return metrics.get("anchor_reread_s") or (metrics.get("window_s") or 1.0) + (metrics.get("warmup_s") or 1.0)

    def _waiting(self):
        """The incumbent (`bar.Incumbent`: its number and knobs) where it has no fresh read yet, is not the
        baseline, and its window's time is known (a trial the reads judge), else None."""
        best = self.strategy.incumbent()
        return best if best is not None and self._unread(best.number) else None

    def _unread(self, number: int) -> bool:
        """Trial `number` is no baseline, has no fresh read yet, and its window's time is known."""
        judge = self.judge
        return number != judge.base_number and not judge.confirmed(number) and number in judge.timed

    def _slot(self, incumbent) -> None:
        """The baseline config read, then the incumbent's config where it waits for its fresh read."""
        self._read("reference", self.baseline, "reference", READS_KEY)
        if incumbent is not None:
            knobs = {**self.baseline, **incumbent.params}
            self._read("confirm", knobs, f"confirm-{incumbent.number:04d}", CONFIRMS_KEY, incumbent.number)
        self.judge.refresh()
        self.recorder.rejudge(final=False)  # the records as the live view shows them: the incumbent's fresh figure

    def _read(self, kind: str, knobs: dict, label: str, key: str, confirms: int | None = None) -> None:
        label = f"{self.schedule.reads + 1:02d}-{label}"  # the reads' order, then what it read
        trial_dir = Path(self.recorder.csv_path).parent / READS_DIR / label
        started = time.time()
        result = self.read(knobs, label, trial_dir)
        ended = time.time()
        cost = ended - started
        result.trial_wall_s = cost  # the read's whole cost, from fork to result: the report's share
        self.schedule.done(cost)
        launch = {"started_unix": started, "ended_unix": ended}
        self.recorder.add_read(kind, knobs, result, trial_dir=trial_dir, launch=launch, confirms=confirms)
        metrics = result.metrics or {}
        value, at = result.rate if result.ok else None, metrics.get("window_mid_unix")  # in its unit (unit_of)
        if not value or not at:  # (a read under load from outside counts: that load is the drift it reads)
            return
        read = Read(at, value, min(metrics.get("step_mean_ci95") or 0.0, CI_CAP)).as_dict()
        stored = self.study.user_attrs.get(key)
        if confirms is None:
            self.study.set_user_attr(key, [*(stored or []), read])
        else:
            stored = dict(stored or {})
            stored[str(confirms)] = [*stored.get(str(confirms), []), read]
            self.study.set_user_attr(key, stored)

    def figures(self, record: TrialRecord) -> dict:
        """`record`'s figures against the reference (`reference.figures`), {} before the baseline trial is judged
        (its own record's come at the next read) or where its window's time is unknown (a trial recorded before
        this search read any reference). No study query: the judge as last refreshed."""
        reference, base = self.judge.reference, self.judge.base
        at, value = record.metrics.get("window_mid_unix"), record.measured
        if reference is None or base is None or not at or not value:
            return {}
        ci = record.metrics.get("step_mean_ci95")
        own = Read(at, value, capped(ci))
        fresh = [] if record.is_baseline else self.judge.confirms.get(record.number, [])
        return figures(reference, base.value, own, fresh, record.unit.metric)
