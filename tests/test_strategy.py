"""The search strategy on real Optuna studies (in memory and SQLite), driven by
synthetic landscapes: what it proposes, in what order, and what it never runs."""

import itertools
import warnings

import optuna
import pytest

from autotune.strategy import Strategy, no_improvement_for

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.ERROR)

SPACE = {"num_workers": [0, 2, 4, 8], "pin_memory": [False, True], "batch_size": [32, 64, 128, 256],
         "precision": ["32-true", "bf16-mixed"]}
BASE = {"num_workers": 0, "pin_memory": False, "batch_size": 32, "precision": "32-true"}


def input_bound(p):
    """Workers and pinning matter most, then batch and precision; batch 256 in
    fp32 runs out of memory."""
    if p["batch_size"] >= 256 and p["precision"] == "32-true":
        return "oom", None
    v = 100 * (1 + min(p["num_workers"], 4)) * (1.5 if p["pin_memory"] else 1)
    v *= {32: 1, 64: 1.3, 128: 1.5, 256: 1.6}[p["batch_size"]] * (1.2 if p["precision"] == "bf16-mixed" else 1)
    return "ok", v


def make(sampler="autotune", storage=None, name="s", seed=0):
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize", load_if_exists=True,
                                sampler=Strategy.make_sampler(sampler, seed))
    return Strategy(study, SPACE, BASE, sampler, seed=seed)


def drive(strategy, landscape, n, bottleneck="input"):
    seen = []
    for _ in range(n):
        p = strategy.ask()
        if p is None:
            break
        status, value = landscape(p.params)
        strategy.tell(p.trial, status, value, bottleneck=bottleneck if p.source == "baseline" else None)
        seen.append((p.source, p.params, status, value))
    return seen


def test_baseline_first_then_what_the_diagnosis_recommends():
    seen = drive(make(), input_bound, 3)
    assert seen[0][:2] == ("baseline", BASE)
    # input-bound: workers (to the middle of the ladder above) and pinning together
    assert seen[1][:2] == ("plan", {**BASE, "num_workers": 4, "pin_memory": True})
    assert seen[2][1]["batch_size"] == 64  # then the next knob of the plan, from the new incumbent


def test_reaches_the_best_of_a_landscape_in_few_trials_and_never_repeats():
    best = max(input_bound(dict(zip(SPACE, v)))[1] or 0 for v in itertools.product(*SPACE.values()))
    for seed in range(5):
        seen = drive(make(seed=seed), input_bound, 30)
        values = [v or 0 for *_, v in seen]
        assert max(values[:10]) >= 0.95 * best, seed
        keys = [tuple(p.values()) for _, p, *_ in seen]
        assert len(keys) == len(set(keys)), "a measured config ran again"


def test_never_runs_a_batch_above_a_known_oom_with_the_same_device_knobs():
    strategy = make("tpe", seed=3)
    seen = drive(strategy, input_bound, 40)
    ooms = [p for _, p, status, _ in seen if status == "oom"]
    assert len(ooms) == 1, ooms  # the first OOM bounds the ladder: no second one in fp32
    skipped = [t for t in strategy.study.trials if t.user_attrs.get("error", "").startswith("predicted OOM")]
    assert all(t.user_attrs["virtual"] and t.state == optuna.trial.TrialState.FAIL for t in skipped)
    assert all(t.params["precision"] == "32-true" and t.params["batch_size"] >= 256 for t in skipped)
    # bf16 has other device-side knobs: its batch 256 is still tried
    assert strategy.predicted_oom({**BASE, "batch_size": 256, "precision": "bf16-mixed"}) is None


def test_repeats_are_told_to_the_sampler_not_run():
    strategy = make("tpe", seed=0)
    seen = drive(strategy, input_bound, 80)
    # every point once at most: 64, less the 8 in fp32 at batch 256 but the one that ran out of memory
    assert len(seen) == 64 - 8 + 1
    repeats = [t for t in strategy.study.trials if "repeat_of" in t.user_attrs]
    for t in repeats:
        original = strategy.study.trials[t.user_attrs["repeat_of"]]
        assert t.params == original.params and t.values == original.values
    assert strategy.ask() is None  # everything measured or known infeasible


def test_grid_runs_every_point_once_baseline_first():
    strategy = make("grid")
    seen = drive(strategy, input_bound, 100)
    assert seen[0][1] == BASE
    keys = {tuple(p.values()) for _, p, *_ in seen}
    assert len(keys) == len(seen) == 64 - 7  # fp32 batch 256 OOMs once: the other 7 such points are predicted


def test_resume_continues_from_the_storage_and_reruns_interrupted_trials(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    first = drive(make(storage=storage), input_bound, 4)
    cut = make(storage=storage).ask()  # a trial running when the search was killed
    trial = cut.trial
    study = optuna.load_study(study_name="s", storage=storage)
    study._storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
    study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)

    resumed = make(storage=storage)
    nxt = resumed.ask()
    assert nxt.source == "resume" and nxt.params == cut.params
    resumed.tell(nxt.trial, *input_bound(nxt.params))
    rest = drive(resumed, input_bound, 20)
    keys = [tuple(p.values()) for _, p, *_ in first + [("", nxt.params)] + rest]
    assert len(keys) == len(set(keys))
    assert resumed.bottleneck() == "input"  # the baseline's diagnosis is in the study


def test_unsafe_and_failed_trials_are_failures_for_the_sampler():
    strategy = make()
    p = strategy.ask()
    strategy.tell(p.trial, "ok", 100.0, bottleneck="compute")
    q = strategy.ask()
    assert q.params["precision"] == "bf16-mixed"  # compute-bound: precision first
    strategy.tell(q.trial, "ok", 500.0, safe=False, error="loss parity failed")
    t = strategy.study.trials[q.trial.number]
    assert t.state == optuna.trial.TrialState.FAIL and t.user_attrs["status"] == "unsafe"
    assert strategy.prune_below(0.2) == pytest.approx(80.0)  # the best safe trial, less the margin


def test_a_config_that_cannot_finish_in_the_budget_is_not_run():
    strategy = make()
    p = strategy.ask()
    strategy.tell(p.trial, *input_bound(p.params), bottleneck="input")
    q = strategy.ask(fits=lambda params: not params["pin_memory"])
    assert not q.params["pin_memory"]


def test_no_improvement_counts_trials_since_the_last_real_gain():
    assert no_improvement_for([100, 101, None, 101.5], 0.02) == 3
    assert no_improvement_for([100, 110], 0.02) == 0
    assert no_improvement_for([], 0.02) == 0


def test_parallel_asks_never_propose_a_running_config():
    for sampler in ("autotune", "tpe", "random"):
        strategy = make(sampler, seed=2)
        p = strategy.ask()
        strategy.tell(p.trial, *input_bound(p.params), bottleneck="input")
        running = [strategy.ask() for _ in range(8)]  # eight GPUs ask before any trial finishes
        keys = {tuple(r.params.values()) for r in running} | {tuple(p.params.values())}
        assert len(keys) == 9, sampler
