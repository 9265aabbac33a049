"""The samplers that name whole configs from what the search knows, rather than draw them: their base (`Naming`,
an Optuna sampler over another that draws what it does not name), what they read of the search (`Known`), and the
grid (`Grid`). The climb (`autotune.decide.climb.Climb`) is the other.
"""

from __future__ import annotations

import itertools
from typing import Any, Protocol

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial

from autotune.knobs import UserKnobs


class Limits(Protocol):
    """What may run now (`autotune.decide.limits.Limits`)."""

    def free(self, point: dict) -> bool: ...

    def infeasible(self, point: dict) -> bool: ...


class Known(Protocol):
    """What a sampler that names configs reads of the search (`autotune.decide.strategy.Strategy`)."""

    search: dict[str, list]  # the knobs searched -> their values
    baseline: dict[str, Any]
    min_improvement: float
    cuda: bool
    user_knobs: UserKnobs  # the search's (autotune.plan.SearchPlan.user_knobs): the playbook's moves for them
    limits: Limits  # what may run now: set by the strategy before it asks the study

    def measured(self) -> dict[tuple, float | None]: ...

    def diagnosis_of(self, point: dict) -> dict | None: ...

    def fastest_first(self, points: list[dict], above: float, priors: dict | None = None) -> dict: ...

    def helped(self) -> set[tuple[str, Any]]: ...

    def counted(self) -> set[str]: ...

    def named(self, number: int, source: str) -> None:
        """Trial `number`'s config was named by a sampler whose `source` is this (plan, grid)."""


def space(search: dict[str, list]):
    """Every point of the space, in order (the knobs' order, then their values')."""
    return (dict(zip(search, values)) for values in itertools.product(*search.values()))


class Naming(BaseSampler):
    """A sampler that names a whole config for a trial (`name`; None: it has none now, and `draw`, an Optuna
    sampler, draws the trial), as `optuna.samplers.PartialFixedSampler` fixes some parameters over a base sampler.
    The config is named once per trial, when its parameters are first asked for (an enqueued trial's are fixed:
    never asked), and the search is told so (`Known.named`, with the sampler's `source`)."""

    source = "named"

    def __init__(self, known: Known, draw: BaseSampler):
        self.known, self.draw = known, draw
        self.named: dict[int, dict] = {}  # trial number -> the config named for it

    def name(self, study: optuna.Study) -> dict | None:
        raise NotImplementedError

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        point = self.name(study)
        if point is None:
            return self.draw.infer_relative_search_space(study, trial)
        self.named[trial.number] = point
        self.known.named(trial.number, self.source)
        return {}  # every parameter from `sample_independent`: the named config's

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {} if trial.number in self.named else self.draw.sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        point = self.named.get(trial.number)
        if point is not None:
            return point[param_name]
        return self.draw.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.draw.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state, values) -> None:
        self.named.pop(trial.number, None)
        self.draw.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.draw.reseed_rng()


class Grid(Naming):
    """Every point of the space once, in order (`space`), the first that may run now (`Known.limits`). Unlike
    `optuna.samplers.GridSampler` (a random order), a grid search maps a landscape in a fixed order."""

    source = "grid"

    def __init__(self, known: Known, seed: int):
        super().__init__(known, RandomSampler(seed=seed))  # never draws: the strategy asks only while a point is free

    def name(self, study: optuna.Study) -> dict | None:
        return next((p for p in space(self.known.search) if self.known.limits.free(p)), None)
