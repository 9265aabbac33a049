"""What a search leaves in its run dir, and reading it back: trials.csv (one row
per trial), search.json (device, space, plan, MLflow ids) and each trial's
result.json. `autotune report` and `autotune export` work from these alone."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune import knobs as K
from autotune.records.state import STATE_FILE, SearchState
from autotune.records.verdicts import break_even, settle, sig
from autotune.trial import compiled
from autotune.trial.compiled import BUNDLE_FILE
from autotune.trial.hung import Hung, ruled_out
from autotune.trial.result import SAMPLES, TrialResult, Unit, unit_of

# what Ray Tune schedules on (`transport`): a trial's throughput in its unit (trial.result.unit_of)
TUNE_METRIC = "throughput"
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


@dataclass
class SearchResult:
    """A search, finished or not: what `autotune.search` returns and `read_run` reads back."""

    run_dir: Path
    space: K.Space
    device: K.Device
    records: list[TrialRecord]
    baseline: TrialRecord | None
    best: TrialRecord | None
    wall_s: float
    paths: dict[str, Path]
    stopped_reason: str | None = None
    ended: str | None = None  # why the search ended: trial count, budget, patience, space exhausted
    confirm: dict[str, Any] | None = None  # the best re-measured against the baseline (autotune.decide.confirm)
    reused: bool = False  # an earlier search's result, returned without running a trial (autotune.records.cache)
    skipped: list[dict] = field(default_factory=list)  # configs the rate model kept from running (search.json)
    importance: dict[str, float] | None = None  # each knob's share of the variation, once the plots are drawn
    reads: list[TrialRecord] = field(default_factory=list)  # the reference reads (TrialRecord.read), in order
    # whether the reference reads were taken, and why (search.json's reference_reads: execution.reads.Reads.note)
    reads_note: dict[str, Any] | None = None

    @property
    def user_knobs(self) -> K.UserKnobs:
        """The search's user knobs, as its space declares them (`autotune.spec.SearchPlan.user_knobs`)."""
        return K.UserKnobs.of(self.space.user)

    @property
    def unit(self) -> Unit:
        """What the search's throughput counts (trial.result.unit_of): its baseline's unit, else its first
        measured trial's; samples before any was measured. Every trial of a workload counts alike."""
        measured = [r for r in ([self.baseline] if self.baseline else []) + self.records if r.measured]
        return measured[0].unit if measured else SAMPLES

    @property
    def confirmed(self) -> dict[str, Any] | None:
        """The re-measurement of this best against the baseline (autotune.decide.confirm),
        None where there is none (or the baseline won it)."""
        c = self.confirm
        return c if c and self.best and c.get("best_trial") == self.best.number and c.get("speedup_x") else None

    @property
    def speedup_unknown(self) -> str | None:
        """Why the best's speedup is unknown (its re-measurement's pairs were
        disturbed by outside load, autotune.decide.confirm), or None."""
        c = self.confirm
        same = c and self.best and c.get("best_trial") == self.best.number
        return c["unknown"] if same and c.get("verdict") == "unknown" else None

    @property
    def speedup_unsettled(self) -> str | None:
        """Why the best's speedup is unsettled (its re-measurement's pairs disagreed with the search's reads of the
        baseline, taken again too, autotune.decide.confirm), or None."""
        c = self.confirm
        same = c and self.best and c.get("best_trial") == self.best.number
        return c["unsettled"] if same and c.get("verdict") == "unsettled" else None

    @property
    def speedup(self) -> float | None:
        """The best's speedup over the baseline: the re-measured one where the
        search re-measured this best (autotune.decide.confirm), else the search's figure
        (`TrialRecord.figure`: its fresh reads', or its ratio to the reference at its
        time), else the trials' ratio; None where there is none, or it is unknown
        (`speedup_unknown`) or unsettled (`speedup_unsettled`: no single number)."""
        if not (self.best and self.baseline and self.baseline.throughput) or self.speedup_unknown:
            return None
        if self.speedup_unsettled:
            return None
        return self.confirmed["speedup_x"] if self.confirmed else self.search_speedup

    @property
    def search_speedup(self) -> float | None:
        """The search's own figure of its best (`search_figure`: its fresh reads' ratio to the reference read
        beside them, or its trial's to the reference at its time), else its trial's ratio to the baseline trial's;
        None without a measured baseline and best."""
        best, base = self.best, self.baseline
        if not (best and base and base.throughput and best.throughput):
            return None
        if best is base:
            return 1.0
        figure = self.search_figure
        return figure["x"] if figure else best.throughput / base.throughput

    @property
    def claim_metrics(self) -> dict[str, float]:
        """The claim as the MLflow parent run's metrics: the speedup (none where unknown or unsettled), the
        search's own figure, and the pairs' count and range (an unsettled claim's too)."""
        c = self.confirm or {}
        out = {"speedup_x": self.speedup, "trials_speedup_x": self.search_speedup}
        if c.get("speedup_x") or c.get("verdict") == "unsettled":
            out.update(
                confirm_rounds=c["rounds"],
                confirm_speedup_low=c.get("speedup_low"),
                confirm_speedup_high=c.get("speedup_high"),
            )
        return {k: v for k, v in out.items() if v is not None}

    @property
    def search_figure(self) -> dict[str, Any] | None:
        """The best's `TrialRecord.figure` (x, its 95% interval, whether it was read again); None where the best is
        the baseline or has no figure (a search without reads)."""
        best = self.best
        return best.figure if best is not None and best is not self.baseline else None

    @property
    def search_interval(self) -> list[float] | None:
        """The search's figure's 95% interval (`search_figure`: where the side by side is expected to land); None
        where it has none."""
        figure = self.search_figure
        return [figure["low"], figure["high"]] if figure and figure.get("low") else None

    @property
    def reads_share(self) -> dict[str, Any] | None:
        """What the reference reads cost (autotune.decide.reference): their count (the baseline's, the
        incumbents' fresh ones), their seconds, and their share of the search's wall time; None without reads."""
        if not self.reads:
            return None
        spent = sum(r.info.get("trial_wall_s") or 0.0 for r in self.reads)
        return {
            "reference_reads": sum(r.read == "reference" for r in self.reads),
            "confirm_reads": sum(r.read == "confirm" for r in self.reads),
            "reads_s": round(spent, 2),
            "share": round(spent / self.wall_s, 4) if self.wall_s else None,
        }

    @property
    def break_even(self) -> dict[str, Any] | None:
        """When the search pays for itself (`verdicts.break_even`): its wall time
        against the winner's per-step saving at the winner's step (its batch size, a language model's tokens a
        step) and measured rate (the re-measured one where the speedup is), in the search's unit."""
        best, unit = self.best, self.unit
        if self.speedup is None:
            return None
        rate = self.confirmed.get(unit.key("best")) if self.confirmed else best.throughput
        per_step = best.metrics.get("tokens_per_step") if unit.name == "tokens" else best.knobs["batch_size"]
        return break_even(self.wall_s, self.speedup, rate, per_step, best is not self.baseline, unit)

    @property
    def hangs(self) -> list[dict[str, Any]]:
        """Its hung trials (`hangs`), each as the report and best_config.yaml list it: the trial, the knobs it set
        otherwise than the baseline, where it waited, what its hang ruled out and the searched values that were
        therefore not tried (autotune.trial.hung), its log."""
        base = self.baseline.knobs if self.baseline else {}
        ran = [r.knobs for r in self.records]  # the hung trials' own values ran
        out = []
        for h in hangs(self.records):
            record = next(r for r in self.records if r.number == h.trial)
            log = Path(record.trial_dir or trial_dir_of(self.run_dir, h.trial)) / "trial.log"
            out.append(
                {
                    "trial": h.trial,
                    "knobs": {k: v for k, v in record.knobs.items() if v != base.get(k)},
                    "where": h.where,
                    "kind": h.kind,
                    "ruled_out": h.rule,
                    "not_tried": {k: v for k, v in h.not_tried(self.space.search, ran).items() if v},
                    "log": str(log),
                }
            )
        return out

    @property
    def best_config_path(self) -> Path | None:
        """Where the best config was exported (`autotune.load_config(path)` loads it for production); None when
        nothing was (no measured baseline, or no safe trial)."""
        path = Path(self.paths.get("best_config") or run_paths(self.run_dir)["best_config"])
        return path if path.exists() else None

    @property
    def trials(self):
        """The trials as a pandas DataFrame, one row per trial (trials.csv's columns)."""
        return trials_frame(self.records)


def run_paths(run_dir: Path, mlflow_uri: str | None = None) -> dict[str, Path | str]:
    """What a search leaves in its run dir, by name (one place for the layout)."""
    paths = {
        "run_dir": run_dir,
        "trials_csv": run_dir / "trials.csv",
        "best_config": run_dir / "best_config.yaml",
        "optuna_storage": run_dir / "optuna.db",
        "plots": run_dir / "plots",
        # the trials' inductor and Triton caches (autotune.execution.launcher), removed at the search's end unless
        # search.keep_compile_cache; the winner's compiled artifacts beside best_config.yaml (trial.compiled)
        "compile_cache": compile_cache_of(run_dir),
        "compile_artifacts": run_dir / BUNDLE_FILE,
    }
    return {**paths, "mlflow_uri": mlflow_uri} if mlflow_uri else paths


def compile_cache_of(run_dir: Path) -> Path:
    """The search's compile cache: its trials' inductor and Triton caches, shared (autotune.execution.launcher)."""
    return Path(run_dir) / "compile-cache"


def compiled_artifacts(result, into: Path) -> dict | None:
    """The best trial's compiled artifacts (trial.compiled: its mega-cache and the kernels of the search's compile
    cache) bundled into `into` beside best_config.yaml: what best_config.yaml records of them. None where the best
    compiled nothing or its trial saved none (an earlier bundle there is removed: it would be another config's)."""
    best, out = result.best, Path(into) / BUNDLE_FILE
    out.unlink(missing_ok=True)
    if best is None or not (best.metrics or {}).get("compile_s"):
        return None
    cache = compile_cache_of(result.run_dir) / compiled.CACHE_DIRS["TORCHINDUCTOR_CACHE_DIR"]
    return compiled.bundle(trial_dir_of(result.run_dir, best.number), cache, out)


def trial_dir_of(run_dir: Path, number: int) -> Path:
    """A trial's own dir: config.json, result.json, trial.log, trace.json."""
    return Path(run_dir) / "trials" / f"{number:04d}"


def transport(number: int, trial_dir: Path, result: TrialResult) -> dict:
    """What Ray Tune carries from a trial to the driver: the runner's result as
    JSON text (Tune would flatten nested dicts), with the metric Tune schedules on."""
    message = {
        "trial_number": number,
        "trial_dir": str(trial_dir),
        "status": result.status,
        "result_json": json.dumps(result.to_dict()),
    }
    if result.ok:
        message[TUNE_METRIC] = result.rate
    return message


def result_of(message: dict | None) -> TrialResult:
    """The transport's receiving end: the runner's result in `message`, parsed once (an
    error where nothing came, a Ray trial that failed before reporting)."""
    text = (message or {}).get("result_json")
    return TrialResult.from_dict(json.loads(text)) if text else TrialResult(status="error")


def record_of(
    number: int,
    knobs: dict[str, Any],
    result: TrialResult,
    trial_dir,
    *,
    is_baseline: bool = False,
    info: dict | None = None,
    ray_error: str | None = None,
) -> TrialRecord:
    """The one conversion from the runner's result to a record; `info`: what
    the launcher adds (node, GPU ids, start and end times)."""
    device, wall = result.device, result.trial_wall_s
    facts = {
        "host": result.host,
        "device_type": device and device.type,
        "device_name": device and device.name,
        "torch": result.torch,
        "trial_wall_s": wall if wall is not None else result.trial_s,
        "optimizer": result.optimizer,
        "has_batchnorm": result.has_batchnorm,
        "disturbed": result.disturbed,
        "chosen_by": result.chosen_by,
        **(info or {}),
    }
    return TrialRecord(
        number=number,
        status=result.status or "error",
        knobs=knobs,
        metrics={k: v for k, v in (result.metrics or {}).items() if v is not None},
        is_baseline=is_baseline,
        error_type=result.error_type or ("RayTrialError" if ray_error else None),
        error=result.error or ray_error,
        trial_dir=str(trial_dir) if trial_dir else None,
        info={k: v for k, v in facts.items() if k in INFO and v is not None},
        diagnosis=result.diagnosis,
        parity=result.parity,
        hung=result.hung,
    )


def add_speedup(record: TrialRecord, baseline: TrialRecord | None) -> None:
    """The record's speedup over the baseline, where the two compare (a pruned trial's too)."""
    if baseline and baseline.throughput and record.measured and same_device(baseline, record):
        record.add_derived(speedup_x=record.measured / baseline.throughput)


def pruning_savings(records: list[TrialRecord]) -> dict[str, float]:
    """Pruned trials, and the time their early stop saved: what a complete trial
    took (the median over complete ones) less what each pruned one took."""
    pruned = [r for r in records if r.status == "pruned"]
    full = sorted(r.info["trial_wall_s"] for r in records if r.status == "ok" and r.info.get("trial_wall_s"))
    if not pruned or not full:
        return {"trials_pruned": len(pruned)} if pruned else {}
    typical = full[len(full) // 2]
    saved = sum(max(0.0, typical - r.info.get("trial_wall_s", typical)) for r in pruned)
    return {"trials_pruned": len(pruned), "pruning_saved_s": saved}


def same_device(a: TrialRecord | None, b: TrialRecord) -> bool:
    """Comparable: measured on the same kind of device (a heterogeneous cluster
    mixes them; a ratio across device types says nothing about a knob)."""
    return a is None or a.info.get("device_name") == b.info.get("device_name")


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


def trials_frame(records: list[TrialRecord], reads: list[TrialRecord] = ()):
    """One row per trial, in trial order: knobs, metrics, status, error; then one per reference read
    (`TrialRecord.read`: its kind in `read`, its number in `read_number`, `trial` empty: not a trial)."""
    import pandas as pd

    rows = [r.row() for r in sorted(records, key=lambda r: r.number)] + [r.row() for r in reads]
    return pd.DataFrame(rows)


def write_csv(records: list[TrialRecord], path: Path, reads: list[TrialRecord] = ()) -> None:
    tmp = path.with_suffix(".csv.tmp")
    trials_frame(records, reads).to_csv(tmp, index=False)
    tmp.replace(path)  # atomic: a reader never sees half a file


def _clean(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value.item() if hasattr(value, "item") else value


def read_run(run_dir: Path) -> SearchResult:
    """A finished or interrupted search, from its run dir."""
    import pandas as pd

    run_dir = Path(run_dir)
    csv = run_dir / "trials.csv"
    if not SearchState.exists(run_dir):
        raise FileNotFoundError(f"`{run_dir}` is not a search's output dir (no {STATE_FILE})")
    state = SearchState.read(run_dir)
    space = K.Space(**state.space)
    # a run dir written before a knob existed (the LM knobs, issue 52): its trials ran with it as PyTorch leaves it
    space.baseline = {**K.pytorch_defaults(space.baseline.get("batch_size")), **space.baseline}
    user_knobs = K.UserKnobs.of(space.user)  # the search's, as search.json keeps them
    records, reads = [], []
    rows = pd.read_csv(csv).to_dict("records") if csv.exists() and csv.stat().st_size else []
    for row in rows:
        row = {k: _clean(v) for k, v in row.items()}
        trial_dir = row.get("trial_dir")
        result_file = Path(trial_dir) / "result.json" if trial_dir else None
        trial_result = TrialResult.read(result_file) if result_file and result_file.exists() else TrialResult("error")
        read = row.get("read")  # a reference read's row, not a trial's
        (reads if read else records).append(
            TrialRecord(
                number=int(row["read_number"] if read else row["trial"]),
                read=read,
                status=row["status"],
                is_baseline=bool(row["baseline"]),
                knobs={k: K.from_cell(k, row.get(k)) if k in K.KNOBS else row.get(k) for k in space.baseline},
                metrics={
                    k: v
                    for k, v in row.items()
                    if k not in NOT_METRICS
                    and not k.startswith(K.USER_PREFIX)
                    and isinstance(v, (int, float))
                    and v is not None
                },
                error_type=row.get("error_type"),
                error=row.get("error"),
                trial_dir=trial_dir,
                info={k: row[k] for k in (*INFO, "confirms_trial") if row.get(k) is not None},
                mlflow_run_id=row.get("mlflow_run_id"),
                diagnosis=trial_result.diagnosis,
                parity=trial_result.parity,
                hung=trial_result.hung,
            )
        )
    baseline = next((r for r in records if r.is_baseline), None)
    best = pick_best(records, user_knobs)
    named = (state.confirm or {}).get("best_trial")  # a rejected best handed over to the next candidate
    if best is not None and named is not None and named != best.number:
        best = next((r for r in records if r.number == named and r.throughput and r.safe), best)
    device = K.Device(
        **{
            **state.device,
            "capability": tuple(state.device["capability"]) if state.device["capability"] else None,
        }
    )
    paths = run_paths(run_dir, state.mlflow_uri)
    result = SearchResult(
        run_dir,
        space,
        device,
        records,
        baseline,
        best,
        state.wall_s or 0.0,
        paths,
        state.stopped_reason or (None if state.wall_s is not None else "interrupted (the search did not finish)"),
        state.ended,
        state.confirm,
        skipped=state.skipped_predicted or [],
        reads=reads,
        reads_note=state.reference_reads,
    )
    settle(result)
    return result
