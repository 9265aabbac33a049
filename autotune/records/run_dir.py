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
from autotune.records.best import hangs, pick_best
from autotune.records.trial_record import INFO, NOT_METRICS, TrialRecord, same_device
from autotune.records.state import STATE_FILE, SearchState
from autotune.records.verdicts import break_even, settle
from autotune.trial import compiled
from autotune.trial.compiled import BUNDLE_FILE
from autotune.trial.result import SAMPLES, TrialResult, Unit

# what Ray Tune schedules on (`transport`): a trial's throughput in its unit (trial.result.unit_of)
TUNE_METRIC = "throughput"


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
        """The search's user knobs, as its space declares them (`autotune.plan.SearchPlan.user_knobs`)."""
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


def trials_frame(records: list[TrialRecord], reads: list[TrialRecord] = ()):
    """One row per trial, in trial order: knobs, metrics, status, error; then one per reference read
    (`TrialRecord.read`: its kind in `read`, its number in `read_number`, `trial` empty: not a trial)."""
    import pandas as pd

    rows = [r.row() for r in sorted(records, key=lambda r: r.number)] + [r.row() for r in reads]
    frame = pd.DataFrame(rows)
    for number in ("trial", "read_number"):  # whole numbers, empty where not one (not 0.0: a column with a gap)
        if number in frame:
            frame[number] = frame[number].astype("Int64")
    return frame


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
