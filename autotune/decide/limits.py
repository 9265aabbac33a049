"""What may run now, the same for every sampler (`Limits`, made by the strategy before each ask): not a config
measured, running or queued (`taken`); not a batch at or above one that ran out of memory with the same
device-side knobs (the memory ladder, `MemoryLadder`); not a value a hang ruled out (`hung_trials`: loader workers
after a worker never returned a batch, a parallel setting after a rank stopped; autotune.trial.hung); not a loader
setting past its probe (`loader_held`); and what the time budget still affords (`fits`,
`autotune.decide.budget.budget_fits`). Functions of the study's trials (a resumed search's too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from optuna.trial import FrozenTrial, TrialState

from autotune.knobs import KNOBS
from autotune.trial.hung import Hung, ruled_out

# knobs that only change the host side: they never change device memory
HOST_KNOBS = tuple(n for n, k in KNOBS.items() if k.host_only)
# knobs of the loader alone (not the batch): what a diagnosis measures apart does not depend on them (diagnose.APART)
LOADER_KNOBS = tuple(n for n, k in KNOBS.items() if k.stage == "loader" and n != "batch_size")
# the baseline waits on data less than this share of its window: the loader is no bottleneck, and its knobs get one
# probe (the profiler plugin's rule, DataLoader time above 5% of the step -> more workers: docs/design.md)
DATA_WAIT_FLOOR = 0.05


def graph_of(knobs: dict) -> tuple:
    """What a compiled graph depends on: every knob but the loader's (workers, pinning, prefetch, persistence
    change no graph), so two configs of one graph share the search's compile cache (a repeat is a cache hit)."""
    return tuple(sorted((k, str(v)) for k, v in knobs.items() if k not in LOADER_KNOBS))


def key(params: dict, names) -> tuple:
    return tuple(params[n] for n in names)


def counts(t: FrozenTrial, names: list[str]) -> bool:
    """A trial of this space that ran, runs, or was told (not one cut short by an interruption)."""
    return len(t.params) == len(names) and not t.user_attrs.get("interrupted")


def taken(trials: list[FrozenTrial], names: list[str]) -> set[tuple]:
    """Configs measured, running, or queued: never proposed again."""
    return {key(t.params, names) for t in trials if counts(t, names) and t.state != TrialState.WAITING}


class MemoryLadder:
    """The memory ladder: device-side knobs (all but batch size and the host knobs) -> the smallest batch size
    that ran out of memory with them (`bounds`); a batch at or above it is predicted to run out too."""

    def __init__(self, trials: list[FrozenTrial], names: list[str]):
        self.names = names
        self.bounds: dict[tuple, int] = {}
        if "batch_size" not in names:
            return
        for t in trials:
            if t.user_attrs.get("status") == "oom" and not t.user_attrs.get("virtual"):
                k = self._key(t.params)
                self.bounds[k] = min(self.bounds.get(k, t.params["batch_size"]), t.params["batch_size"])

    def _key(self, params: dict) -> tuple:
        return tuple(params[n] for n in self.names if n not in HOST_KNOBS and n != "batch_size")

    def predicted_oom(self, params: dict) -> int | None:
        """The batch size that ran out of memory at or below `params`' with its device-side knobs, or None."""
        bound = self.bounds.get(self._key(params)) if "batch_size" in params else None
        return bound if bound is not None and params["batch_size"] >= bound else None


def hung_trials(trials: list[FrozenTrial], baseline: dict) -> list[Hung]:
    """The study's hung trials (status `hung`, with their hang's kind: `Strategy.tell`'s attrs), each with what
    it rules out."""
    found = (
        Hung.of(t.number, t.user_attrs.get("hung"), t.params, baseline)
        for t in trials
        if t.user_attrs.get("status") == "hung" and not t.user_attrs.get("virtual")
    )
    return [h for h in found if h is not None]


def loader_held(real: list[FrozenTrial], names: list[str], loader: list[str], baseline: dict) -> set[tuple] | None:
    """The loader settings (of `loader`, the loader knobs the spec did not list) left to run, or None: all. Where
    the baseline waited on data under DATA_WAIT_FLOOR of its window, once one trial has probed other loader
    settings, only those measured (or running) so far: the search builds on the probe where it gained, and spends
    no more trials on a loader that is not the bottleneck. `real`: the study's trials that ran (not virtual)."""
    if not loader:
        return None
    real = [t for t in real if counts(t, names)]
    base = next((t for t in real if key(t.params, names) == key(baseline, names)), None)
    wait = base.user_attrs.get("data_wait") if base else None
    seen = {key(t.params, loader) for t in real}
    return seen if wait is not None and wait < DATA_WAIT_FLOOR and len(seen) > 1 else None


@dataclass
class Limits:
    """What may run now: `free(p)`, p may run (not taken, not infeasible); `infeasible(p)`, it never will
    (predicted OOM, ruled out by a hang, over the time budget or in conflict, past the loader's probe)."""

    names: list[str]
    loader: list[str]
    taken: set[tuple]
    ladder: MemoryLadder
    held: set[tuple] | None
    fits: Callable[[dict], bool]
    hung: list[Hung] = field(default_factory=list)

    def infeasible(self, p: dict) -> bool:
        return (
            bool(self.ladder.predicted_oom(p))
            or ruled_out(self.hung, p) is not None
            or not self.fits(p)
            or self.past_probe(p)
        )

    def past_probe(self, p: dict) -> bool:
        return self.held is not None and key(p, self.loader) not in self.held

    def free(self, p: dict) -> bool:
        return key(p, self.names) not in self.taken and not self.infeasible(p)

    def why_not(self, p: dict, known: Any) -> str:
        """Why a drawn point does not run (`known`: the trial that measured it, or None): the virtual trial's error."""
        oom = self.ladder.predicted_oom(p)
        if known is not None or key(p, self.names) in self.taken:
            return "repeat of a failed or running trial"
        if oom:
            return f"predicted OOM: batch_size >= {oom} ran out of memory"
        hang = ruled_out(self.hung, p)
        if hang:
            return f"ruled out by a hang: {hang.describe()}"
        if self.past_probe(p):
            return f"the loader had its probe: the baseline waits on data under {DATA_WAIT_FLOOR:.0%}"
        return "cannot run: knobs in conflict, or over the time budget"
