"""The samplers a search can use, by name: one table (`SAMPLERS`), the only place that names a kind. Each is an
Optuna sampler that the strategy installs on its study and asks through `study.ask()`, as Optuna asks TPE:
- `autotune` (default): the climb (`autotune.decide.climb.Climb`): the moves a performance engineer makes by hand
  from the incumbent, starting with its own diagnosis's; where no move is left, TPE (multivariate, constant liar)
  explores, and any new incumbent it finds is climbed from in turn.
- `tpe`, `random`: Optuna's samplers.
- `grid`: every point, in order (`autotune.decide.naming.Grid`).
What every sampler shares (the baseline first, an interrupted trial again, the configs measured or infeasible
never run, the rate model's skip, the incumbent's bar) is the strategy's (`autotune.decide.strategy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from optuna.samplers import BaseSampler, RandomSampler, TPESampler

from autotune.decide.climb import Climb
from autotune.decide.naming import Grid, Known


@dataclass(frozen=True)
class Kind:
    """A row of the table: `make(known, seed)`, the sampler; `exhaustive`: it maps every point of the space once
    (the trial count is the space's at most, no patience stop, and the loader knobs get no probe limit)."""

    make: Callable[[Known, int], BaseSampler]
    exhaustive: bool = False
    combines_helped: bool = False
    """a config it draws combines only knobs that each helped alone, unless the rate model predicts a gain
    (autotune.decide.strategy.skip_combination): the hand-tuner's rule, not a generic sampler's"""
    eager_first: bool = False
    """a config it draws compiled, on a graph the search never compiled, runs as its eager twin first where that
    was never measured (`autotune.decide.strategy.Strategy.eager_twin`): the climb's rule for a compiled
    incumbent's moves (`autotune.decide.climb.Climb._eager_first`), for its explorer's draws"""


def _climb(known: Known, seed: int) -> BaseSampler:
    # TPE explores where the climb has no move: multivariate, since knobs interact (workers x batch); constant liar,
    # running trials count as bad guesses, so parallel trials spread out
    return Climb(known, explore=TPESampler(seed=seed, multivariate=True, constant_liar=True))


SAMPLERS: dict[str, Kind] = {
    "autotune": Kind(_climb, combines_helped=True, eager_first=True),
    "tpe": Kind(lambda known, seed: TPESampler(seed=seed, multivariate=False, constant_liar=True)),
    "random": Kind(lambda known, seed: RandomSampler(seed=seed)),
    "grid": Kind(Grid, exhaustive=True),
}


def kind(name: str) -> Kind:
    """The table's row for `name` (a ValueError naming the choices where there is none)."""
    if name not in SAMPLERS:
        raise ValueError(f"sampler {name!r}; allowed: {', '.join(SAMPLERS)}")
    return SAMPLERS[name]
