"""One trial run where this code runs (the driver's host for the local backend, a Ray worker's node for the Ray
backend): the request for a config (the one request builder, `TrialSettings`), a fresh process (or ranks spread
over nodes), the search's first incumbent (its anchor) read twice, a multi-rank search's one-rank reference, the
playbook's advice on the trial's diagnosis. The same
for every backend; what a backend adds is where this runs."""

from __future__ import annotations

from pathlib import Path

from autotune.execution.launcher import Launch, run_in_process
from autotune.execution.settings import RunSettings
from autotune.execution.spread import run_spread, spreads
from autotune.execution.watch import Limits
from autotune.records.scaling import with_reference
from autotune.decide.confirm import reread_anchor
from autotune.decide.playbook import advise
from autotune.trial.request import PerTrial
from autotune.trial.result import TrialResult, failed


def run_trial_in(config: dict, settings: RunSettings, trial_dir: Path) -> TrialResult:
    """The trial config for this search config (the one request builder), run in a fresh process."""
    request = settings.request.config(config, PerTrial.of(config))

    def run(request: dict, trial_dir: Path) -> TrialResult:
        return run_in_process(
            request,
            trial_dir,
            settings.timeout_s,
            settings.user_path,
            settings.thread_env,
            launch=Launch(shared=settings.fork_socket, compile_cache=settings.compile_cache),
            limits=Limits(settings.first_step_s),  # a program's first step in time
        )

    spread = spreads(settings.rank_placement, request.get("ranks", 1))  # one rank per node
    result = run_spread(request, settings, trial_dir) if spread else run(request, trial_dir)
    if config.get("anchor") and not spread:  # the search's first incumbent: read twice
        result = reread_anchor(
            result, settings.request.timed_only().config(config, PerTrial(anchor=True)), run, trial_dir
        )
    if config.get("source") == "baseline":  # a multi-rank search's one-rank reference (autotune.records.scaling)
        # one thread a rank where the ranks shared a node and the user set none (autotune.trial.ranks)
        threads = None if spread or (settings.thread_env or {}).get("OMP_NUM_THREADS") else 1
        result = with_reference(result, request, run, trial_dir, threads)
    result.chosen_by = config.get("chosen_by")  # what chose it (the proposal's): the search's word, not the trial's
    return advised(result, trial_dir)


def advised(result: TrialResult, trial_dir: Path) -> TrialResult:
    """The trial's diagnosis with the playbook's moves and advice (`autotune.decide.playbook.advise`), and what
    chose it, in the result and in its result.json, before the search and the records read either."""
    if result.diagnosis is not None and "moves" not in result.diagnosis and result.knobs is not None:
        result.diagnosis = advise(result.diagnosis, result.knobs)
    elif not result.chosen_by:
        return result
    path = Path(trial_dir) / "result.json"
    if path.exists():
        written = TrialResult.read(path)
        written.diagnosis, written.chosen_by = result.diagnosis, result.chosen_by
        written.write(path)
    return result


def run_trial(config: dict, settings: RunSettings, trial_dir: Path) -> TrialResult:
    """`run_trial_in`, never raising: whatever goes wrong is the trial's error."""
    try:
        return run_trial_in(config, settings, trial_dir)
    except Exception as e:
        return failed("error", type(e).__name__, str(e), trial_wall_s=0.0)


def reader(settings: RunSettings, target_ci: float):
    """`read(knobs, label, trial_dir) -> TrialResult`: a reference read here, between trials
    (`autotune.execution.reads`): a timed window of `knobs` alone in a fresh process (through the search's fork
    server where it has one), its window's mean to `target_ci`."""
    again = settings.again(target_ci=target_ci)
    return lambda knobs, label, trial_dir: run_trial(knobs, again, trial_dir)
