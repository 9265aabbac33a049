"""What both backends run of the search loop (`autotune.execution.driver`): the strategy's proposals and what
became of them (`Proposer`), the live view's knobs of a running trial, and SIGTERM as Ctrl-C."""

from __future__ import annotations

import math
import os
import signal
import time
from typing import Callable

from autotune import knobs as K
from autotune.decide.stoppers import Flag
from autotune.decide.strategy import MAX_INCUMBENT_CI, Strategy, trial_attrs
from autotune.trial.result import TrialResult


class Proposer:
    """The strategy's face to a backend: `suggest(key)` is the strategy's next proposal as a trial config (an
    Optuna trial in the run dir's storage; None once nothing is left, which sets `exhausted`), `complete(key,
    result)` tells the strategy how it went (the runner's `TrialResult`, as the backend received it). The study
    holds all state. `watch(config)`: what the trial's watch holds it to as it starts (its first step, its
    steps, the budget's end: the driver's `autotune.decide.deadlines`), carried in its config as `watch`."""

    def __init__(
        self,
        strategy: Strategy,
        fixed: dict,
        prune_margin: float,
        fits: Callable[[dict], bool],
        exhausted: Flag,
        reads=None,
        *,
        watch: Callable[[dict], dict] | None = None,
    ):
        self.strategy, self.fixed, self.prune_margin, self.fits = strategy, fixed, prune_margin, fits
        self.exhausted, self.reads = exhausted, reads  # reads: the reference reads (execution.reads), or None
        self.watch = watch
        self.live: dict = {}  # the backend's key -> the Optuna trial

    def suggest(self, key) -> dict | None:
        if self.reads is not None:  # the reference read again here where it is due: trials run one at a time
            self.reads.before_trial()
        proposal = self.strategy.ask(self.fits)
        if proposal is None:
            self.exhausted.set = True  # every point measured, or known infeasible / over the budget
            return None
        self.live[key] = proposal.trial
        config = {
            **self.fixed,
            **proposal.params,
            "trial_number": proposal.trial.number,
            "source": proposal.source,
            **self.now(self.strategy.prune_below(self.prune_margin), self.strategy.incumbent_bar(proposal.params)),
            "predicted": proposal.predicted,
            "chosen_by": proposal.chosen_by,  # the measurement that chose it (autotune.decide.playbook's `by`)
        }
        return {**config, "watch": self.watch(config)} if self.watch else config

    def now(self, prune_below: float | None, bar: dict) -> dict:
        """The strategy's thresholds (its judge's figures: in the baseline trial's units at its own time) as a
        trial starting now reads them: scaled by the reference's level now over the baseline trial's, and the
        incumbent's CI widened by the drift since the reference's last read (`reference.Judge.now_scale`)."""
        scale, ci = self.strategy.judge.now_scale(time.time())
        above = bar.get("incumbent_above")
        return {
            "prune_below": prune_below * scale if prune_below else prune_below,
            **bar,
            "incumbent_above": above * scale if above else above,
            "incumbent_ci": min(math.hypot(bar.get("incumbent_ci") or 0.0, ci), MAX_INCUMBENT_CI),
        }

    def complete(self, key, result: TrialResult | None, error: bool = False) -> None:
        """`result`: None where nothing came back (a Ray trial that failed before it reported)."""
        if key not in self.live:
            return
        trial = self.live.pop(key)
        result = result or TrialResult(status="error")
        self.strategy.tell(
            trial,
            "error" if error else result.status,
            result.rate,  # in the unit its metrics say (trial.result.unit_of): tokens/s for a language model
            unit=result.unit.name if result.rate is not None else None,
            safe=result.parity is None or bool(result.parity.get("passed")),
            error=f"{result.error_type}: {result.error}" if result.error else None,
            diagnosis=result.diagnosis,  # every trial's: the strategy moves from each incumbent's own bottleneck
            attrs=trial_attrs(result, {**self.fixed, **self.strategy.baseline}),
        )


def knobs_of(config: dict) -> dict:
    """The built-in knobs of a trial config (what the live view shows of a running trial)."""
    return {k: config[k] for k in K.KNOBS}


def stop_on_sigterm() -> None:
    """SIGTERM stops a search the way Ctrl-C does: the running trial stops, everything finished is already
    written, `--resume` continues. (Ray: set after ray.init, whose core worker installs a handler of its own.)"""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _as_ctrl_c)


def _as_ctrl_c(*_) -> None:
    """SIGTERM as Ctrl-C: through Ctrl-C's own handler where there is one (Ray Tune's during its run ends it
    cleanly), else raised here. A search started in the background by a script inherits Ctrl-C ignored, and a
    SIGINT sent on was lost: the pairs ran on after the SIGTERM (a README walk)."""
    if callable(signal.getsignal(signal.SIGINT)):
        os.kill(os.getpid(), signal.SIGINT)
    else:
        raise KeyboardInterrupt
