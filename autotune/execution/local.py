"""The local backend: a search's trials one at a time on this host, each in a fresh process (through the
search's shared fork server), with neither Ray nor MLflow (`--backend local`; automatic where Ray is not
installed). The driver gives it the same strategy (`Proposer`), recorder and stoppers as the Ray backend
(`autotune.execution.protocol.TrialRun`); it implements `protocol.Backend`."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from autotune import knobs as K
from autotune.execution.proposer import knobs_of, stop_on_sigterm
from autotune.execution.protocol import TrialRun
from autotune.execution.settings import RunSettings
from autotune.execution.trials import reader, run_trial
from autotune.records.run_dir import trial_dir_of
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

    def placed(self, settings: RunSettings) -> RunSettings:
        return settings  # every trial runs here: nothing to add

    def reader(self, settings: RunSettings, *, cuda: bool, target_ci: float):
        """The reference reads (`autotune.execution.reads`): here, between trials, which run one at a time."""
        return reader(settings, target_ci)

    def run_trials(self, run: TrialRun) -> None:
        """Trials until a stopper says stop (the trial count and the budget among them), one at a time, here;
        Ctrl-C ends the running trial and sets `run.interrupted`."""
        try:
            while not run.stop.stop():
                config = run.proposer.suggest(None)
                if config is None:
                    return
                number = config["trial_number"]
                run.on_trial_start(number, knobs_of(config))
                trial_dir = trial_dir_of(run.settings.run_dir, number)
                started = time.time()
                result = run_trial(config, run.settings, trial_dir)
                launch = {"started_unix": started, "ended_unix": time.time()}
                # the study first: a stop in between leaves a trial Optuna saw finish, which a resume records
                # from its result.json (`records.recorder.reconcile`); the other way round it would run again
                run.proposer.complete(None, result)
                run.recorder.add(config, result, trial_dir=trial_dir, launch=launch)
        except KeyboardInterrupt:
            run.interrupted.set = True

    @contextlib.contextmanager
    def remeasurers(self, settings: RunSettings):
        """`runner(resources, parity_only=False, target_ci=None, noise=None)` -> `run(knobs, label) ->
        TrialResult`: the late checks and re-measurements, here, one at a time (`RunSettings.again`); a trial's
        resources place nothing here."""

        def runner(resources: dict, parity_only: bool = False, target_ci: float | None = None, noise=None):
            again = settings.again(parity_only=parity_only, target_ci=target_ci, noise=noise)
            return lambda knobs, label: run_trial(knobs, again, Path(settings.run_dir) / "confirm" / label)

        yield runner

    def close(self, started: bool) -> None:
        pass
