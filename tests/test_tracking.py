"""MLflow store creation and trial runs, read back through MlflowClient."""

from mlflow.tracking import MlflowClient

from autotune import knobs as K
from autotune.integrations import tracking
from autotune.records.run_dir import TrialRecord


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
