"""What the driver settles before the trials start: without torch, the
workload's factory (the spec's ref, or a pickled callable) and the batch sizes
the workload's dataset can fill; then, beside Ray's start, the workload built and
checked (`prepare`); then the search's MLflow parent run and search.json, new or
reopened (`open_search`)."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from autotune._imports import installed
from autotune.integrations import tracking as T
from autotune import knobs as K
from autotune import workload as W
from autotune.decide.budget import trial_cap
from autotune.records.run_dir import run_paths
from autotune.records.state import SearchState
from autotune.spec import SpecError, WorkloadSpec
from autotune.plan import SearchPlan


def fit_batches(lists: dict[str, list], base_batch: int, samples: int) -> tuple[dict[str, list], list[str]]:
    """Batch sizes larger than the dataset cannot make one batch: refused for the
    baseline, dropped from the space with the reason."""
    if base_batch > samples:
        raise SpecError(
            f"baseline: batch_size {base_batch} is larger than the workload's dataset ({samples} samples); "
            "use a smaller batch or a larger dataset"
        )
    batches = lists.get("batch_size", [])
    too_big = [f"batch_size={b}: larger than the dataset ({samples} samples)" for b in batches if b > samples]
    if batches:
        lists = {**lists, "batch_size": [b for b in batches if b <= samples]}
    return lists, too_big


def source(
    workload: WorkloadSpec, *, factory: Callable | None, run_dir: Path, resume: bool
) -> tuple[W.Source, bytes | None]:
    """The workload's factory: the plan's ref, or a callable (`workload.pickled`)
    with its pickled bytes; a resumed search loads the run dir's own."""
    if not workload.pickled:
        return workload.ref, None
    path = run_dir / W.PICKLE_FILE
    try:
        if resume or factory is None:
            if not path.exists():
                raise SpecError(
                    f"workload.pickled: `{workload.pickled}` is a factory given in Python and "
                    f"`{run_dir}` has no {W.PICKLE_FILE}; pass it: autotune.search(spec, workload=fn)"
                )
            return W.load_factory(str(path)), path.read_bytes()
        return factory, W.dump_factory(factory)
    except W.WorkloadError as e:
        raise SpecError(str(e)) from e


def prepare(build: Callable, *, run_dir: Path, local_store: bool) -> tuple[object, Path | None, str | None]:
    """The user's workload built (`build()`: (the workload, its optimizer's class); its factory imports torch,
    and `K.optimizer_of`'s first optimizer torch._dynamo, 17 s on 2 cores under load ~8), or a program probed
    (autotune.execution.source), and an empty local MLflow store to adopt (`T.empty_store`, which imports MLflow).
    Runs while Ray starts: on 2 shared cores (load ~3) the first trial of the quickstart started after 7.6-10.7 s
    instead of 10.5-13.6 s. Returns (the workload, the store, the optimizer's class)."""
    workload, optimizer = build()
    try:
        return workload, T.empty_store(run_dir) if local_store else None, optimizer
    except Exception:  # no head start: the Tracker creates the store itself
        return workload, None, optimizer


@dataclasses.dataclass
class Opened:
    tracker: T.Tracker
    paths: dict[str, Path]
    state: SearchState
    n_trials: int
    storage_url: str
    wall_before: float = 0.0  # seconds the search ran before this run of it (a resume)


def open_search(
    plan: SearchPlan, device: K.Device, space: K.Space, state: SearchState | None, *, remembered: dict | None = None
) -> Opened:
    """The search's MLflow parent run and search.json: new, or reopened to resume (`state`), in the plan's run dir.
    The plan's name, workload and `search` settings are what the parent run and search.json record; its `tracking`
    where MLflow is."""
    run_dir, name, search, tracking = plan.run_dir, plan.name, plan.search, plan.tracking
    storage_url = f"sqlite:///{run_dir / 'optuna.db'}"
    # without MLflow installed (the local backend on a GPU host), the run dir is the search's only record
    uri = state.mlflow_uri if state else tracking.uri or (T.default_uri(run_dir) if installed("mlflow") else None)
    paths = run_paths(run_dir, uri)
    tracker = (
        T.Tracker(
            str(uri),
            tracking.experiment,
            run_dir,
            name,
            parent_run_id=state.mlflow_parent_run_id if state else None,
            user_knobs=plan.user_knobs,
        )
        if uri
        else T.NoTracker()
    )
    if not state:
        tracker.log_search(
            params={
                **{f"baseline.{k}": v for k, v in space.baseline.items()},
                **{f"space.{k}": json.dumps(v) for k, v in space.search.items()},
                "workload": plan.workload.ref,
                "sampler": search.sampler,
                "n_trials": search.n_trials,
            },
            tags={"device": f"{device.type}:{device.name}", **{f"fixed.{k}": why for k, why in space.fixed.items()}},
        )
    n_trials = trial_cap(space.search, search.n_trials, search.time_budget_s, search.sampler)
    wall_before = 0.0
    if state:
        n_trials = state.n_trials
        wall_before = state.wall_so_far
        # until this run finishes, the time already spent stays on record (a kill loses nothing)
        state = dataclasses.replace(state, wall_s=None, stopped_reason=None, ended=None, wall_before_s=wall_before)
        tracker.reopen()
    else:
        state = SearchState(
            name=name,
            device=dataclasses.asdict(device),
            space=dataclasses.asdict(space),
            n_trials=n_trials,
            time_budget_s=search.time_budget_s,
            mlflow_uri=uri,
            mlflow_experiment=tracking.experiment,
            mlflow_parent_run_id=tracker.parent_run_id,
            optuna_study=name,
            started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            cache_key=remembered,
        )
    return Opened(tracker, paths, state, n_trials, storage_url, wall_before)
