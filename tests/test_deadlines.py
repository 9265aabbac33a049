"""How long a trial may go without a step (autotune.decide.deadlines), from what its search measured: the
baseline's first step and p95 step time, the compile trials' first steps, the budget's end."""

import pytest

from autotune.decide.deadlines import Deadlines
from autotune.records.trial_record import TrialRecord

EAGER = {"compile": "none", "num_workers": 0}


def record(number, knobs, first_step_s, p95_ms=None, baseline=False):
    metrics = {"samples_per_s": 100.0, "first_step_s": first_step_s, **({"step_ms_p95": p95_ms} if p95_ms else {})}
    return TrialRecord(number, "ok", {**EAGER, **knobs}, metrics, is_baseline=baseline)


def test_the_baseline_gets_the_probes_limit_and_is_never_cut():
    limits = Deadlines(120, probe_p95_ms=40.0).of_trial(EAGER, [], baseline=True, cut_unix=1000.0)
    assert limits["first_step_s"] == 120 and limits["set_by"] == "`--first-step-limit` or trial.first_step_s sets it"
    assert limits["stall_s"] == pytest.approx(10 * 0.040 + 10)  # the probe's p95 step time
    assert limits["stall_set_by"].startswith("10 x the probe's p95 step time (40 ms) + 10 s")
    assert limits["cut_unix"] is None  # the one trial every answer needs
    alone = Deadlines(120).of_trial(EAGER, [], baseline=True, cut_unix=None)  # a factory: no probe
    assert alone["stall_s"] == 120 and alone["stall_set_by"].startswith("its first-step limit")


def test_later_trials_from_the_baselines_first_step_and_step_time_and_cut_at_the_budgets_end():
    records = [record(0, {}, 4.0, p95_ms=25.0, baseline=True)]
    limits = Deadlines(120, probe_p95_ms=40.0).of_trial(
        {**EAGER, "num_workers": 1}, records, baseline=False, cut_unix=1000.0
    )
    assert limits["first_step_s"] == pytest.approx(3 * 4.0 + 30)
    assert limits["set_by"] == "3 x the baseline's first step (4 s) + 30 s"
    assert limits["stall_s"] == pytest.approx(10 * 0.025 + 10) and "the baseline's p95" in limits["stall_set_by"]
    assert limits["cut_unix"] == 1000.0
    fixed = Deadlines(120, stall_s=7.0).of_trial(EAGER, records, baseline=False, cut_unix=None)
    assert (fixed["stall_s"], fixed["stall_set_by"]) == (7.0, "trial.stall_s")
    capped = Deadlines(20).of_trial(EAGER, records, baseline=False, cut_unix=None)  # `--first-step-limit 20s`
    assert capped["first_step_s"] == 20 and capped["set_by"] == "`--first-step-limit` or trial.first_step_s sets it"


def test_a_compile_gets_10_minutes_until_one_is_measured_then_3x_the_compiled_first_steps():
    """The compile's limit holds while it compiles (the watch stops the first-step clock meanwhile); its first step
    otherwise has the eager limit: a compile trial whose loader hangs before its first batch is not held longer."""
    base = record(0, {}, 4.0, p95_ms=25.0, baseline=True)
    first = Deadlines(120).of_trial({**EAGER, "compile": "default"}, [base], baseline=False, cut_unix=None)
    assert first["compile_s"] == 600 and first["first_step_s"] == pytest.approx(42.0)
    compiled = [base, record(1, {"compile": "default"}, 50.0)]
    again = Deadlines(120).of_trial({**EAGER, "compile": "default"}, compiled, baseline=False, cut_unix=None)
    assert again["compile_s"] == pytest.approx(150.0) and again["first_step_s"] == pytest.approx(42.0)
    # another mode, scaled from the measured one (autotune.decide.budget.COMPILE_COST: max-autotune 3x default)
    autotuned = Deadlines(120).of_trial({**EAGER, "compile": "max-autotune"}, compiled, baseline=False, cut_unix=None)
    assert autotuned["compile_s"] == pytest.approx(450.0)
    # an eager trial: the same; torch.compile at work mid-run (a program's own compile) has the compile's limit
    eager = Deadlines(120).of_trial(EAGER, compiled, baseline=False, cut_unix=None)
    assert eager["first_step_s"] == pytest.approx(42.0) and eager["compile_s"] == pytest.approx(150.0)
