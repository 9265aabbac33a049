"""One trial as the search recorded it (`TrialRecord`: its knobs, metrics, status and what the search judged of
it), one row of trials.csv and one nested MLflow run; and whether two records are comparable (`same_device`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune import knobs as K
from autotune.trial.result import Unit, unit_of

INFO = (
    "host",
    "node_ip",
    "gpu_ids",
    "started_unix",
    "ended_unix",
    "device_type",
    "device_name",
    "torch",
    "trial_wall_s",
    "optimizer",
    "has_batchnorm",
    "disturbed",
    "chosen_by",  # the measurement that chose this move (a climb's playbook move), or the model's word
)
NOT_METRICS = {
    "trial",
    "status",
    "baseline",
    "bottleneck",
    "parity",
    "parity_reason",
    "error_type",
    "error",
    "mlflow_run_id",
    "trial_dir",
    "read",
    "read_number",
    "confirms_trial",
    *INFO,
    *K.KNOBS,
}


@dataclass
class TrialRecord:
    """One finished trial, as the driver saw it."""

    number: int
    status: str  # ok | pruned | oom | error | timeout | hung | cut
    knobs: dict[str, Any]
    metrics: dict[str, float]
    is_baseline: bool = False
    error_type: str | None = None
    error: str | None = None
    trial_dir: str | None = None
    info: dict[str, Any] = field(default_factory=dict)  # host, device, wall time
    mlflow_run_id: str | None = None
    diagnosis: dict[str, Any] | None = None  # bottleneck, evidence, recommendations
    parity: dict[str, Any] | None = None  # loss parity against the baseline (None: no numerics knob changed)
    tie: dict[str, Any] | None = None  # set by pick_best on the best: a faster, riskier trial it tied with
    # a read, not a trial (autotune.decide.reference): "reference" (the baseline config read again as the search
    # went) or "confirm" (an incumbent read afresh, `info["confirms_trial"]`); its `number` counts the reads
    read: str | None = None
    hung: dict[str, Any] | None = None  # a hung trial's hang: its kind and where it waited (TrialResult.hung)

    @property
    def unit(self) -> Unit:
        """What its throughput counts (trial.result.unit_of): tokens for a language model, else samples."""
        return unit_of(self.metrics)

    @property
    def measured(self) -> float | None:
        """Throughput as measured, in its unit, a pruned trial's too (over its shortened
        window): what plots and per-knob effects show. `throughput` is only a
        complete trial's: what can be the best."""
        return self.metrics.get(self.unit.metric) if self.status in ("ok", "pruned") else None

    @property
    def safe(self) -> bool:
        """No measured reason to distrust this config's training numerics."""
        return self.parity is None or bool(self.parity["passed"])

    @property
    def throughput(self) -> float | None:
        return self.metrics.get(self.unit.metric) if self.status == "ok" else None

    @property
    def tie_holds(self) -> bool:
        """Its window tied with a safer incumbent (`tie_kept`: the search
        gave that tie to the incumbent, as `pick_best` gives ties to the safer
        config), and the tie still holds: the re-measurement has not rejected
        that incumbent (`info["tie_reopened"]`, autotune.decide.checked)."""
        return bool(self.metrics.get("tie_kept")) and "tie_reopened" not in self.info

    @property
    def contends(self) -> bool:
        """Can be the best: complete, safe, and no tie with a safer incumbent holds (`tie_holds`)."""
        return bool(self.throughput) and self.safe and not self.tie_holds

    @property
    def speedup(self) -> float | None:
        """Its ratio to the baseline: against the baseline read near its window's time where the search read it
        again (autotune.decide.reference), else against the baseline trial."""
        return self.metrics.get("speedup_x")

    def add_derived(self, **metrics: float) -> None:
        """Metrics set after the trial, from what it measured and the baseline's record (its speedup, its
        scaling efficiency): added here, the one way (as `TrialResult.add_derived`), beside what it measured."""
        self.metrics.update(metrics)

    @property
    def judged(self) -> float | None:
        """Its throughput as the search judged it (a complete trial's): all its reads against the reference at
        their times, in the baseline trial's units (`judged_samples_per_s`, or tokens, autotune.decide.reference),
        where the search read a reference; else its own."""
        return (self.metrics.get(self.unit.key("judged")) or self.throughput) if self.throughput else None

    @property
    def figure(self) -> dict[str, Any] | None:
        """Its speedup as the search states it, with its 95% interval: the fresh reads' (`confirmed`: freed of
        its selection as the incumbent, what the side by side is expected to reproduce) where it was read again,
        else its own ratio to the reference; None without one."""
        m = self.metrics
        if m.get("confirmed_speedup_x"):
            return {
                "x": m["confirmed_speedup_x"],
                "low": m.get("confirmed_speedup_low"),
                "high": m.get("confirmed_speedup_high"),
                "confirmed": True,
            }
        if m.get("speedup_x"):
            return {"x": m["speedup_x"], "low": m.get("speedup_low"), "high": m.get("speedup_high"), "confirmed": False}
        return None

    def row(self) -> dict[str, Any]:
        return {
            "trial": None if self.read else self.number,
            **({"read": self.read, "read_number": self.number} if self.read else {}),
            "status": self.status,
            "baseline": self.is_baseline,
            **self.knobs,
            **self.metrics,
            **self.info,
            "bottleneck": (self.diagnosis or {}).get("bottleneck"),
            "parity": None if self.parity is None else ("passed" if self.parity["passed"] else "failed"),
            "parity_reason": (self.parity or {}).get("reason"),
            "error_type": self.error_type,
            "error": self.error,
            "trial_dir": self.trial_dir,
            "mlflow_run_id": self.mlflow_run_id,
        }


def same_device(a: TrialRecord | None, b: TrialRecord) -> bool:
    """Comparable: measured on the same kind of device (a heterogeneous cluster
    mixes them; a ratio across device types says nothing about a knob)."""
    return a is None or a.info.get("device_name") == b.info.get("device_name")
