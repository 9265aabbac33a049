"""The climb (autotune.decide.climb) as a strategy runs it: how a compiled incumbent is moved from (issue 62)."""

import warnings

import optuna

from autotune.decide.climb import EAGER_FIRST
from autotune.decide.strategy import Strategy

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.ERROR)


def test_a_compiled_incumbents_moves_go_by_its_eager_twins_answers():
    """Issue 62: from a compiled incumbent every move that changes its graph pays a new compile. The climb goes by
    the same move from its eager twin: measured there without a gain (the loader's one rung up, which every
    trial's diagnosis names, as a language model's names its padding), it is not tried compiled; not measured, it runs eager first (no compile) and compiled only where it gained there (bf16: slower,
    never compiled; the fused optimizer: faster, compiled next and the best); a loader move nothing answered keeps
    the graph (the search's cache has it) and runs compiled."""
    space = {
        "num_workers": [0, 1],
        "precision": ["32-true", "bf16-mixed"],
        "fused_optimizer": [False, True],
        "compile": ["none", "default"],
    }
    base = {"num_workers": 0, "precision": "32-true", "fused_optimizer": False, "compile": "none"}

    def compile_helps(p):
        v = 100 * (1.5 if p["compile"] != "none" else 1) * (1.2 if p["fused_optimizer"] else 1)
        return "ok", v * (0.9 if p["precision"] != "32-true" else 1) * (1 - 0.001 * p["num_workers"])

    strategy, planned = Strategy(optuna.create_study(direction="maximize"), space, base), []
    moves = [{"knob": "num_workers", "to": "up", "why": "w"}, {"knob": "compile", "to": ["default"], "why": "c"}]
    for _ in range(8):
        p = strategy.ask()
        strategy.tell(p.trial, *compile_helps(p.params), diagnosis={"bottleneck": "input", "moves": moves})
        planned.append({n: v for n, v in p.params.items() if v != base[n]})
    assert planned == [
        {},
        {"num_workers": 1},  # the diagnosis's moves, each alone: the loader's, no gain...
        {"compile": "default"},  # ... compile, the incumbent: its twin's answer stands for its diagnosis's move
        {"precision": "bf16-mixed"},  # eager first: slower, never compiled
        {"fused_optimizer": True},  # eager first: faster...
        {"fused_optimizer": True, "compile": "default"},  # ... so compiled: the new incumbent
        {"num_workers": 1, "fused_optimizer": True, "compile": "default"},  # its graph: compiled
        {"precision": "bf16-mixed", "fused_optimizer": True},  # from the new incumbent's twin, eager
    ]


def test_a_knob_inside_the_noise_is_compiled_neither_into_the_compile_move_nor_after_it():
    """Issue 62: channels_last gains 4% on a transformer, above min_improvement (the climb moves there) but inside
    each window's +-5% (not counted: the export leaves it out). The compile move from there compiles the config
    the export would carry, compile alone (else the export's check, compile without channels_last, is a second
    new graph), and from the compiled incumbent channels_last is not compiled again; the fused optimizer, 30%
    beyond the noise, is, after its eager first."""
    space = {
        "num_workers": [0, 1],
        "channels_last": [False, True],
        "fused_optimizer": [False, True],
        "compile": ["none", "default"],
    }
    base = {"num_workers": 0, "channels_last": False, "fused_optimizer": False, "compile": "none"}

    def landscape(p):
        v = 100 * (1.04 if p["channels_last"] else 1) * (1.3 if p["fused_optimizer"] else 1)
        return "ok", v * (1.5 if p["compile"] != "none" else 1) * (1 - 0.001 * p["num_workers"])

    strategy, planned = Strategy(optuna.create_study(direction="maximize"), space, base), []
    moves = [{"knob": "channels_last", "to": True, "why": "c"}, {"knob": "compile", "to": ["default"], "why": "c"}]
    while len(planned) < 8:
        p = strategy.ask()
        diagnosis = {"bottleneck": "compute", "moves": moves}
        strategy.tell(p.trial, *landscape(p.params), diagnosis=diagnosis, attrs={"ci": 0.05})
        planned.append(({n: v for n, v in p.params.items() if v != base[n]}, p.source, p.chosen_by))
    assert [c for c, source, _ in planned if source == "plan"][:7] == [
        {"channels_last": True},  # +4%: the climb's new incumbent
        {"compile": "default"},  # the compile move, lean: without channels_last
        {"num_workers": 1, "compile": "default"},  # the loader's: its graph, nothing answered it
        {"fused_optimizer": True},  # eager first...
        {"fused_optimizer": True, "compile": "default"},  # ... 30%: compiled
        {"channels_last": True, "fused_optimizer": True},  # eager first: +4% again, inside the noise
        {"num_workers": 1, "fused_optimizer": True, "compile": "default"},
    ]
    assert [by for c, _, by in planned if c == {"fused_optimizer": True}] == [EAGER_FIRST]
    assert strategy.counted() == {"fused_optimizer", "compile"}
