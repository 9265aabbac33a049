"""The search strategy on real Optuna studies (in memory and SQLite), driven by
synthetic landscapes: what it proposes, in what order, and what it never runs."""

import itertools
import time
import warnings
from types import SimpleNamespace

import optuna
import pytest

from autotune.knobs import Device, pytorch_defaults
from autotune.decide.budget import budget_fits, compile_cost, no_improvement_for, trial_cap, trial_cost
from autotune.decide.climb import EAGER_FIRST
from autotune.decide.limits import graph_of
from autotune.decide.playbook import advise
from autotune.decide.strategy import Facts, Strategy, skip_combination
from autotune.trial.diagnose import diagnose

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.ERROR)

SPACE = {
    "num_workers": [0, 2, 4, 8],
    "pin_memory": [False, True],
    "batch_size": [32, 64, 128, 256],
    "precision": ["32-true", "bf16-mixed"],
}
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
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        direction="maximize",
        load_if_exists=True,
    )  # the strategy installs its sampler
    return Strategy(study, SPACE, BASE, sampler, seed=seed)


def drive(strategy, landscape, n, bottleneck="input"):
    seen = []
    for _ in range(n):
        p = strategy.ask()
        if p is None:
            break
        status, value = landscape(p.params)
        strategy.tell(
            p.trial,
            status,
            value,
            diagnosis={"bottleneck": bottleneck} if bottleneck and p.source == "baseline" else None,
        )
        seen.append((p.source, p.params, status, value))
    return seen


def test_baseline_first_then_what_the_diagnosis_recommends():
    seen = drive(make(), input_bound, 3)
    assert seen[0][:2] == ("baseline", BASE)
    # input-bound (a bottleneck alone: the playbook's moves): a rung more workers, alone (the moves together only
    # from knobs that each helped alone: issue 62)
    assert seen[1][:2] == ("plan", {**BASE, "num_workers": 2})
    # no diagnosis of the new incumbent: nothing says it is still input-bound; the next knob gets its turn
    assert seen[2][1] == {**BASE, "num_workers": 2, "pin_memory": True}


def test_a_sized_workers_move_jumps_to_the_rung_the_rates_ask_for():
    strategy = make()
    p = strategy.ask()
    moves = [
        {"knob": "num_workers", "to": 3, "why": "more DataLoader workers"},
        {"knob": "pin_memory", "to": True, "why": "pin"},
        {"knob": None, "why": "cheaper transforms"},
    ]
    strategy.tell(p.trial, *input_bound(p.params), diagnosis={"bottleneck": "input", "moves": moves, "evidence": []})
    assert strategy.study.trials[0].user_attrs["diagnosis"] == {"bottleneck": "input", "moves": moves}
    assert strategy.ask().params == {**BASE, "num_workers": 4}  # alone: pinning has not helped alone yet


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


def test_a_loader_worker_that_hung_rules_out_workers_with_its_reason_and_a_resumed_search_keeps_it():
    """The first trial with workers hangs (a Dataset not safe in a worker): no other config with num_workers > 0
    runs, each drawn one told to the sampler with the hang as its reason, the rest of the space still searched;
    a workers config measured before the hang leads nothing; a resumed search (a strategy made again on the
    study, as `--resume` makes one on its storage: the rule is the study's trials) knows it all."""
    hang = {"kind": "loader", "where": "loader worker 0 in Corpus.__getitem__"}
    strategy, ran = make("tpe", seed=1), []
    for _ in range(16):
        p = strategy.ask()
        if p is None:
            break
        ran.append(p.params)
        if p.params["num_workers"] and not any(r["num_workers"] for r in ran[:-1]):
            strategy.tell(p.trial, "hung", error="NoStep: ...", attrs={"hung": hang})
        else:
            strategy.tell(p.trial, *input_bound(p.params))
    assert sum(1 for r in ran if r["num_workers"]) == 1  # the hung one alone
    assert len(ran) > 5  # the search went on with the rest of its space
    told = [t for t in strategy.study.trials if t.user_attrs.get("error", "").startswith("ruled out by a hang")]
    assert told and all(t.params["num_workers"] > 0 and t.user_attrs["virtual"] for t in told)
    assert told[0].user_attrs["error"] == (
        "ruled out by a hang: trial #1 hung: loader worker 0 in Corpus.__getitem__ (num_workers > 0 ruled out)"
    )
    resumed = Strategy(strategy.study, SPACE, BASE, "tpe", seed=2)
    for _ in range(5):  # a resumed search: the same study, the same rule
        p = resumed.ask()
        if p is None:
            break
        assert p.params["num_workers"] == 0
        resumed.tell(p.trial, *input_bound(p.params))
    early = make("random", name="early", seed=0)
    base = early.ask()
    early.tell(base.trial, "ok", 100.0)
    workers = early.ask()
    while not workers.params["num_workers"]:
        early.tell(workers.trial, "ok", 50.0)
        workers = early.ask()
    early.tell(workers.trial, "ok", 900.0)  # measured fast before any hang
    assert early.best_value() == 900.0
    hung = early.ask()
    while not hung.params["num_workers"]:
        early.tell(hung.trial, "ok", 50.0)
        hung = early.ask()
    early.tell(hung.trial, "hung", attrs={"hung": hang})
    early.ask()  # what may run now, made again
    assert early.best_value() == 100.0  # the workers config leads nothing once workers are ruled out


def test_a_rank_that_hung_rules_out_its_parallel_setting_alone():
    space = {"sharding": ["ddp", "fsdp"], "ddp_bucket_cap_mb": [25, 100], "batch_size": [32, 64]}
    base = {"sharding": "ddp", "ddp_bucket_cap_mb": 25, "batch_size": 32}
    strategy = Strategy(optuna.create_study(direction="maximize"), space, base, "grid")
    seen = []
    while (p := strategy.ask()) is not None:
        seen.append(p.params)
        if p.params["sharding"] == "fsdp":
            strategy.tell(p.trial, "hung", attrs={"hung": {"kind": "rank", "where": "rank 1 in train", "rank": 1}})
        else:
            strategy.tell(p.trial, "ok", 100.0 + len(seen))
    fsdp = [p for p in seen if p["sharding"] == "fsdp"]
    assert len(fsdp) == 1 and len(seen) == 1 + 4  # sharding=fsdp once; every ddp point (the bucket is not the hang)


def test_repeats_are_told_to_the_sampler_not_run():
    strategy = make("tpe", seed=0)
    seen = drive(strategy, input_bound, 80)
    # every point once at most: 64, less the 8 in fp32 at batch 256 but the one that ran out of memory
    assert len(seen) == 64 - 8 + 1
    trials = strategy.study.get_trials(deepcopy=False)  # once: `study.trials` copies all ~600 on each read
    repeats = [t for t in trials if "repeat_of" in t.user_attrs]
    for t in repeats:
        original = trials[t.user_attrs["repeat_of"]]
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
    strategy.tell(p.trial, "ok", 100.0, diagnosis={"bottleneck": "compute"})
    q = strategy.ask()
    assert q.params["precision"] == "bf16-mixed"  # compute-bound: precision first
    strategy.tell(q.trial, "ok", 500.0, safe=False, error="loss parity failed")
    t = strategy.study.trials[q.trial.number]
    assert t.state == optuna.trial.TrialState.FAIL and t.user_attrs["status"] == "unsafe"
    assert strategy.prune_below(0.2) == pytest.approx(80.0)  # the best safe trial, less the margin


def test_the_incumbents_interval_goes_with_its_threshold():
    from autotune.trial.result import TrialResult
    from autotune.decide.strategy import trial_attrs

    strategy = make()
    assert strategy.incumbent_bar() == {"incumbent_above": None, "incumbent_ci": 0.0, "anchor": True}
    p = strategy.ask()
    strategy.tell(p.trial, "ok", 100.0, diagnosis={"bottleneck": "input"}, attrs={"ci": 0.05})
    q = strategy.ask()
    strategy.tell(q.trial, "ok", 90.0, diagnosis={"bottleneck": "input"}, attrs={"ci": 0.01})  # not the incumbent
    bar = strategy.incumbent_bar()
    assert bar["incumbent_above"] == pytest.approx(102.0) and bar["incumbent_ci"] == 0.05
    measured = TrialResult.from_dict({"status": "ok", "metrics": {"samples_per_s": 1.0, "step_mean_ci95": 0.031}})
    assert trial_attrs(measured, BASE)["ci"] == 0.031
    few = TrialResult.from_dict({"status": "ok", "metrics": {"samples_per_s": 1.0, "step_mean_ci95": float("inf")}})
    assert trial_attrs(few, BASE)["ci"] == 0.5  # a window of a few steps: capped, it screens and promotes nothing


def test_a_riskier_tie_that_changes_the_numerics_leaves_the_incumbent():
    """A move that changes the numerics and is riskier than the incumbent (records.risk) is asked to
    keep the incumbent on a tie; a loader move is not (its tie pays little). A trial whose tie kept the
    incumbent (`tie_kept`) is neither the incumbent nor a gain the climb moves to."""
    from autotune.trial.result import TrialResult
    from autotune.decide.strategy import trial_attrs

    strategy = make()
    p = strategy.ask()
    strategy.tell(p.trial, "ok", 100.0, diagnosis={"bottleneck": "input"}, attrs={"ci": 0.05})
    bar = strategy.incumbent_bar({**BASE, "precision": "bf16-mixed"})
    assert bar["tie_keeps_incumbent"] and bar["incumbent_trial"] == p.trial.number  # the trial a kept tie names
    assert "tie_keeps_incumbent" not in strategy.incumbent_bar({**BASE, "num_workers": 2})
    kept = TrialResult.from_dict(
        {
            "status": "ok",
            "knobs": {**pytorch_defaults(32), "precision": "bf16-mixed"},
            "metrics": {"samples_per_s": 104.0, "tied": 1.0, "tie_kept": 1.0},
            "skipped": "profile, diagnosis and loss parity: ties with the incumbent",
        }
    )
    assert trial_attrs(kept, pytorch_defaults(32))["tie_kept"]
    q = strategy.ask()
    strategy.tell(q.trial, "ok", 104.0, attrs={"tie_kept": True})
    assert strategy.best_value() == 100.0 and strategy.incumbent_bar()["incumbent_above"] == pytest.approx(102.0)
    r = strategy.ask()
    strategy.tell(r.trial, "ok", 110.0)
    assert strategy.best_value() == 110.0


def test_a_loader_move_is_diagnosed_from_the_compute_side_already_measured():
    strategy = make()
    p = strategy.ask()
    apart = {"compute_ceiling_samples_per_s": 500.0, "loader_samples_per_s_per_worker": 120.0}
    strategy.tell(p.trial, "ok", 100.0, diagnosis={"bottleneck": "input"}, attrs={"apart": apart})
    loader = {**BASE, "num_workers": 2, "pin_memory": True}
    assert strategy.carry_for(loader) == {"trial": p.trial.number, "metrics": apart}
    assert strategy.incumbent_bar(loader)["carry"] == {"trial": p.trial.number, "metrics": apart}
    for other in ({**BASE, "batch_size": 64}, {**BASE, "precision": "bf16-mixed", "num_workers": 2}):
        assert strategy.carry_for(other) is None  # the compute side changes: measured again


def test_a_config_that_cannot_finish_in_the_budget_is_not_run():
    strategy = make()
    p = strategy.ask()
    strategy.tell(p.trial, *input_bound(p.params), diagnosis={"bottleneck": "input"})
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
        strategy.tell(p.trial, *input_bound(p.params), diagnosis={"bottleneck": "input"})
        running = [strategy.ask() for _ in range(8)]  # eight GPUs ask before any trial finishes
        keys = {tuple(r.params.values()) for r in running} | {tuple(p.params.values())}
        assert len(keys) == 9, sampler


# --- a bottleneck that moves: input -> overhead -> compute -> input again -------------

H100 = Device("cuda", 16, "NVIDIA H100 80GB HBM3", (9, 0))
MOVING_SPACE = {
    "num_workers": [0, 2, 4, 8, 16],
    "pin_memory": [False, True],
    "batch_size": [32, 64, 128, 256, 512],
    "precision": ["32-true", "bf16-mixed"],
}
MOVING_BASE = {"num_workers": 0, "pin_memory": False, "batch_size": 32, "precision": "32-true"}
PER_WORKER = 1000.0  # samples/s one loader worker delivers


def step_ms(p, batch=None):
    """A fixed 10 ms per step (launch overhead) plus per-sample work; bf16 does it 2.5x faster."""
    return 10.0 + (batch or p["batch_size"]) * (0.1 if p["precision"] == "32-true" else 0.04)


def moving(p):
    """Two sides, as the trial measures them: the compute ceiling (a cached batch on
    the device; pinning saves 10% of the copy) and the loader (1000 samples/s per
    worker; no workers: loading runs in series with the step). The timed
    throughput is the slower side; the metrics are what a trial reports."""
    ceiling = p["batch_size"] / step_ms(p) * 1e3 * (1.1 if p["pin_memory"] else 1.0)
    if p["num_workers"] == 0:
        value = 1 / (1 / PER_WORKER + 1 / ceiling)
    else:
        value = min(ceiling, PER_WORKER * p["num_workers"])
    metrics = {
        "samples_per_s": value,
        "data_wait_frac": 1 - value / ceiling,
        "compute_ceiling_samples_per_s": ceiling,
        "loader_samples_per_s_per_worker": PER_WORKER,
        "host_cpus_per_gpu": 16,
        "batch2x_step_ratio": step_ms(p, 2 * p["batch_size"]) / step_ms(p),
        "gpu_compute_kernel_frac": 0.9,
        "tensor_core_frac": 0.0 if p["precision"] == "32-true" else 0.6,
    }
    return value, metrics


def run_moving(n, diagnose_every_trial=True):
    """Drive the strategy on `moving`; each trial diagnosed from its own metrics
    (or only the baseline). Returns [(knobs, bottleneck, new incumbent?)]."""
    study = optuna.create_study(direction="maximize")
    strategy = Strategy(study, MOVING_SPACE, MOVING_BASE, "autotune")
    seen, best = [], 0.0
    for _ in range(n):
        p = strategy.ask()
        value, metrics = moving(p.params)
        knobs = {**pytorch_defaults(32), **p.params}
        d = advise(diagnose(metrics, knobs, H100), knobs)  # as the search stores it (execution.trials.advised)
        strategy.tell(p.trial, "ok", value, diagnosis=d if diagnose_every_trial or p.source == "baseline" else None)
        seen.append((p.params, d["bottleneck"], value > best * 1.02))
        best = max(best, value)
    return strategy, seen


def test_the_search_follows_the_moving_bottleneck_and_climbs_workers_again():
    strategy, seen = run_moving(25)
    top = max(moving(dict(zip(MOVING_SPACE, v)))[0] for v in itertools.product(*MOVING_SPACE.values()))
    assert max(moving(p)[0] for p, *_ in seen[:12]) >= 0.95 * top
    incumbents = [(i, p, b) for i, (p, b, new) in enumerate(seen) if new]
    assert [b for *_, b in incumbents][:5] == ["input", "overhead", "overhead", "input", "compute"]
    # every input-bound incumbent (below the top rung) is moved from by more workers, at once
    reopened = [(p, seen[i + 1][0]) for i, p, b in incumbents if b == "input" and p["num_workers"] < 16]
    assert len(reopened) >= 3
    assert all(after["num_workers"] > p["num_workers"] for p, after in reopened), reopened
    # ... also after the batch and the precision made the step cheaper
    assert any(p["batch_size"] > 32 and p["precision"] != "32-true" for p, _ in reopened)
    ran = strategy.real_trials()  # each trial keeps its diagnosis (bottleneck and moves)
    assert len(ran) == 25 and all("moves" in t.user_attrs["diagnosis"] for t in ran)


def test_with_only_the_baseline_diagnosed_the_climb_does_not_follow_the_bottleneck():
    """The same landscape with only the baseline diagnosed (the search before
    per-trial diagnoses): the input-bound incumbent after the batch move is not
    given more workers next. The strict check above can fail."""
    _, seen = run_moving(6, diagnose_every_trial=False)
    i = next(i for i, (p, b, new) in enumerate(seen) if new and b == "input" and p["batch_size"] > 32)
    assert seen[i + 1][0]["num_workers"] == seen[i][0]["num_workers"]


def test_compile_modes_are_scheduled_by_what_the_budget_affords():
    # eager trials of 12 and 14 s; two compile=default trials of other graphs, 28 and 46 s of it compiling
    spent = [({"compile": "none"}, 12.0, None), ({"compile": "none"}, 14.0, None)]
    spent += [({"compile": "default", "b": 1}, 40.0, 28.0), ({"compile": "default", "b": 2}, 60.0, 46.0)]
    assert compile_cost({"compile": "default", "b": 1, "num_workers": 2}, spent) == 28.0  # its graph: a cache hit
    assert compile_cost({"compile": "default", "b": 3}, spent) == 46.0  # a new graph: the cold compile measured
    assert compile_cost({"compile": "reduce-overhead", "b": 3}, spent) == 69.0  # scaled from default's
    assert compile_cost({"compile": "max-autotune", "b": 3}, spent) == 138.0
    assert compile_cost({"compile": "default"}, spent[:2]) is None  # nothing says: the first compile trial runs
    assert trial_cost({"compile": "none"}, spent) == 13.0 and trial_cost({"compile": "default"}, spent[:2]) == 38.0
    # what autotune.execution.driver asks with: the finished trials, read at each call
    records = [
        SimpleNamespace(knobs=k, info={"trial_wall_s": w}, metrics={"compile_s": c} if c else {}) for k, w, c in spent
    ]
    fits = budget_fits(records, {"compile": "none", "b": 3}, 100.0, time.perf_counter())
    assert fits({}) and fits({"compile": "reduce-overhead"}) and not fits({"compile": "max-autotune"})
    # a trial that built the search's parity reference costs the rest of the search less than it took
    records[-1].info["trial_wall_s"], records[-1].metrics["parity_reference_s"] = 140.0, 80.0
    assert budget_fits(records, {"compile": "none", "b": 3}, 100.0, time.perf_counter())({"compile": "reduce-overhead"})
    assert budget_fits(records, {"compile": "none"}, None, 0.0)({"compile": "max-autotune"})  # no budget
    # overhead-bound: the playbook asks for reduce-overhead first; with 60 s left only default fits
    space = {"pin_memory": [False, True], "compile": ["none", "default", "reduce-overhead", "max-autotune"]}
    moves = [{"knob": "compile", "to": ["reduce-overhead", "default"], "why": "compile"}]
    for left, expected in ((None, "reduce-overhead"), (60.0, "default")):
        study = optuna.create_study(direction="maximize")
        strategy = Strategy(study, space, {"pin_memory": False, "compile": "none"})
        p = strategy.ask()
        strategy.tell(p.trial, "ok", 100.0, diagnosis={"bottleneck": "overhead", "moves": moves})
        fits = (lambda params: True) if left is None else (lambda params: trial_cost({**params, "b": 3}, spent) <= left)
        assert strategy.ask(fits).params == {"pin_memory": False, "compile": expected}


@pytest.mark.parametrize("sampler", ["autotune", "tpe"])
def test_the_explorers_compiled_draw_on_a_new_graph_runs_its_eager_twin_first(sampler):
    """Issue 62: the climb's explorer (TPE, and the fallback's random point) draws compiled configs too, each on a
    graph never compiled a new compile. Such a draw runs as its eager twin first (the draw told FAIL: TPE's model
    leaves it out), where the twin was never measured; a graph compiled before is a cache hit and runs as drawn.
    A generic sampler (`tpe`) runs what it draws."""
    space = {
        "num_workers": [0, 1, 2],
        "precision": ["32-true", "bf16-mixed"],
        "fused_optimizer": [False, True],
        "compile": ["none", "default"],
    }
    base = {"num_workers": 0, "precision": "32-true", "fused_optimizer": False, "compile": "none"}

    def each_helps(p):  # the loader's workers only without compile
        v = 100 * (1.2 if p["fused_optimizer"] else 1) * (1.1 if p["precision"] != "32-true" else 1)
        v *= 1.5 if p["compile"] != "none" else 1
        return "ok", v * (1 + 0.05 * p["num_workers"] * (p["compile"] == "none"))

    strategy = Strategy(optuna.create_study(direction="maximize"), space, base, sampler, seed=0)
    seen = drive(strategy, each_helps, 20)  # the climb's optimum by trial 8, the explorer's draws after
    blind = []  # drawn compiled on a new graph, its eager twin never measured
    for i, (source, point, *_) in enumerate(seen):
        before = [p for _, p, *_ in seen[:i]]
        new_graph = all(graph_of(p) != graph_of(point) for p in before if p["compile"] != "none")
        if source != "plan" and point["compile"] != "none" and new_graph and {**point, "compile": "none"} not in before:
            blind.append(point)
    skipped = [t for t in strategy.study.trials if str(t.user_attrs.get("error", "")).startswith(EAGER_FIRST)]
    if sampler == "autotune":
        assert not blind and skipped, (blind, len(skipped))
        assert all(t.state == optuna.trial.TrialState.FAIL and t.user_attrs["virtual"] for t in skipped)
        firsts = [t for t in strategy.study.trials if t.user_attrs.get("chosen_by") == EAGER_FIRST]
        assert firsts and all(t.params["compile"] == "none" for t in firsts)
    else:
        assert blind and not skipped


def test_the_trial_count_caps_a_search_with_or_without_a_budget_and_a_grid_runs_each_point_once():
    space = {"num_workers": [0, 1, 2], "precision": ["32-true", "bf16-mixed"]}  # 6 points
    assert trial_cap(space, 20, None, "autotune") == 20 and trial_cap(space, None, None, "autotune") == 20
    assert trial_cap(space, 4, 300.0, "autotune") == 4  # given, it caps: the budget or the count, the first reached
    assert trial_cap(space, None, 300.0, "autotune") == 6  # left out, the budget decides: every point may run
    assert trial_cap(space, 20, None, "grid") == 6 and trial_cap(space, 4, None, "grid") == 4


def compute_bound(p):
    """The loader is no bottleneck: workers and pinning change nothing (a little noise aside)."""
    v = 100 * {32: 1, 64: 1.3, 128: 1.5, 256: 1.6}[p["batch_size"]] * (1.2 if p["precision"] == "bf16-mixed" else 1)
    return "ok", v * (1 + 0.001 * p["num_workers"])


@pytest.mark.parametrize("sampler", ["autotune", "tpe"])
def test_a_baseline_that_hardly_waits_on_data_gives_the_loader_knobs_one_probe(sampler):
    def loader_probes(wait: float, listed=()) -> int:
        study = optuna.create_study(direction="maximize")
        strategy = Strategy(study, SPACE, BASE, sampler, facts=Facts(listed=listed))
        loader = set()
        for _ in range(20):
            p = strategy.ask()
            if p is None:
                break
            strategy.tell(
                p.trial,
                *compute_bound(p.params),
                diagnosis={"bottleneck": "compute"} if p.source == "baseline" else None,
                attrs={"data_wait": wait} if p.source == "baseline" else None,
            )
            loader.add((p.params["num_workers"], p.params["pin_memory"]))
        return len(loader) - 1  # the settings other than the baseline's

    assert loader_probes(0.01) == 1  # 1% of its window: one probe, whatever the sampler draws
    assert loader_probes(0.2) > 1  # a loader it waits on: searched
    assert loader_probes(0.01, listed=("num_workers", "pin_memory")) > 1  # the spec listed them: searched


LM_SPACE = {"batch_size": [4, 8, 16], "activation_checkpointing": ["off", "selective", "full"], "attention": ["sdpa"]}
LM_BASE = {"batch_size": 4, "activation_checkpointing": "off", "attention": "sdpa"}


def memory_bound_lm(p):
    """A language model at its memory limit: activations cost the batch x what checkpointing keeps (1, 0.6 every
    second block, 0.35 every block) against a limit of 6; a larger micro-batch is faster, recomputing costs
    10-20%. Batch 8 fits only with checkpointing, 16 only with all of it: the fastest config."""
    kept = {"off": 1.0, "selective": 0.6, "full": 0.35}[p["activation_checkpointing"]]
    if p["batch_size"] * kept > 6:
        return "oom", None
    recompute = {"off": 1.0, "selective": 0.9, "full": 0.8}[p["activation_checkpointing"]]
    return "ok", {4: 100, 8: 150, 16: 190}[p["batch_size"]] * recompute


def test_a_larger_micro_batch_that_fits_only_with_checkpointing_is_found_by_the_chain():
    """A program's trials have no diagnosis: the batch a rung up running out of memory is what says the step is
    capacity-bound, and the climb tries that batch with the knobs that free memory (checkpointing here), then
    the next batch with more of it, each point measured."""
    study = optuna.create_study(direction="maximize")
    seen = drive(Strategy(study, LM_SPACE, LM_BASE, "autotune", seed=0), memory_bound_lm, 6, bottleneck=None)
    path = [(s, p["batch_size"], p["activation_checkpointing"], status) for s, p, status, _ in seen]
    assert path[:2] == [("baseline", 4, "off", "ok"), ("plan", 8, "off", "oom")]
    assert path[2] == ("plan", 8, "selective", "ok")  # the batch that did not fit, with every second block
    assert ("plan", 16, "full", "ok") in path[3:]  # and the next one, with every block: the fastest
    assert (
        max(v for *_, v in seen if v)
        == memory_bound_lm({**LM_BASE, "batch_size": 16, "activation_checkpointing": "full"})[1]
    )


PAD_SPACE = {"num_workers": [0, 2], "precision": ["32-true", "bf16-mixed"], "padding_free": [False, True]}
PAD_BASE = {"num_workers": 0, "precision": "32-true", "padding_free": False}


def padded_lm(p):
    """A padding collator's language model: 40% of its batches' token slots are padding; padding-free rows gain
    what the padding cost, workers a little, bf16 nothing on this CPU."""
    return "ok", 100 * (1.6 if p["padding_free"] else 1) * (1.1 if p["num_workers"] else 1)


def test_a_language_models_padding_puts_padding_free_first_and_says_which_measurement_chose_it():
    """Issue 62: the baseline input-bound (the registry's order: workers first), its padding 40% measured: the
    first trial after it is padding-free, the move with the largest gain the measurement bounds, and the trial
    says what chose it."""
    strategy = Strategy(optuna.create_study(direction="maximize"), PAD_SPACE, PAD_BASE, "autotune", seed=0)
    base = strategy.ask()
    facts = {"padding_frac": 0.4, "attention": "sdpa", "cuda": False}
    diagnosis = advise({"bottleneck": "input", "facts": facts}, base.params)  # as the trial's result carries it
    strategy.tell(base.trial, "ok", 100.0, diagnosis=diagnosis, attrs={"wall_s": 6.0})
    first = strategy.ask()
    assert first.params == {**PAD_BASE, "padding_free": True}
    assert first.chosen_by == "padding 40% of the batches' token slots"
    assert first.trial.user_attrs["chosen_by"] == first.chosen_by


def draw(strategy, point):
    """A study trial drawn on `point`, as the sampler's draw is (its params suggested)."""
    strategy.study.enqueue_trial(point)
    trial = strategy.study.ask()
    strategy._suggest(trial)
    return trial


def test_a_drawn_combination_of_knobs_that_did_not_help_alone_is_skipped_and_says_so():
    """Issue 62: multi-knob combinations only from knobs that each helped alone. Workers helped alone, bf16 and
    padding-free did not: a draw of bf16 with padding-free is skipped (told to the sampler, with why); one of
    workers with padding-free, a single unproven change, runs."""
    strategy = Strategy(optuna.create_study(direction="maximize"), PAD_SPACE, PAD_BASE, "autotune", seed=0)
    measured = [({}, 100.0), ({"num_workers": 2}, 130.0), ({"precision": "bf16-mixed"}, 99.0)]
    for change, value in measured + [({"padding_free": True}, 100.5)]:
        strategy.study.enqueue_trial({**PAD_BASE, **change})
        proposal = strategy.ask()
        assert proposal.params == {**PAD_BASE, **change}
        strategy.tell(proposal.trial, "ok", value, attrs={"wall_s": 5.0})
    assert strategy.helped() == {("num_workers", 2)}
    combined = {**PAD_BASE, "precision": "bf16-mixed", "padding_free": True}
    drawn = draw(strategy, combined)
    assert skip_combination(strategy, drawn, combined)
    said = strategy.study.trials[drawn.number].user_attrs
    assert said["status"] == "skipped" and said["error"].startswith(
        "skipped: combines precision=bf16-mixed, padding_free=True, which did not each help alone"
    )
    assert not skip_combination(strategy, strategy.study.ask(), {**PAD_BASE, "num_workers": 2, "padding_free": True})
    # drawn again, it is told as a repeat of that skip: the search's skipped configs name it once
    again = draw(strategy, combined)
    assert skip_combination(strategy, again, combined)
    assert strategy.study.trials[again.number].user_attrs["error"] == f"repeat of skipped trial {drawn.number}"
    assert len(strategy.skipped_predicted()) == 1
