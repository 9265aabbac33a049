"""The recorder: each finished trial becomes a record, written everywhere at once
(MLflow, trials.csv, the caller's view), and `reconcile` makes a resumed search
whole again (trials Optuna saw finish but nobody recorded; trials cut short).
A reference read (autotune.decide.reference) becomes a record of its own, tagged,
never counted as a trial (`add_read`)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from autotune import knobs as K
from autotune.records.run_dir import add_speedup, record_of, trial_dir_of, write_csv
from autotune.records.trial_record import TrialRecord
from autotune.trial.result import TrialResult
from autotune.records.scaling import EFFICIENCY, add_efficiency

LAUNCH_INFO = ("node_ip", "gpu_ids", "started_unix", "ended_unix")  # what a backend adds to a result: where, when


class Recorder:
    """Turns each finished trial (its `TrialResult`, as a backend or a resume hands it over)
    into a record, writes it everywhere at once, and tells the caller."""

    def __init__(self, tracker, records, csv_path, tell, baseline_knobs, reads=()):
        self.tracker, self.records, self.baseline_knobs = tracker, records, baseline_knobs
        self.csv_path, self.tell = csv_path, tell  # tell: hears each record (a search callback's `on_trial`)
        self.baseline_failed: TrialRecord | None = None
        self.reads: list[TrialRecord] = list(reads)  # the reference reads (TrialRecord.read), in order
        # a record's figures against the reference read near its time (autotune.execution.reads), where the
        # search reads one: merged into its metrics over `add_speedup`'s ratio to the baseline trial
        self.judge: Callable[[TrialRecord], dict] | None = None

    def baseline(self) -> TrialRecord | None:
        return next((r for r in self.records if r.is_baseline), None)

    def add(
        self,
        config: dict,
        result: TrialResult,
        *,
        trial_dir: Path | str | None = None,
        launch: dict | None = None,
        ray_error: str | None = None,
    ) -> None:
        """`config`: the trial's config (its knobs, `trial_number`); `result`: what its runner reported, parsed
        once where it arrived; `launch`: where and when it ran (LAUNCH_INFO), as the backend saw it; `ray_error`:
        why Ray failed the trial, where it did."""
        knobs = {k: config[k] for k in self.baseline_knobs}  # the built-in knobs and the user's
        record = record_of(
            config["trial_number"],
            knobs,
            result,
            trial_dir,
            # the baseline is enqueued first; a later trial with its knobs is a repeat
            is_baseline=knobs == self.baseline_knobs and self.baseline() is None,
            info={k: (launch or {}).get(k) for k in LAUNCH_INFO},
            ray_error=ray_error,
        )
        base = self.baseline()
        if record.is_baseline:
            base = record
            if record.status != "ok":
                self.baseline_failed = record
        add_speedup(record, base)
        if self.judge and record.measured:
            record.add_derived(**self.judge(record))
        add_efficiency(record, base)
        self.records.append(record)
        record.mlflow_run_id = self.tracker.log_trial(record, self.baseline_knobs)
        if record.is_baseline:  # trials that finished before it (in parallel on a cluster)
            self._late_efficiency(record)
        self.write()
        if self.tell is not None:
            self.tell.on_trial(record)

    def write(self) -> None:
        """trials.csv: the trials, then the reads."""
        write_csv(self.records, self.csv_path, self.reads)

    def add_read(
        self, kind: str, knobs: dict, result: TrialResult, *, trial_dir, launch: dict, confirms: int | None = None
    ) -> TrialRecord:
        """A reference read (`kind`: "reference", the baseline config read again; "confirm", trial `confirms`
        read afresh), recorded as its own row and MLflow run, tagged, numbered apart from the trials."""
        record = record_of(
            len(self.reads) + 1,
            {k: knobs[k] for k in self.baseline_knobs},
            result,
            trial_dir,
            info={k: launch.get(k) for k in LAUNCH_INFO},
        )
        record.read = kind
        if confirms is not None:
            record.info["confirms_trial"] = confirms
        self.reads.append(record)
        record.mlflow_run_id = self.tracker.log_read(record)
        self.write()
        return record

    def rejudge(self, final: bool = True) -> None:
        """Every measured trial's figures again, with every read so far (a trial's reference was extrapolated from
        the reads before it when it was recorded): the records (what the live view shows), trials.csv, and with
        `final` (the search's end; not after each read, where it would cost a write per trial) MLflow."""
        for r in self.records if self.judge else ():
            figures = self.judge(r) if r.measured else {}
            if figures:
                r.add_derived(**figures)
                if final and r.mlflow_run_id:
                    self.tracker.log_metrics(r.mlflow_run_id, figures)
        self.write()

    def _late_efficiency(self, baseline: TrialRecord) -> None:
        for r in self.records:
            if r is not baseline and EFFICIENCY not in r.metrics:
                add_efficiency(r, baseline)
                if EFFICIENCY in r.metrics and r.mlflow_run_id:
                    self.tracker.log_metrics(r.mlflow_run_id, {EFFICIENCY: r.metrics[EFFICIENCY]})


def reconcile(study, recorder: "Recorder", space: K.Space, run_dir: Path) -> None:
    """After a crash or an interruption: trials Optuna saw finish but the driver
    did not record (killed in between) are recorded from their result.json;
    trials left RUNNING are marked FAIL and `interrupted` (the strategy proposes
    them again first)."""
    from optuna.trial import TrialState

    recorded = {r.number for r in recorder.records}
    fixed = {k: v for k, v in space.baseline.items() if k not in space.search}
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("virtual"):
            continue  # never ran: a repeat or a predicted failure told to the sampler
        result_file = trial_dir_of(run_dir, t.number) / "result.json"
        finished = t.state in (TrialState.COMPLETE, TrialState.FAIL) and not t.user_attrs.get("interrupted")
        if finished and t.number not in recorded and result_file.exists():
            recorder.add(
                {**fixed, **t.params, "trial_number": t.number},
                TrialResult.read(result_file),
                trial_dir=result_file.parent,
            )
        elif t.state == TrialState.RUNNING or (finished and t.number not in recorded):
            study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
            if t.state == TrialState.RUNNING:
                study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
