"""A real search through Ray Tune + Optuna + MLflow on the tiny workload."""

import signal
import threading
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from autotune import load_config
from autotune import spec as S
from autotune.decide.budget import NOTHING_LEFT
from autotune.execution.callbacks import SearchCallback
from autotune.execution.driver import run
from autotune.trial.result import TrialResult

pytestmark = [pytest.mark.usefixtures("ray_local"), pytest.mark.timeout(300)]

TRIAL = {
    "warmup_steps": 2,
    "measure_steps": 5,
    "min_window_s": 0.2,
    "max_window_s": 1.0,
    "profile_steps": 2,
    "timeout_s": 120,
}


def make_spec(tmp_path, **overrides):
    data = {
        "name": "t",
        "workload": {"name": "tiny_cnn", "args": {"batch_size": 16}},
        "search_space": {
            "preset": None,
            "knobs": {"batch_size": [16, 64], "channels_last": [False, True], "pin_memory": [False, True]},
        },
        "trial": TRIAL,
        "search": {"n_trials": 4, "seed": 1, "confirm_rounds": 0},
        "safety": {"level": "dynamics", "parity_steps": 6},  # parity as a search runs it, on fewer steps
        "output_dir": str(tmp_path / "run"),
        **overrides,
    }
    return S.parse(data, "t.yaml")


class Collector(SearchCallback):
    """Hears each trial as it starts and as it finishes (the search's callbacks)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.records, self.started = [], []

    def on_trial(self, record):
        with self.lock:
            self.records.append(record)

    def on_trial_start(self, number, knobs):
        self.started.append((number, knobs, len(self.records)))


def test_search_records_every_trial_everywhere(tmp_path):
    collector = Collector()
    ctrl_c = signal.getsignal(signal.SIGINT)
    result = run(make_spec(tmp_path, trial={**TRIAL, "prune_margin": 0}), callbacks=[collector])
    # Ray Tune's Ctrl-C handler goes with its run: left in place, it swallowed the re-measurement's first Ctrl-C
    # (or SIGTERM) and the pairs ran on (a README walk)
    assert signal.getsignal(signal.SIGINT) is ctrl_c
    started = collector.started
    seen = collector.records
    run_dir = result.run_dir
    numbers = [r.number for r in seen]

    # the baseline is trial 0, measured first, in the same run as the rest; the
    # numbers are Optuna's (a gap is a repeat told to the sampler, a config the rate
    # model predicted clearly below the best: `skipped: predicted`, or a combination
    # of knobs that did not each help alone: `skipped: combines`; neither ever run)
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{run_dir / 'optuna.db'}")
    skipped = [t for t in study.trials if str(t.user_attrs.get("error", "")).startswith("skipped: ")]
    predicted = [t for t in skipped if t.user_attrs["error"].startswith("skipped: predicted")]
    assert all(t.user_attrs["virtual"] and t.user_attrs["predicted"] > 0 for t in predicted)
    combined = [t for t in skipped if t not in predicted]
    assert all(t.user_attrs["virtual"] and "did not each help alone" in t.user_attrs["error"] for t in combined)
    assert len(seen) + len(skipped) == 4 and len(seen) >= 3, (numbers, [t.user_attrs for t in skipped])
    assert numbers[0] == 0 and numbers == sorted(set(numbers))
    assert seen[0].is_baseline and seen[0].knobs["batch_size"] == 16 and not seen[0].knobs["channels_last"]
    assert all(r.status == "ok" for r in seen), [(r.error_type, r.error) for r in seen]
    assert "pin_memory" in result.space.fixed  # a CPU host: fixed, not sampled
    # the fastest, unless it only tied (overlapping 95% CIs) with a safer config, which then says so
    fastest = max(seen, key=lambda r: r.throughput)
    assert result.best is fastest or result.best.tie["faster_trial"] == fastest.number
    # each trial's ratio to the baseline's read: here its trial's (a Ray of the caller's own runs the trials, so
    # the search reads no reference between them: tests/test_reads.py, on the local backend, does)
    assert not result.reads and all(r.speedup == pytest.approx(r.throughput / seen[0].throughput) for r in seen)
    # each trial was announced when it started (the live view's running row), before it finished
    assert [(n, k) for n, k, _ in started] == [(r.number, r.knobs) for r in seen]
    assert [done for _, _, done in started] == list(range(len(seen)))  # one at a time on a CPU host

    # MLflow: one parent run, one nested run per trial, knobs as params, metrics with units
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("autotune")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("autotune.role") == "search"]
    children = [
        r
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id and r.data.tags["autotune.role"] == "trial"
    ]
    assert len(parents) == 1 and len(children) == len(seen)
    by_number = {r.number: r for r in seen}
    for child in children:
        assert child.info.status == "FINISHED" and child.data.tags["status"] == "ok"
        assert child.data.tags["outcome"] == "complete"
        # the run spans the trial itself, not the instant the driver wrote it
        info = by_number[int(child.data.tags["trial_number"])].info
        assert child.info.start_time == int(info["started_unix"] * 1000)
        assert child.info.end_time == int(info["ended_unix"] * 1000)
        assert child.info.end_time - child.info.start_time > 1000 * TRIAL["min_window_s"]
        assert {"samples_per_s", "step_ms_mean", "step_ms_p95", "data_wait_frac", "speedup_x"} <= set(
            child.data.metrics
        )
        assert set(child.data.params) == set(result.space.baseline)
    assert parents[0].data.metrics["speedup_x"] == pytest.approx(result.speedup, rel=5e-4)  # MLflow: 4 figures
    # the baseline is profiled and diagnosed (later trials only when they become the incumbent)
    base_run = next(c for c in children if c.data.tags["trial_number"] == "0")
    artifacts = {a.path for a in client.list_artifacts(base_run.info.run_id, "trial")}
    assert {"trial/config.json", "trial/result.json", "trial/trial.log", "trial/trace.json"} <= artifacts
    assert base_run.data.tags["diagnosis"] in {"input", "overhead", "memory", "compute"}
    # ... and read twice, the second in a fresh process through Ray as well (confirm.reread_anchor)
    reads = [seen[0].metrics[k] for k in ("anchor_first_samples_per_s", "anchor_reread_samples_per_s")]
    assert (Path(seen[0].trial_dir) / "reread" / "result.json").exists()
    assert base_run.data.metrics["samples_per_s"] == pytest.approx(sum(reads) / 2, rel=5e-4)

    # trials.csv, the Optuna storage and best_config.yaml agree
    table = pd.read_csv(run_dir / "trials.csv")
    table = table[table["read"].isna()] if "read" in table else table  # the trials' rows, not the reads'
    assert list(table["trial"]) == numbers and table["samples_per_s"].notna().all()
    ran = [t for t in study.trials if not t.user_attrs.get("virtual")]
    assert [t.number for t in ran] == numbers and all(t.state == optuna.trial.TrialState.COMPLETE for t in ran)
    for t in study.trials:
        if "repeat_of" in t.user_attrs:  # a repeat: told the value measured before
            assert t.values == study.trials[t.user_attrs["repeat_of"]].values
    assert study.best_value == pytest.approx(fastest.throughput)
    best = yaml.safe_load((run_dir / "best_config.yaml").read_text())
    assert best["knobs"] == result.best.knobs and best.get("tie") == result.best.tie
    assert best["measured"]["speedup_x"] == pytest.approx(result.speedup, abs=1e-3)
    assert load_config(run_dir / "best_config.yaml").knobs == result.best.knobs


def test_a_failing_baseline_stops_the_search_and_says_why(tmp_path):
    spec = make_spec(
        tmp_path,
        workload={"factory": "tests.workloads:make_failing"},
        search_space={"preset": None, "knobs": {"channels_last": [False, True]}},
    )
    result = run(spec)
    assert len(result.records) == 1 and result.records[0].is_baseline
    assert result.records[0].status == "error" and result.records[0].error_type == "ValueError"
    assert result.stopped_reason.startswith("the baseline failed (ValueError: ")
    assert not (result.run_dir / "best_config.yaml").exists()
    run_tags = MlflowClient(f"sqlite:///{result.run_dir / 'mlflow.db'}").search_runs(["1"])[0].data.tags
    assert run_tags["status"] == "error" and run_tags["failure_reason"].startswith("ValueError: ")


def test_nothing_to_search_is_a_spec_error(tmp_path):
    spec = make_spec(tmp_path, search_space={"preset": None, "knobs": {"pin_memory": [True]}})
    with pytest.raises(
        S.SpecError,
        match=r"search_space: nothing to search on this device; every knob is fixed: pin_memory \(pinned memory only "
        r"speeds host-to-GPU copies; no CUDA device\); not in the search space: num_workers, ",
    ):
        run(spec)


@pytest.mark.slow  # CI tier: test_measure's window rules prune, test_stoppers' patience ends
def test_a_clearly_slower_trial_is_pruned_and_patience_ends_the_search(tmp_path):
    # 0.2 s more a step at batch 64: several times slower per sample, on an idle host and under load ~10 (where a
    # batch-16 step took 28-140 ms and the default 40 ms left batch 64 as fast as the baseline)
    spec = make_spec(
        tmp_path,
        workload={"factory": "tests.workloads:make_slow_large_batches", "args": {"sleep_s": 0.2}},
        search_space={
            "preset": None,
            "knobs": {"batch_size": [16, 64], "channels_last": [False, True], "set_to_none": [True, False]},
        },
        # the batch-16 configs differ by noise alone, ms steps that a loaded CI host moves by >2%
        # (a CI run read a "gain" and ran all 8): a gain must be 30% here
        search={"n_trials": 8, "patience": 2, "confirm_rounds": 0, "min_improvement": 0.3},
        trial={**TRIAL, "min_window_s": 1.0, "max_window_s": 3.0, "measure_steps": 20},
    )
    result = run(spec)
    records = sorted(result.records, key=lambda r: r.number)
    slow = [r for r in records if r.knobs["batch_size"] == 64]
    # stopped by pruning (never a best), or by its screening window once it could not become the incumbent
    assert slow and all(r.status == "pruned" and r.throughput is None or r.metrics.get("screened") for r in slow)
    assert all(r.metrics["samples_per_s"] < 0.8 * result.baseline.throughput for r in slow)
    assert all(r.diagnosis is None and r.parity is None for r in slow)  # no profile, no diagnosis, no parity
    pruned = [r for r in slow if r.status == "pruned"]
    assert all(r.metrics["window_s"] < 3.0 for r in pruned)  # cut short of max_window_s
    # patience: the search ended before the space did, after 2 trials without a gain above 30%
    assert len(records) < 8 and result.ended == "no gain above 30% in 2 trials" and result.stopped_reason is None
    best_before = max(r.throughput or 0 for r in records[:-2])
    assert all((r.throughput or 0) <= 1.3 * best_before for r in records[-2:])
    for r in pruned[:1]:  # pruned is its own outcome: not a failure in MLflow (its throughput was measured)
        mlflow_run = MlflowClient(f"sqlite:///{result.run_dir / 'mlflow.db'}").get_run(r.mlflow_run_id)
        assert mlflow_run.info.status == "FINISHED"
        assert mlflow_run.data.tags["status"] == "pruned" and mlflow_run.data.tags["outcome"] == "pruned"
        assert mlflow_run.data.metrics["samples_per_s"] == pytest.approx(r.metrics["samples_per_s"], rel=5e-4)


@pytest.mark.slow  # in CI: test_stoppers' first limit reached ends the search, on the one loop's stoppers
def test_with_a_time_budget_and_n_trials_the_first_limit_reached_ends_the_search(tmp_path):
    """n_trials 2 and a 600-s budget: the count is reached first and ends the
    search (4 points in the space, well inside the budget)."""
    spec = make_spec(
        tmp_path,
        search_space={"preset": None, "knobs": {"num_threads": [None, 1], "batch_size": [16, 32]}},
        trial={**TRIAL, "profile_steps": 0, "diagnose": False},
        search={"n_trials": 2, "time_budget_s": 600, "seed": 1, "confirm_rounds": 0},
    )
    seen = {}

    class Start(SearchCallback):
        def on_start(self, device, space, run_dir, n, budget):
            seen.update(n=n, budget=budget)

    result = run(spec, callbacks=[Start()])
    assert seen == {"n": 2, "budget": 600}
    assert len(result.records) == 2 and result.ended == "2 trials" and result.stopped_reason is None
    assert result.wall_s < 600


@pytest.mark.slow
def test_user_knobs_and_loader_constraints_in_a_grid_search(tmp_path):
    """Workload arguments searched as knobs (a trials.csv column, MLflow params,
    exported), and prefetch_factor never runs without loader workers."""
    spec = make_spec(
        tmp_path,
        search_space={
            "preset": None,
            "knobs": {"num_workers": [0, 1], "prefetch_factor": [2, 4]},
            "workload_args": {"width": {"values": [8, 16], "safety": "safe", "stage": "model"}},
        },
        search={"sampler": "grid", "n_trials": 20, "confirm_rounds": 0},
        trial={**TRIAL, "profile_steps": 0, "diagnose": False, "prune_margin": 0},
    )
    result = run(spec)
    rows = pd.read_csv(result.paths["trials_csv"])
    # 2 workers x 3 prefetch (the baseline's null, 2, 4) x 2 widths, less prefetch 2/4 with 0 workers
    assert len(rows) == 8 and (rows.status == "ok").all()
    assert not ((rows.num_workers == 0) & rows.prefetch_factor.notna()).any()
    assert sorted(set(rows["args.width"])) == [8, 16] and result.ended == NOTHING_LEFT
    for r in result.records:  # what each trial ran with: its knobs and its factory argument
        config = yaml.safe_load(open(f"{r.trial_dir}/config.json"))
        assert config["workload"]["args"] == {"batch_size": 16, "width": r.knobs["args.width"]}
        assert config["knobs"]["prefetch_factor"] == r.knobs["prefetch_factor"]
    run_params = MlflowClient(result.paths["mlflow_uri"]).get_run(result.best.mlflow_run_id).data.params
    assert run_params["args.width"] == str(result.best.knobs["args.width"])
    cfg = load_config(result.paths["best_config"])
    assert cfg.workload_args == {"width": result.best.knobs["args.width"]}
    assert cfg.trial_workload_args == {"batch_size": 16, "width": result.best.knobs["args.width"]}
    assert cfg.knobs["prefetch_factor"] == result.best.knobs["prefetch_factor"]


def test_a_bad_user_knob_is_one_clear_error(tmp_path):
    spec = make_spec(tmp_path, search_space={"preset": None, "workload_args": {"depth": [1, 2]}})
    with pytest.raises(S.SpecError, match=r"workload_args.depth: the factory `tiny_cnn` takes no argument `depth`"):
        run(spec)
    assert not (tmp_path / "run").exists()


def test_fused_optimizer_is_searched_checked_and_recorded(tmp_path):
    spec = make_spec(
        tmp_path,
        workload={"factory": "tests.workloads:make_with_optimizer", "args": {"optimizer": "adamw"}},
        search_space={"preset": None, "knobs": {"fused_optimizer": [False, True]}},
        # a trial that would become the incumbent is checked, and the best before it is exported
        search={"sampler": "grid", "n_trials": 4, "confirm_rounds": 0},
        safety={"level": "numerics"},
        trial={**TRIAL, "profile_steps": 0, "diagnose": False, "prune_margin": 0},
    )
    result = run(spec)
    rows = pd.read_csv(result.paths["trials_csv"])
    assert rows.fused_optimizer.tolist() == [False, True] and (rows.status == "ok").all(), rows.error.tolist()
    assert rows.optimizer.tolist() == ["AdamW", "AdamW"]
    assert result.best.number == 0 or result.best.parity["passed"]  # numerics: checked in its trial or late
    fused = TrialResult.read(f"{result.records[1].trial_dir}/result.json")
    assert fused.knobs["fused_optimizer"] is True and fused.optimizer_fused is True  # what ran
    assert result.device.optimizer == "torch.optim.adamw:AdamW"
    run_params = MlflowClient(result.paths["mlflow_uri"]).get_run(result.records[1].mlflow_run_id).data.params
    assert run_params["fused_optimizer"] == "True"
    assert load_config(result.paths["best_config"]).knobs["fused_optimizer"] == result.best.knobs["fused_optimizer"]


def test_fused_optimizer_for_an_optimizer_torch_cannot_fuse_is_fixed_with_the_reason(tmp_path):
    spec = make_spec(
        tmp_path,
        workload={"factory": "tests.workloads:make_with_optimizer", "args": {"optimizer": "rmsprop"}},
        search_space={"preset": None, "knobs": {"fused_optimizer": [False, True]}},
    )
    with pytest.raises(
        S.SpecError, match=r"fused_optimizer \(the workload's optimizer RMSprop has no fused implementation"
    ):
        run(spec)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # CI tier: test_diagnose decides the probe, test_search_records_every_trial_everywhere runs one
def test_a_compute_bound_search_spends_one_probe_on_the_loader_knobs_it_was_not_given(tmp_path):
    """The preset's num_workers (the spec lists batch size and set_to_none
    only), a baseline that hardly waits on data: one trial varies the workers,
    the rest of the search goes elsewhere."""
    spec = make_spec(
        tmp_path,
        workload={"factory": "tests.workloads:make_compute_bound"},
        search_space={
            "preset": "quick",
            "knobs": {
                "batch_size": [32, 64],
                "set_to_none": [False, True],
                "num_threads": [None],
                "precision": ["32-true"],
                "channels_last": [False],
                "fused_optimizer": [False],
            },
        },
        trial={**TRIAL, "profile_steps": 2, "diagnose": False},
        search={"n_trials": 7, "seed": 3, "sampler": "random", "confirm_rounds": 0},
    )
    result = run(spec)
    assert result.baseline.metrics["data_wait_frac"] < 0.05, result.baseline.metrics
    assert len(result.records) >= 4, result.ended
    workers = {r.knobs["num_workers"] for r in result.records if not r.is_baseline}
    assert len(workers - {result.baseline.knobs["num_workers"]}) <= 1, [r.knobs for r in result.records]


@pytest.mark.slow  # in CI: test_program's grid search of hang_loop.py (the same records, through a program),
# test_strategy's hang rules, test_launcher's built-in trial hung at its first step
def test_a_hung_trial_is_recorded_everywhere_its_value_is_not_tried_again_nor_exported(tmp_path):
    """A workload whose Dataset hangs in a loader worker (tests/workloads.py's make_fork_unsafe): the first
    trial with workers ends `hung` at its first-step limit, a row and an MLflow run that say so with the worker's
    frame; no other config with workers runs; the search goes on and exports no worker count; the last screen,
    the report and best_config.yaml name it."""
    from autotune.cli import report
    from autotune.export.answer import of

    spec = make_spec(
        tmp_path,
        name="hang",
        workload={"factory": "tests.workloads:make_fork_unsafe", "args": {"batch_size": 16}},
        search_space={"preset": None, "knobs": {"num_workers": [0, 1, 2], "channels_last": [False, True]}},
        trial={**TRIAL, "profile_steps": 0, "diagnose": False, "first_step_s": 6},
        search={"sampler": "grid", "n_trials": 6, "seed": 1, "confirm_rounds": 0},
    )
    result = run(spec)
    hung = [r for r in result.records if r.status == "hung"]
    assert len(hung) == 1 and hung[0].knobs["num_workers"] > 0, [(r.number, r.status, r.knobs) for r in result.records]
    assert [r.knobs["num_workers"] for r in result.records if r.status != "hung"] == [0, 0]  # the rest: no workers
    assert hung[0].error_type == "NoStep" and hung[0].hung == {
        "kind": "loader",
        "where": "loader worker 0 in Windows.__getitem__",
    }
    assert "; waiting for loader worker 0, which is in `Windows.__getitem__` (" in hung[0].error
    assert result.best.knobs["num_workers"] == 0 and result.stopped_reason is None
    table = pd.read_csv(result.run_dir / "trials.csv")
    row = table[table["trial"] == hung[0].number].iloc[0]
    assert row["status"] == "hung" and row["error"] == hung[0].error
    runs = MlflowClient(f"sqlite:///{result.run_dir / 'mlflow.db'}").search_runs(["1"])
    run_of = {r.data.tags.get("trial_number"): r for r in runs if r.data.tags.get("autotune.role") == "trial"}
    tags = run_of[str(hung[0].number)].data.tags
    assert (tags["outcome"], tags["status"], tags["hung.where"]) == (
        "hung",
        "hung",
        "loader worker 0 in Windows.__getitem__",
    )
    assert tags["failure_reason"] == f"NoStep: {hung[0].error}"
    assert result.ended == NOTHING_LEFT  # the grid's other points with workers: ruled out, never run
    (listed,) = result.hangs
    assert listed["ruled_out"] == "num_workers > 0" and listed["knobs"] == {"num_workers": hung[0].knobs["num_workers"]}
    assert listed["not_tried"] == {"num_workers": [v for v in (1, 2) if v != hung[0].knobs["num_workers"]]}
    best = yaml.safe_load((result.run_dir / "best_config.yaml").read_text())
    assert best["hung"] == [{k: v for k, v in listed.items() if k != "kind"}]
    line = next(t for t in of(result, absolute=True).trust if "hung" in t)
    assert line == (
        f"1 trial hung: num_workers={hung[0].knobs['num_workers']} (loader worker 0 in Windows.__getitem__): "
        f"see {Path(hung[0].trial_dir) / 'trial.log'}"
    )
    with report.console.capture() as out:
        report.report(result)
    assert f"  {report.hung_line(listed)}" in out.get().splitlines()


@pytest.mark.slow  # in CI: test_launcher's built-in trial cut at `cut_unix` (its `cut` result.json), and the
# hung rows' path through the recorder and MLflow (test_program's hang_loop.py search)
def test_a_trial_running_at_the_budgets_end_is_cut_there_and_recorded(tmp_path):
    """A compile trial (22-29 s to compile cold here) started inside a short budget: cut at the budget's end, a
    `cut` row and run, not a missing one (Ray Tune's own budget would end it unrecorded)."""
    spec = make_spec(
        tmp_path,
        name="cut",
        search_space={"preset": None, "knobs": {"compile": ["none", "default"]}},
        trial={**TRIAL, "profile_steps": 0, "diagnose": False},
        search={"sampler": "grid", "n_trials": 2, "seed": 1, "confirm_rounds": 0, "time_budget_s": 15},
    )
    result = run(spec)
    assert [(r.knobs["compile"], r.status) for r in result.records] == [("none", "ok"), ("default", "cut")]
    cut = result.records[1]
    assert cut.error_type == "Cut" and cut.error.startswith("the search's time budget ended ")
    assert result.wall_s < 15 + 10
    table = pd.read_csv(result.run_dir / "trials.csv")
    assert list(table["status"]) == ["ok", "cut"]
    runs = MlflowClient(f"sqlite:///{result.run_dir / 'mlflow.db'}").search_runs(["1"])
    (run_,) = [r for r in runs if r.data.tags.get("trial_number") == "1"]
    assert (run_.data.tags["outcome"], run_.info.status) == ("cut", "KILLED")
