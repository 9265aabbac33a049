"""The local backend: a search's trials one at a time on this host, each in a fresh process (through the
search's shared fork server), with neither Ray nor MLflow (`--backend local`; automatic where Ray is not
installed). The driver gives it the same strategy (`Proposer`), recorder and stoppers as the Ray backend."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from autotune import knobs as K
from autotune.execution.loop import Proposer, knobs_of, stop_on_sigterm
from autotune.execution.trials import reader, remeasure_settings, run_trial
from autotune.records.run_dir import trial_dir_of
from autotune.decide.stoppers import Flag, Stopper
from autotune.spec import Resources


class LocalBackend:
    name = "local"

    def shares_forks(self, resources: Resources) -> bool:
        return True  # every trial runs here: one fork server for them all

    def start(self, resources: Resources) -> bool:
        stop_on_sigterm()
        return False  # nothing started that the search must stop

    def detect_device(self, resources: Resources) -> K.Device:
        from autotune.trial.runner import detect_device

        return detect_device(resources.device)

    def trial_settings(self) -> dict:
        return {}

    def reader(self, settings: dict, *, cuda: bool, target_ci: float):
        """The reference reads (`autotune.execution.reads`): here, between trials, which run one at a time."""
        return reader(settings, target_ci)

    def run_trials(
        self,
        proposer: Proposer,
        recorder,
        stop: Stopper,
        interrupted: Flag,
        *,
        settings: dict,
        reserve,
        remaining: int,
        resources: Resources,
        time_budget_s: float | None,
        cuda: bool,
    ) -> None:
        """Trials until a stopper says stop (the trial count and the budget among them); Ctrl-C ends the running
        trial and sets `interrupted`. One at a time, here: `reserve` (a config's Ray resources), `resources`,
        `time_budget_s` and `cuda` are the Ray backend's to place trials by."""
        try:
            while not stop.stop():
                config = proposer.suggest(None)
                if config is None:
                    return
                number = config["trial_number"]
                if recorder.on_trial_start:  # the live view's row for the running trial
                    recorder.on_trial_start(number, knobs_of(config))
                trial_dir = trial_dir_of(settings["run_dir"], number)
                started = time.time()
                result = run_trial(config, settings, trial_dir)
                launch = {"started_unix": started, "ended_unix": time.time()}
                # the study first: a stop in between leaves a trial Optuna saw finish, which a resume records
                # from its result.json (`records.recorder.reconcile`); the other way round it would run again
                proposer.complete(None, result)
                recorder.add(config, result, trial_dir=trial_dir, launch=launch)
        except KeyboardInterrupt:
            interrupted.set = True

    @contextlib.contextmanager
    def remeasurers(self, settings: dict):
        """`runner(resources, parity_only=False, target_ci=None, noise=None)` -> `run(knobs, label) ->
        TrialResult`: the late checks and re-measurements, here, one at a time (`trials.remeasure_settings`)."""

        def runner(resources: dict, parity_only: bool = False, target_ci: float | None = None, noise=None):
            again = remeasure_settings(settings, parity_only, target_ci, noise)
            return lambda knobs, label: run_trial(knobs, again, Path(settings["run_dir"]) / "confirm" / label)

        yield runner

    def close(self, started: bool) -> None:
        pass
