"""autotune.decide.stoppers: each stop cause with its reason, combined in one order, the same for both
backends; the trial count and the time budget are both limits, the first reached ends the search."""

from types import SimpleNamespace

from autotune.decide.budget import trial_cap
from autotune.decide.stoppers import Budget, Combined, Patience, TrialCount, search_stoppers


def record(throughput, contends=True):
    return SimpleNamespace(throughput=throughput, contends=contends)


def test_each_cause_stops_with_its_reason_in_the_search_order():
    recorder = SimpleNamespace(records=[], baseline_failed=None)
    clock = {"now": 0.0}
    stop, interrupted, exhausted = search_stoppers(
        recorder, n_trials=3, budget_s=60.0, patience=2, min_improvement=0.1, started=0.0
    )
    stop.stoppers[-1].elapsed = lambda: clock["now"]  # the budget's clock, driven here
    assert not stop.stop() and stop.reason == ""
    recorder.records += [record(100.0), record(105.0)]  # a gain below 10%: one trial without one
    assert not stop.stop()
    recorder.records.append(record(None, contends=False))  # a trial that cannot be the best gains nothing
    assert stop.reason == "no gain above 10% in 2 trials"  # patience before the trial count (3 trials ran too)
    clock["now"] = 61.0
    exhausted.set = True
    assert stop.reason == "no gain above 10% in 2 trials"
    interrupted.set = True
    assert stop.reason == "interrupted"
    recorder.baseline_failed = recorder.records[0]
    assert stop.reason == "the baseline failed"


def test_the_first_limit_reached_ends_the_search():
    records, clock = [], {"now": 0.0}
    count, budget = TrialCount(records, 2), Budget(100.0, lambda: clock["now"])
    stop = Combined(count, budget)
    records.append(record(1.0))
    clock["now"] = 100.0  # the budget first
    assert stop.stop() and stop.reason == "the time budget"
    clock["now"] = 0.0
    records.append(record(1.0))  # the count first
    assert stop.stop() and stop.reason == "2 trials"
    assert not Budget(None, lambda: 1e9).stop() and not Patience(records, None, 0.02).stop()  # not asked for
    assert not Budget(100.0, lambda: 1e9, []).stop()  # the start-up spent it: the baseline still runs
    assert Budget(100.0, lambda: 1e9, [record(1.0)]).stop()
    # the cap the driver gives the count: n_trials, with a budget too; a grid, at most its points
    space = {"a": [1, 2], "b": [1, 2, 3]}
    assert trial_cap(space, 20, 600.0, "autotune") == 20 and trial_cap(space, 20, None, "grid") == 6
    assert trial_cap(space, 4, 600.0, "grid") == 4


def test_the_budget_keeps_the_remeasurements_time_aside():
    from autotune.decide.budget import remeasure_cost

    trials = [
        SimpleNamespace(info={"trial_wall_s": 10.0}, throughput=1.0, is_baseline=True),
        SimpleNamespace(info={"trial_wall_s": 6.0}, throughput=2.0, is_baseline=False),
        SimpleNamespace(info={"trial_wall_s": 8.0}, throughput=None, is_baseline=False),  # failed: no read
    ]
    # the pairs that settle a verdict (2 of the 3 rounds), at most a quarter of the budget
    assert remeasure_cost(trials, 3) == 2 * (10.0 + 8.0) and remeasure_cost(trials, 0) == remeasure_cost([], 3) == 0
    assert remeasure_cost(trials, 1) == 18.0 and remeasure_cost(trials, 3, budget=100.0) == 25.0
    records = [record(1.0)]
    assert not Budget(100.0, lambda: 40.0, records, lambda: 54.0).stop()
    assert Budget(100.0, lambda: 50.0, records, lambda: 54.0).stop()  # 46 s left: the re-measurement's 54 s
