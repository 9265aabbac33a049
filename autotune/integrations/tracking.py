"""MLflow: one parent run per search, one nested run per trial.

Params are the knobs, metrics carry their units in their names (stored at the 4 significant figures a
person reads; the run dir keeps every digit), tags hold the status, the outcome and the failure reason.
The search's answer (autotune.export.answer) is the parent run's description, and the re-measured speedup
with its range is on the winner's row of the trials' view. A trial's run spans the trial's own
start and end (not when the driver wrote it). A pruned trial is its own outcome,
not a failure: FINISHED in MLflow (its throughput was measured), tag
`outcome=pruned`; so are a hung trial (`outcome=hung`, where it waited in `hung.where`)
and one the time budget's end cut (`outcome=cut`, KILLED). Only the driver writes to MLflow, so trials on other
hosts need no access to the store.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from autotune._version import __version__

VIEW_TAG = "mlflow.sharedViewState."  # + a key: an experiment tag the 3.x UI opens as a preset view
# every other status: FAILED; a trial the budget's end cut was stopped, not failed
STATUS_TO_MLFLOW = {"ok": "FINISHED", "running": "RUNNING", "pruned": "FINISHED", "cut": "KILLED"}
# every other status: failed; a hung trial (no step in time) and a cut one (the budget's end) are their own
OUTCOME = {"ok": "complete", "pruned": "pruned", "hung": "hung", "cut": "cut"}


# a trial's tags on the trials' view: its speedup re-measured side by side, and the pairs' range (export.answer.rows)
REMEASURED, PAIRS = "remeasured", "pairs"


def readable(value: float) -> float:
    """A metric at the precision a person reads: 4 significant figures (the UI shows what is stored, and
    cut 7443.46382... and 1.64187890... by its column)."""
    return float(f"{float(value):.4g}")


def _run_name(record, best: bool = False) -> str:
    """A trial's run name: trial-004, trial-000 (baseline); the best's says so: trial-004 (best)."""
    marks = [m for m, on in (("baseline", record.is_baseline), ("best", best)) if on]
    return f"trial-{record.number:03d}" + (f" ({', '.join(marks)})" if marks else "")


def _ms(unix_s) -> int | None:
    return int(unix_s * 1000) if unix_s else None


def default_uri(run_dir: Path) -> str:
    return f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"


def empty_store(run_dir: Path) -> Path:
    """An empty local MLflow store (SQLite, schema created), in a temporary dir;
    `adopt_store` moves it into the run dir once the search is checked (nothing
    is written in the run dir before that), so it is made while Ray starts.
    MLflow's schema migrations take 1.4-5 s on 2 cores: they run once per MLflow
    version, into a copy kept in the user's cache dir (~/.cache/autotune)."""
    import logging
    import os
    import shutil
    import sqlite3
    import tempfile

    import mlflow

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # no "creating tables" chatter
    path = Path(tempfile.mkdtemp(prefix="autotune-mlflow-")) / "mlflow.db"
    artifacts = (run_dir / "mlartifacts").resolve().as_uri()
    cache = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "autotune"
        / f"mlflow-{mlflow.__version__}.db"
    )
    try:
        shutil.copyfile(cache, path)
        with sqlite3.connect(path) as db:  # MLflow's own "Default" experiment: its artifacts in this run dir too
            db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (f"{artifacts}/0",))
        return path
    except (OSError, sqlite3.Error):
        path.unlink(missing_ok=True)
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    SqlAlchemyStore(f"sqlite:///{path}", artifacts).engine.dispose()
    try:  # atomically: two searches may start at once
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        shutil.copyfile(path, tmp)
        tmp.replace(cache)
    except OSError:
        pass  # no cache: the next search migrates again
    return path


def adopt_store(store: Path | None, run_dir: Path | None) -> None:
    """Move an `empty_store` into `run_dir` (unless it has a store; None:
    discard it); its temporary dir goes either way."""
    import shutil

    if store is None:
        return
    if run_dir is not None and store.exists() and not (run_dir / "mlflow.db").exists():
        shutil.move(str(store), run_dir / "mlflow.db")
    shutil.rmtree(store.parent, ignore_errors=True)


def view_key(parent_run_id: str) -> str:
    return f"autotune-{parent_run_id}"


def trials_view(parent_run_id: str, knobs) -> dict:
    """The MLflow 3 runs page's state for one search: its trials only (ordered
    by a metric, the UI shows them flat, not nested under the search's run),
    fastest first, throughput, speedup, outcome, parity and the searched knobs
    as columns; in the chart view, every trial, throughput and speedup first
    (MLflow 3.17's ui-state keys, read from its JS bundle). The UI reads it from the
    experiment tag VIEW_TAG + view_key, opened by `trials_url`. A language model's search (trial.result.unit_of)
    has tokens/s and MFU beside samples/s: it is written before any trial says which the search is, so both."""
    cols = [
        "metrics.`samples_per_s`",
        "metrics.`tokens_per_s`",
        "metrics.`mfu`",
        "metrics.`speedup_x`",
        f"tags.`{REMEASURED}`",
        f"tags.`{PAIRS}`",
        "tags.`outcome`",
        "tags.`safety.parity`",
        *(f"params.`{k}`" for k in knobs),
        "tags.`safety.flags`",
    ]
    section = "autotune-metrics"  # MLflow appends a chart for each other metric after these (sorted by name)
    charts = [
        {
            "uuid": f"autotune-{m}",
            "type": "BAR",
            "metricKey": m,
            "displayName": m,
            "runsCountToCompare": 100,
            "metricSectionId": section,
            "deleted": False,
            "isGenerated": False,
        }
        for m in ("samples_per_s", "tokens_per_s", "speedup_x")
    ]
    return {
        # its trials: not the search's reference reads (autotune.role reference or confirm, Tracker.log_read)
        "searchFilter": f"tags.`mlflow.parentRunId` = '{parent_run_id}' and tags.`autotune.role` = 'trial'",
        "orderByKey": "metrics.`samples_per_s`",
        "orderByAsc": False,
        "selectedColumns": cols,
        "columnOrder": ["attributes.`Run Name`", *cols],
        "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": charts,
        "isAccordionReordered": True,
        "compareRunSections": [
            {
                "uuid": section,
                "name": "Model metrics",
                "display": True,
                "isReordered": True,
                "deleted": False,
                "isGenerated": True,
            }
        ],
    }


def trials_url(base: str, experiment_id: str, parent_run_id: str) -> str:
    """The runs page on `trials_view`, with the sidebar in model-training mode
    (MLflow 3 starts in GenAI mode whatever the experiment's kind)."""
    return (
        f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs"
        f"?workflowType=machine_learning&viewStateShareKey={view_key(parent_run_id)}"
    )


def share_trials_view(client, experiment_id: str, parent_run_id: str, search_params) -> None:
    """Save `trials_view` for a search whose run has `search_params` (its knobs: `space.<knob>`)."""
    import json

    knobs = [k.removeprefix("space.") for k in search_params if k.startswith("space.")]
    view = json.dumps(trials_view(parent_run_id, knobs))
    client.set_experiment_tag(experiment_id, VIEW_TAG + view_key(parent_run_id), view)


def check_uri(uri: str) -> None:
    """A tracking server must answer before a search starts, so a wrong address
    fails in a second, not after the first trial."""
    from autotune.spec import SpecError

    if not uri.startswith(("http://", "https://")):
        return
    import urllib.request

    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5).read()
    except OSError as e:
        raise SpecError(
            f"tracking.uri: cannot reach an MLflow server at `{uri}` ({getattr(e, 'reason', e)}); "
            "start one (`mlflow server --host 127.0.0.1 --port 5000`) or leave tracking.uri out "
            "for a local store"
        ) from None


class NoTracker:
    """A search on a host without MLflow (the local backend on a GPU host): its
    records are the run dir's alone (trials.csv, search.json, each trial's files)."""

    uri = parent_run_id = None

    def log_search(self, params: dict[str, Any], tags: dict[str, str]) -> None:
        pass

    def log_trial(self, record, baseline_knobs: dict | None = None) -> None:
        return None

    def log_read(self, record) -> None:
        return None

    def log_metrics(self, run_id: str, metrics: dict[str, float]) -> None:
        pass

    def tag_search(self, tags: dict[str, str]) -> None:
        pass

    def reopen(self) -> None:
        pass

    def finish(
        self, metrics: dict[str, float], artifacts: list[Path], status: str = "FINISHED", plots=(), result=None
    ) -> None:
        pass


class Tracker:
    """Writes a search to MLflow through MlflowClient (no global active run)."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_dir: Path,
        search_name: str,
        parent_run_id: str | None = None,
        *,
        user_knobs=None,
    ):
        """`user_knobs`: the search's (`autotune.plan.SearchPlan.user_knobs`), whose declared classes a trial's
        safety tags name (None: none declared)."""
        import logging

        from mlflow.tracking import MlflowClient

        from autotune.knobs import UserKnobs

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no "creating tables" chatter
        self.uri, self.user_knobs = uri, user_knobs or UserKnobs()
        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(experiment)
        if exp is not None:
            self.experiment_id = exp.experiment_id
        else:
            # local store: artifacts beside it in the run dir, not in the cwd's ./mlruns
            location = None if uri.startswith("http") else (run_dir / "mlartifacts").resolve().as_uri()
            self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        if exp is None or "mlflow.experimentKind" not in exp.tags:
            # the MLflow 3 UI opens a GenAI (traces) view unless told this is model training
            self.client.set_experiment_tag(self.experiment_id, "mlflow.experimentKind", "custom_model_development")
        if parent_run_id is None:
            run = self.client.create_run(
                self.experiment_id,
                run_name=search_name,
                tags={
                    "autotune.role": "search",
                    "autotune.version": __version__,
                    "autotune.run_dir": str(run_dir.resolve()),
                },
            )
            parent_run_id = run.info.run_id
        self.parent_run_id = parent_run_id

    def log_search(self, params: dict[str, Any], tags: dict[str, str]) -> None:
        self._log(self.parent_run_id, params=params, tags=tags)
        share_trials_view(self.client, self.experiment_id, self.parent_run_id, params)

    def log_trial(self, record, baseline_knobs: dict | None = None) -> str:
        """A nested run for one finished trial, spanning the trial's start and
        end; returns its run id. A run left by a driver killed while logging this
        trial is finished, not doubled."""
        run_id = (
            self._trial_run(record.number)
            or self.client.create_run(
                self.experiment_id,
                run_name=_run_name(record),
                tags={
                    "mlflow.parentRunId": self.parent_run_id,
                    "autotune.role": "trial",
                    "trial_number": str(record.number),
                },
                start_time=_ms(record.info.get("started_unix")),
            ).info.run_id
        )
        tags = {
            "status": record.status,
            "outcome": OUTCOME.get(record.status, "failed"),
            "baseline": str(record.is_baseline).lower(),
            "trial_number": str(record.number),
        }
        if record.error:
            tags["failure_reason"] = f"{record.error_type}: {record.error}"[:5000]
        if record.hung and record.hung.get("where"):
            tags["hung.where"] = record.hung["where"]
        if baseline_knobs:  # the safety classes of the knobs this trial changed
            changed = [k for k, v in record.knobs.items() if v != baseline_knobs.get(k)]
            tags["safety.flags"] = ",".join(f"{self.user_knobs.lookup(k).safety}:{k}" for k in changed) or "none"
        if record.parity is not None:
            tags["safety.parity"] = "passed" if record.parity["passed"] else "failed"
            if record.parity.get("reason"):
                tags["safety.reason"] = record.parity["reason"]
        if record.diagnosis:
            tags["diagnosis"] = record.diagnosis["bottleneck"] or "not measured"
            tags["diagnosis_evidence"] = "; ".join(record.diagnosis["evidence"])
            tags["recommendations"] = "; ".join(record.diagnosis.get("recommendations", []))
        for key in ("host", "device_type", "device_name", "disturbed", "chosen_by"):
            if record.info.get(key):
                tags[key] = str(record.info[key])
        self._log(run_id, params=record.knobs, metrics=record.metrics, tags=tags)
        if record.trial_dir and Path(record.trial_dir).is_dir():
            self.client.log_artifacts(run_id, str(record.trial_dir), artifact_path="trial")
        self.client.set_terminated(
            run_id, status=STATUS_TO_MLFLOW.get(record.status, "FAILED"), end_time=_ms(record.info.get("ended_unix"))
        )
        return run_id

    def log_read(self, record) -> str:
        """A nested run for one reference read (autotune.decide.reference): tagged `autotune.role` = `reference`
        or `confirm` (and `confirms_trial`), `read_number`; not a trial (the trials' view leaves it out)."""
        tags = {
            "mlflow.parentRunId": self.parent_run_id,
            "autotune.role": record.read,
            "read_number": str(record.number),
            "status": record.status,
            **({"confirms_trial": str(record.info["confirms_trial"])} if "confirms_trial" in record.info else {}),
        }
        if record.error:
            tags["failure_reason"] = f"{record.error_type}: {record.error}"[:5000]
        name = f"{record.read}-{record.number:02d}" + (
            f" (trial {record.info['confirms_trial']})" if "confirms_trial" in record.info else ""
        )
        run_id = self.client.create_run(
            self.experiment_id, run_name=name, tags=tags, start_time=_ms(record.info.get("started_unix"))
        ).info.run_id
        self._log(run_id, params=record.knobs, metrics=record.metrics)
        self.client.set_terminated(
            run_id, status=STATUS_TO_MLFLOW.get(record.status, "FAILED"), end_time=_ms(record.info.get("ended_unix"))
        )
        return run_id

    def _trial_run(self, number: int) -> str | None:
        """The run already created for trial `number` of this search, if any."""
        runs = self.client.search_runs(
            [self.experiment_id],
            max_results=1,
            filter_string=f"tags.`mlflow.parentRunId` = '{self.parent_run_id}' and tags.trial_number = '{number}'",
        )
        return runs[0].info.run_id if runs else None

    def log_metrics(self, run_id: str, metrics: dict[str, float]) -> None:
        self._log(run_id, metrics=metrics)

    def tag_search(self, tags: dict[str, str]) -> None:
        self._log(self.parent_run_id, tags=tags)

    def reopen(self) -> None:
        """A resumed search's parent run is running again."""
        self.client.update_run(self.parent_run_id, status="RUNNING")

    def finish(
        self, metrics: dict[str, float], artifacts: list[Path], status: str = "FINISHED", plots=(), result=None
    ) -> None:
        """The parent run's summary metrics, files and plots; with the search's `result` (records.SearchResult),
        its answer where the first screen shows it (`tell`); then the run closed."""
        self._log(self.parent_run_id, metrics=metrics)
        if result is not None:
            self.tell(result)
        for path in artifacts:
            if path.exists():
                self.client.log_artifact(self.parent_run_id, str(path))
        for path in plots:
            self.client.log_artifact(self.parent_run_id, str(path), artifact_path="plots")
        self.client.set_terminated(self.parent_run_id, status=status)

    def tell(self, result) -> None:
        """The answer (autotune.export.answer) as the parent run's description, and on the trials' rows: the
        re-measured speedup (REMEASURED) and the pairs' range (PAIRS) on the re-measured trial's, with their
        metrics; the best's run name marked "(best)", the baseline's too where it kept its place in a tie."""
        from autotune.export import answer as A

        answer = A.of(result, absolute=True)
        report = f"autotune report {result.run_dir}"
        self._log(self.parent_run_id, tags={"mlflow.note.content": A.description(answer, report)})
        for record, best, cells, metrics in A.rows(result):
            if record.mlflow_run_id:
                self._log(record.mlflow_run_id, metrics=metrics, tags=cells)
                if best:  # the winner's row says so in its name, the first column
                    self.client.update_run(record.mlflow_run_id, name=_run_name(record, best=True))

    def _log(self, run_id, params=None, metrics=None, tags=None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, readable(v), now, 0) for k, v in (metrics or {}).items() if v is not None],
            params=[Param(k, str(v)) for k, v in (params or {}).items()],
            tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
        )
