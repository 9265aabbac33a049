"""A finished search's claim re-measured later (`autotune confirm RUN_DIR`, issue 64): the pairs alone, the best the
search re-measured against its baseline, side by side in fresh processes as the search's own re-measurement runs
them (autotune.decide.confirm: windows sized by the gap, checked against the search's reads of the baseline and
taken again, spaced, where they disagree), on this host, holding the device (never beside a search: it waits
for one that measures, as a search does). The new
re-measurement replaces the search's (search.json keeps the old in `confirm_history`); best_config.yaml is written
again from the run dir as the search wrote it, and MLflow's answer told again, so every reader says the new claim.

What it needs of the search is in its run dir: its spec (spec.yaml, the output dir this one), its space and device
(search.json), its trials and reads (trials.csv), a factory given in Python (workload.pkl)."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from autotune import workload as W
from autotune.decide.confirm import SearchReads, confirm_best, window_ci
from autotune.execution.launcher import user_thread_env
from autotune.execution.local import LocalBackend
from autotune.execution.lock import device_lock
from autotune.execution.settings import RunSettings
from autotune.records.run_dir import SearchResult, read_run
from autotune.records.trial_record import TrialRecord
from autotune.records.state import SearchState
from autotune.spec import SpecError, load
from autotune.plan import SearchPlan

DEFAULT_ROUNDS = 3  # where the search itself asked for fewer (or none)


@dataclasses.dataclass(frozen=True)
class Reconfirmed:
    """The run dir before and after: its result as read back (`records.SearchResult`), best_config.yaml's content
    (None where none was written), and the trial re-measured."""

    before: SearchResult
    after: SearchResult
    before_config: dict | None
    after_config: dict | None
    trial: int


def candidate(result: SearchResult, state: SearchState) -> TrialRecord:
    """The config to re-measure against the baseline: the one the search's re-measurement compared last (the best
    it kept, or the one a tie handed back to the baseline), else its best, else the faster config whose window tied
    with the baseline (the tie went to the baseline: a quiet host may settle it; its loss parity checked where its
    knobs need it, as an export does); a SpecError where there is none."""
    from autotune.safety.parity import needs_parity

    named = (state.confirm or {}).get("best_trial")
    best = next((r for r in result.records if r.number == named), None) if named is not None else result.best
    base = result.baseline
    if result.stopped_reason or not (base and base.throughput):
        why = result.stopped_reason or "its baseline was not measured"
        raise SpecError(f"`{result.run_dir}` is not a finished search ({why}); nothing to re-measure")
    tied = (base.tie or {}).get("faster_trial") if best is base else None
    if tied is not None:
        best = next((r for r in result.records if r.number == tied), None)
        if best is not None and needs_parity(best.knobs, base.knobs) and not (best.parity or {}).get("passed"):
            raise SpecError(
                f"`{result.run_dir}`: the baseline won a tie with trial #{tied}, whose loss parity was not checked "
                "(its knobs change the numerics): a new search on a quiet host settles it"
            )
    if best is None or best is base or not best.throughput:
        raise SpecError(f"`{result.run_dir}`: no config measured faster than its baseline; nothing to re-measure")
    return best


def settings_of(run_dir: Path, result: SearchResult) -> tuple[SearchPlan, RunSettings]:
    """The search's plan (its spec.yaml, this run dir its output dir) and its trials' settings, as its driver made
    them (autotune.execution.driver.Search._settings), the re-measurement's windows to come."""
    spec = load(run_dir / "spec.yaml")
    spec.output_dir = run_dir
    plan = SearchPlan.of(spec)
    pickle = run_dir / W.PICKLE_FILE
    pickled = pickle.read_bytes() if pickle.exists() else None
    request = plan.trial_settings(result.device.type, result.space.baseline, pickled=pickled)
    settings = RunSettings(
        request=request,
        timeout_s=plan.trial.timeout_s,
        first_step_s=plan.trial.first_step_s,
        run_dir=str(run_dir),
        user_path=W.importable_paths(),
        thread_env=user_thread_env(),
        workload_pickle=pickled,
        rank_placement=plan.resources.rank_placement,
    )
    return plan, settings


def reconfirm(run_dir: Path, rounds: int | None = None, announce: Callable[[str], None] | None = None) -> Reconfirmed:
    """Re-measure `run_dir`'s claim (see the module doc): `rounds` pairs (default: the search's confirm_rounds, at
    least DEFAULT_ROUNDS); `announce` hears what it does. The run dir's records are rewritten once the pairs are
    in; a SpecError (one line for the user) where the run dir cannot be re-measured."""
    from autotune.export import best_config as export
    from autotune.export import load as best_config

    run_dir = Path(run_dir).resolve()
    before, state = read_run(run_dir), SearchState.read(run_dir)
    best = candidate(before, state)
    plan, settings = settings_of(run_dir, before)
    base, n = before.baseline, rounds or max(plan.search.confirm_rounds, DEFAULT_ROUNDS)
    done = len(state.confirm_history or []) + 1  # this run dir's re-measurements so far: labels of their own
    against = SearchReads.of(base, before.reads, before.device.type, plan.search.confirm_spacing_s)
    path = before.best_config_path
    before_config = best_config.read(path) if path else None
    with device_lock(before.device.type, run_dir, announce), LocalBackend().remeasurers(settings) as runner:
        run = runner({}, target_ci=window_ci(base, best, plan.trial.target_ci))
        confirm = confirm_best(
            lambda knobs, label: run(knobs, f"confirm{done}-{label}"), base, best, n, announce, against=against
        )
    replaced = {**(state.confirm or {}), "replaced": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    state.confirm_history = [*(state.confirm_history or []), replaced]
    state.confirm = confirm
    state.write(run_dir)
    after = read_run(run_dir)
    export.write_best_config(after, run_dir / "best_config.yaml", export.ExportSettings.of(plan), program=state.program)
    _tell(after, state, plan)
    return Reconfirmed(before, after, before_config, best_config.read(after.best_config_path), best.number)


def _tell(result: SearchResult, state: SearchState, plan: SearchPlan) -> None:
    """MLflow's answer told again (the parent run's description, the re-measured trial's row), where the search
    has an MLflow store."""
    from autotune._imports import installed

    uri = state.mlflow_uri
    if uri and uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_relative_to(result.run_dir):
        moved = result.run_dir / "mlflow.db"  # a run dir copied or moved with its store: its own, never the old one
        uri = f"sqlite:///{moved}" if moved.exists() else None
    if uri and uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        uri = None  # a run dir kept without its store (copied without it): nothing to tell, no new store made
    if not (uri and state.mlflow_parent_run_id and installed("mlflow")):
        return
    from autotune.integrations import tracking

    tracker = tracking.Tracker(
        uri,
        state.mlflow_experiment,
        result.run_dir,
        state.name,
        parent_run_id=state.mlflow_parent_run_id,
        user_knobs=plan.user_knobs,
    )
    tracker.log_metrics(state.mlflow_parent_run_id, result.claim_metrics)
    tracker.tag_search({"claim": (result.confirm or {}).get("verdict") or "none"})
    tracker.tell(result)
