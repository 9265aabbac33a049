"""Where a search's trials run: the backend object `autotune.execution.driver` is given. The driver's loop is
one (strategy, recorder, stoppers); a backend only starts what it needs, finds the device, runs the trials it
is handed and the late re-measurements:

- `local` (`autotune.execution.local`): one trial at a time, on this host, each in a fresh process; needs
  neither Ray nor MLflow (the GPU hosts);
- `ray` (`autotune.execution.raytune`): Ray Tune places trials on this host or a cluster's nodes.

`choose` picks one for a spec: the one asked for, else Ray where it is installed. What the spec asks of the host
and the host lacks (a cluster without Ray, an MLflow server without MLflow) is the user's to fix: one line
(`SpecError`), never a quiet fallback.

Also here, what both backends share: `Proposer`, the strategy's face to a backend (each suggestion a trial config,
each finished trial told back), and `stop_on_sigterm`.
"""

from __future__ import annotations

import os
import signal
from typing import Callable

from autotune import knobs as K
from autotune._imports import installed
from autotune.execution.spread import spreads
from autotune.records.run_dir import METRIC, received
from autotune.decide.stoppers import Flag
from autotune.decide.strategy import Strategy, told
from autotune.spec import Spec, SpecError

BACKENDS = ("auto", "local", "ray")


def choose(spec: Spec, name: str = "auto"):
    """The backend `name` asks for (`auto`: Ray where it is installed, else local), checked against what the spec
    asks of the host."""
    if name not in BACKENDS:
        raise SpecError(f"backend `{name}` is not one of: {', '.join(BACKENDS)}")
    if spec.tracking.uri and not installed("mlflow"):
        raise SpecError(f"tracking.uri: `{spec.tracking.uri}` needs MLflow, which is not installed here "
                        "(pip install mlflow); leave tracking.uri out to keep the search's records in its run dir")
    has_ray = installed("ray")
    if name == "ray" or (name == "auto" and has_ray):
        if not has_ray:
            raise SpecError("backend `ray`: Ray is not installed here (pip install 'ray[tune]'); "
                            "`--backend local` runs the trials on this host")
        from autotune.execution.raytune import RayBackend

        return RayBackend()
    resources = spec.resources
    if resources.ray_address:
        raise SpecError(f"resources.ray_address: `{resources.ray_address}` is a Ray cluster, and "
                        + ("this search runs on this host (`--backend local`)" if has_ray else
                           "Ray is not installed here (pip install 'ray[tune]')") + "; leave it out to search here")
    if spreads(resources.rank_placement, resources.ranks_per_trial):
        raise SpecError("resources.rank_placement: spread puts ranks on a cluster's nodes, which needs Ray; "
                        "use pack (one node) here, or search with Ray on the cluster")
    from autotune.execution.local import LocalBackend

    return LocalBackend()


class Proposer:
    """The strategy's face to a backend: `suggest(key)` is the strategy's next proposal as a trial config (an
    Optuna trial in the run dir's storage; None once nothing is left, which sets `exhausted`), `complete(key,
    carried)` tells the strategy how it went (`records.transport`'s form). The study holds all state."""

    def __init__(self, strategy: Strategy, fixed: dict, prune_margin: float, fits: Callable[[dict], bool],
                 exhausted: Flag):
        self.strategy, self.fixed, self.prune_margin, self.fits = strategy, fixed, prune_margin, fits
        self.exhausted = exhausted
        self.live: dict = {}  # the backend's key -> the Optuna trial

    def suggest(self, key) -> dict | None:
        proposal = self.strategy.ask(self.fits)
        if proposal is None:
            self.exhausted.set = True  # every point measured, or known infeasible / over the budget
            return None
        self.live[key] = proposal.trial
        return {**self.fixed, **proposal.params, "trial_number": proposal.trial.number, "source": proposal.source,
                "prune_below": self.strategy.prune_below(self.prune_margin),
                **self.strategy.incumbent_bar(proposal.params), "predicted": proposal.predicted}

    def complete(self, key, carried: dict | None, error: bool = False) -> None:
        if key not in self.live:
            return
        trial = self.live.pop(key)
        result = received(carried)  # the runner's result (records.transport)
        self.strategy.tell(
            trial, "error" if error else result.status, result.metric(METRIC),
            safe=result.parity is None or bool(result.parity.get("passed")),
            error=f"{result.error_type}: {result.error}" if result.error else None,
            diagnosis=result.diagnosis,  # every trial's: the strategy moves from each incumbent's own bottleneck
            attrs=told(result, {**self.fixed, **self.strategy.baseline}),
        )


def knobs_of(config: dict) -> dict:
    """The built-in knobs of a trial config (what the live view shows of a running trial)."""
    return {k: config[k] for k in K.KNOBS}


def stop_on_sigterm() -> None:
    """SIGTERM stops a search the way Ctrl-C does: the running trial stops, everything finished is already
    written, `--resume` continues. (Ray: set after ray.init, whose core worker installs a handler of its own.)"""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGINT))
