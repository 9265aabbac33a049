"""Scaling efficiency (autotune.records.scaling): which trials get it against the baseline's
one-rank reference, whatever order they finish in; recorded in trials.csv and a real
MLflow store. The measurement itself: tests/test_ranks.py and tests/test_cluster.py."""

import pandas as pd
import pytest

from autotune import knobs as K
from autotune.trial.result import DeviceInfo, TrialResult
from autotune.records.recorder import Recorder
from autotune.integrations.tracking import Tracker


def result(samples_per_s, reference=None):
    metrics = {
        "samples_per_s": samples_per_s,
        "ranks": 2,
        **({"scaling_reference_samples_per_s": reference} if reference else {}),
    }
    return TrialResult("ok", metrics=metrics, device=DeviceInfo("cpu", "cpu", 2))


def test_trials_finished_before_the_baseline_get_their_efficiency_when_it_lands(tmp_path):
    base = K.pytorch_defaults(8)
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "scaling", tmp_path, "scaling")
    recorder = Recorder(tracker, [], tmp_path / "trials.csv", None, base)
    # in parallel on a cluster: two trials land before the baseline does
    for number, knobs, rate in (
        (1, {"ddp_static_graph": True, "ddp_bucket_cap_mb": 1}, 150.0),
        (2, {"batch_size": 16}, 300.0),
    ):
        recorder.add({**base, **knobs, "trial_number": number}, result(rate), trial_dir=tmp_path / str(number))
    assert all("scaling_efficiency" not in r.metrics for r in recorder.records)  # no reference yet
    recorder.add({**base, "trial_number": 0}, result(160.0, reference=100.0), trial_dir=tmp_path / "0")
    recorder.add({**base, "sharding": "fsdp", "trial_number": 3}, result(120.0), trial_dir=tmp_path / "3")
    rows = pd.read_csv(tmp_path / "trials.csv").set_index("trial")
    # DDP/FSDP arguments alone differ: compared with the one-rank reference; a batch size differs: none
    assert rows.loc[1, "scaling_efficiency"] == pytest.approx(150 / 200)
    assert rows.loc[3, "scaling_efficiency"] == pytest.approx(120 / 200)
    assert pd.isna(rows.loc[2, "scaling_efficiency"])
    first = next(r for r in recorder.records if r.number == 1)
    assert tracker.client.get_run(first.mlflow_run_id).data.metrics["scaling_efficiency"] == pytest.approx(0.75)
