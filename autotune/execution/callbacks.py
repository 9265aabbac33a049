"""What a search tells the one watching it, as it goes (Ray Tune's `tune.Callback`, in a list): `SearchCallback`,
every hook a no-op, overridden by the ones that listen (the CLI's live view, a notebook's progress); `Callbacks`
hands each hook on to a list of them, in order. A callback's hook never decides anything of the search."""

from __future__ import annotations

from typing import Any, Iterable


class SearchCallback:
    """Override the hooks you need; each is called at most where the search reaches it."""

    def on_match(self, line: str) -> None:
        """A finished search of the same question on this machine (autotune.records.cache), before the trials."""

    def on_probe(self, running: bool, first_step_limit_s: float | None) -> None:
        """A program's probe (autotune.execution.program) starts (True) and ends (False)."""

    def on_wait(self, why: str) -> None:
        """The search waits for another one measuring on the same device."""

    def on_start(self, device, space, run_dir, n_trials: int, budget_s: float | None) -> None:
        """The trials start: the device and space as resolved, where the run goes, what ends it."""

    def on_trial_start(self, number: int, knobs: dict[str, Any]) -> None:
        """A trial starts running."""

    def on_trial(self, record) -> None:
        """A trial finished and is recorded (an earlier run's too, when a search resumes)."""

    def on_remeasure(self, note: str) -> None:
        """A line of the late checks and the re-measurement after the trials."""


def _to_each(name: str):
    def hook(self, *args):
        for callback in self.callbacks:
            getattr(callback, name)(*args)

    hook.__name__ = name
    return hook


class Callbacks(SearchCallback):
    """Every hook handed on to each of `callbacks`, in order."""

    def __init__(self, callbacks: Iterable[SearchCallback] = ()):
        self.callbacks = list(callbacks)

    on_match, on_probe, on_wait = _to_each("on_match"), _to_each("on_probe"), _to_each("on_wait")
    on_start, on_trial_start, on_trial = _to_each("on_start"), _to_each("on_trial_start"), _to_each("on_trial")
    on_remeasure = _to_each("on_remeasure")


class Printing(SearchCallback):
    """The default where none is given (`autotune.search` from Python): the line naming a matching earlier search
    printed."""

    def on_match(self, line: str) -> None:
        print(line)
