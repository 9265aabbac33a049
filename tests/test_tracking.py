"""MLflow store creation and trial runs, read back through MlflowClient."""

from mlflow.tracking import MlflowClient

from autotune import knobs as K
from autotune.integrations import tracking
from autotune.records.trial_record import TrialRecord


def test_an_empty_store_is_made_once_then_copied_and_adopted_by_the_run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("first", "second"):  # the first migrates the schema (and caches it), the second copies it
        run_dir = tmp_path / name
        store = tracking.empty_store(run_dir)
        assert not run_dir.exists()  # nothing in the run dir before the search is checked
        run_dir.mkdir()
        tracking.adopt_store(store, run_dir)
        assert (run_dir / "mlflow.db").exists() and not store.parent.exists()
        tracker = tracking.Tracker(tracking.default_uri(run_dir), "autotune", run_dir, name)
        client = MlflowClient(tracking.default_uri(run_dir))
        locations = {e.name: e.artifact_location for e in client.search_experiments()}
        mlartifacts = (run_dir / "mlartifacts").resolve().as_uri()
        assert locations == {"autotune": mlartifacts, "Default": f"{mlartifacts}/0"}
        assert client.get_run(tracker.parent_run_id).data.tags["autotune.role"] == "search"
    assert list((tmp_path / "cache" / "autotune").iterdir())[0].name.startswith("mlflow-")
    unused = tracking.empty_store(tmp_path / "third")
    tracking.adopt_store(unused, None)  # a check failed: the store goes, nothing was written
    assert not unused.parent.exists() and not (tmp_path / "third").exists()


def test_a_pruned_trial_is_finished_with_its_outcome_and_its_real_start_and_end(tmp_path):
    tracker = tracking.Tracker(tracking.default_uri(tmp_path), "autotune", tmp_path, "s")
    record = TrialRecord(
        number=3,
        status="pruned",
        knobs=K.pytorch_defaults(32),
        metrics={"samples_per_s": 40.0},
        info={"started_unix": 1_700_000_000.25, "ended_unix": 1_700_000_004.5},
    )
    failed = TrialRecord(
        number=4,
        status="oom",
        knobs=K.pytorch_defaults(64),
        metrics={},
        error_type="OutOfMemoryError",
        error="CUDA out of memory",
        info={"started_unix": 1_700_000_005.0, "ended_unix": 1_700_000_006.0},
    )
    client = MlflowClient(tracking.default_uri(tmp_path))
    run = client.get_run(tracker.log_trial(record))
    assert run.info.status == "FINISHED"  # not KILLED: its throughput was measured
    assert run.data.tags["status"] == "pruned" and run.data.tags["outcome"] == "pruned"
    assert (run.info.start_time, run.info.end_time) == (1_700_000_000_250, 1_700_000_004_500)  # 4.25 s, the trial's own
    assert run.data.metrics["samples_per_s"] == 40.0
    run = client.get_run(tracker.log_trial(failed))
    assert run.info.status == "FAILED" and run.data.tags["outcome"] == "failed"


def logged(run_dir, result):
    """A finished search logged as the driver logs it: its trials, then the parent run closed with the result."""
    tracker = tracking.Tracker(tracking.default_uri(run_dir), "autotune", run_dir, "s")
    tracker.log_search({f"space.{k}": v for k, v in result.space.search.items()}, {})
    for r in sorted(result.records, key=lambda r: r.number):
        r.mlflow_run_id = tracker.log_trial(r, result.baseline.knobs)
    tracker.finish({"speedup_x": result.speedup, "search_wall_s": result.wall_s}, [], result=result)
    return tracker, MlflowClient(tracking.default_uri(run_dir))


def first_screen(client, tracker):
    """The trials as the saved view lists them (tracking.trials_view): fastest first."""
    exp = client.get_experiment_by_name("autotune")
    view = tracking.trials_view(tracker.parent_run_id, [])
    return client.search_runs([exp.experiment_id], view["searchFilter"], order_by=["metrics.samples_per_s DESC"])


def test_the_first_screen_has_readable_metrics_and_the_remeasured_speedup_on_the_winners_row(tmp_path, monkeypatch):
    """The quickstart's search (tests/fixtures/runs) in a real MLflow store, read back: 4 significant figures,
    the re-measured 1.44x with its range on the winner's row (its trials read 1.84x), the answer as the parent
    run's description."""
    from autotune.export import answer as A
    from autotune.records.run_dir import read_run
    from tests.conftest import fixture_run

    run_dir = fixture_run("quickstart", tmp_path, monkeypatch)
    result = read_run(run_dir)
    tracker, client = logged(run_dir, result)
    rows = first_screen(client, tracker)
    assert [r.data.tags["trial_number"] for r in rows[:2]] == ["4", "3"]  # 8,188 and 5,915 samples/s
    winner = rows[0].data
    assert winner.metrics["samples_per_s"] == 8188.0 and winner.metrics["speedup_x"] == 1.841  # was 1.84107...
    assert (winner.tags[tracking.REMEASURED], winner.tags[tracking.PAIRS]) == ("1.44x", "1.34-1.53x")
    assert rows[0].info.run_name == "trial-004 (best)" and rows[2].info.run_name == "trial-000 (baseline)"
    assert (winner.metrics["remeasured_speedup_low_x"], winner.metrics["remeasured_speedup_high_x"]) == (1.343, 1.529)
    assert tracking.REMEASURED not in rows[1].data.tags  # the other rows: theirs alone
    for r in rows:
        # (MLflow stores an infinite CI, a pruned trial's, as the largest float)
        assert all(v == float(f"{v:.4g}") or v > 1e308 for v in r.data.metrics.values()), r.data.metrics
    assert {r.data.metrics["step_ms_mean"] for r in rows[:1]} == {7.817}
    parent = client.get_run(tracker.parent_run_id).data
    assert parent.tags["mlflow.note.content"] == A.description(
        A.of(result, absolute=True), f"autotune report {run_dir}"
    )
    assert parent.tags["mlflow.note.content"].startswith(
        "**speedup: 1.44x samples/s (1.34-1.53x, 2 pairs side by side); loss parity passed**\n\n"
        "best config: batch_size=64 (dynamics: learning rate x2), precision=bf16-mixed (numerics)\n\n```\n"
        f'cfg = autotune.load_config("{run_dir}/best_config.yaml")\n```\n\n'
        "- 3 pairs ran under outside load (other processes took 43-49% of the CPU): not counted\n"
    )
    assert parent.metrics["speedup_x"] == 1.436


def test_a_tie_marks_the_remeasured_row_and_the_baseline_kept(tmp_path, monkeypatch):
    from autotune.records.run_dir import read_run
    from tests.conftest import fixture_run

    result = read_run(fixture_run("tie", tmp_path, monkeypatch))
    tracker, client = logged(tmp_path / "run", result)
    rows = first_screen(client, tracker)
    cells = {r.info.run_name: (r.data.tags.get(tracking.REMEASURED), r.data.tags.get(tracking.PAIRS)) for r in rows}
    assert cells == {"trial-001": ("1.45x, tie", "0.666-1.59x"), "trial-000 (baseline, best)": ("kept, tie", None)}
