"""What a backend is (`Backend`, the protocol `local` and `ray` implement: autotune.execution.local,
autotune.execution.raytune) and what it is handed to run a search's trials (`TrialRun`). The search's loop is one
(strategy, recorder, stoppers: autotune.execution.driver); a backend only starts what it needs, finds the device,
places the trials it is handed and the late re-measurements. Which one a search gets: autotune.execution.backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ContextManager, Protocol

from autotune import knobs as K
from autotune.decide.stoppers import Flag, Stopper
from autotune.execution.settings import RunSettings
from autotune.spec import Resources


@dataclass
class TrialRun:
    """A search's trials, as the driver hands them to its backend."""

    proposer: object
    """The strategy's side (autotune.execution.proposer.Proposer): the next config, and each one's end."""
    recorder: object
    """Each finished trial written everywhere (autotune.records.recorder.Recorder)."""
    stop: Stopper
    """Says when the trials end (the trial count and the time budget among its stoppers)."""
    interrupted: Flag
    """Set where Ctrl-C or SIGTERM ended them."""
    settings: RunSettings
    """What every trial runs with."""
    reserve: Callable[[dict], dict]
    """A config's resources to place its trial by (its CPUs, GPUs and custom resources)."""
    remaining: int
    """Trials left to run (a resumed search ran some)."""
    resources: Resources
    """The spec's resources (ranks and their placement, a cluster's address)."""
    time_budget_s: float | None
    """The search's time budget (its stoppers' and each trial's watch's: no backend ends a running trial at it)."""
    cuda: bool
    """Trials on CUDA devices (placed side by side); on a CPU host one at a time."""
    on_trial_start: Callable[[int, dict], None]
    """Told as each trial starts (the live view's row for the running trial)."""


class Backend(Protocol):
    """Where a search's trials run."""

    name: str

    def start(self, resources: Resources) -> bool:
        """Start what the trials need (Ray); whether anything was started that `close` must stop."""

    def close(self, started: bool) -> None:
        """Stop what `start` started."""

    def shares_forks(self, resources: Resources) -> bool:
        """Whether every trial runs on this host, forked from one warm fork server."""

    def detect_device(self, resources: Resources) -> K.Device:
        """The device the trials run on."""

    def placed(self, settings: RunSettings) -> RunSettings:
        """The trials' settings with what this backend adds (the driver's node)."""

    def reader(self, settings: RunSettings, *, cuda: bool, target_ci: float):
        """`read(knobs, label, trial_dir)` for the reference reads between trials, or None where none fit."""

    def run_trials(self, run: TrialRun) -> None:
        """The trials, until `run.stop` says stop; Ctrl-C sets `run.interrupted`."""

    def remeasurers(self, settings: RunSettings) -> ContextManager:
        """`runner(resources, parity_only=False, target_ci=None, noise=None)` -> `run(knobs, label) -> TrialResult`:
        the late checks and the re-measurements."""
