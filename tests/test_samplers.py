"""The samplers' table, and the climb and the grid as Optuna samplers asked through a real study."""

import itertools
import warnings

import optuna
import pytest
from optuna.samplers import BaseSampler, RandomSampler, TPESampler

from autotune.decide.climb import Climb
from autotune.decide.naming import Grid
from autotune.decide.samplers import SAMPLERS, kind
from autotune.decide.strategy import Strategy

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.ERROR)

SPACE = {"num_workers": [0, 2, 4], "batch_size": [32, 64]}
BASE = {"num_workers": 0, "batch_size": 32}


def test_each_row_of_the_table_is_an_optuna_sampler_the_strategy_installs_on_its_study():
    made = {}
    for name in SAMPLERS:
        study = optuna.create_study(direction="maximize")
        strategy = Strategy(study, SPACE, BASE, name, seed=3)
        assert isinstance(study.sampler, BaseSampler) and study.sampler is strategy.sampler
        made[name] = type(study.sampler)
    assert made == {"autotune": Climb, "tpe": TPESampler, "random": RandomSampler, "grid": Grid}
    assert [n for n, row in SAMPLERS.items() if row.exhaustive] == ["grid"]  # maps every point once
    with pytest.raises(ValueError, match="sampler 'bayes'; allowed: autotune, tpe, random, grid"):
        kind("bayes")


def test_the_climb_names_its_point_for_a_trial_asked_of_the_study():
    """After the baseline, a trial asked of the study itself (as Optuna's own loop asks TPE) gets the climb's
    move from the baseline's diagnosis: the strategy only sets what may run before it asks."""
    study = optuna.create_study(direction="maximize")
    strategy = Strategy(study, SPACE, BASE, "autotune")
    base = strategy.ask()
    moves = [{"knob": "num_workers", "to": "up", "why": "more DataLoader workers"}]
    strategy.tell(base.trial, "ok", 100.0, diagnosis={"bottleneck": "input", "moves": moves})
    strategy.limits = strategy._limits(lambda params: True)
    trial = study.ask()
    params = {n: trial.suggest_categorical(n, values) for n, values in SPACE.items()}
    assert params == {"num_workers": 2, "batch_size": 32} and strategy.sources[trial.number] == "plan"


def test_the_grid_names_every_point_once_in_order_then_nothing():
    study = optuna.create_study(direction="maximize")
    strategy = Strategy(study, SPACE, BASE, "grid")
    seen = []
    while (p := strategy.ask()) is not None:
        seen.append((p.source, p.params))
        strategy.tell(p.trial, "ok", 1.0)
    order = [dict(zip(SPACE, v)) for v in itertools.product(*SPACE.values())]
    assert seen == [("baseline", BASE)] + [("grid", p) for p in order if p != BASE]
