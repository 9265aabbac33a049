"""The typed trial result (autotune.trial.result), end to end: real 1-rank and 2-rank
trials (tiny workloads, few steps, fresh processes) come back from the launcher as
TrialResults that round-trip through result.json and the transport to the driver;
the ranks' merge and the scaling reference return one; a key the contract lacks or a
wrong type is an error naming the key; result.json files written before still read.
About 25 s on 2 CPUs."""

import json
import os

import pytest

from autotune.execution.launcher import run_in_process
from autotune.records.run_dir import record_of, result_of, transport
from autotune.records.scaling import with_reference
from autotune.trial.ranks import merge
from autotune.trial.result import RankResult, ResultError, ScalingReference, TrialResult

pytestmark = pytest.mark.timeout(300)

SHORT = {"warmup_steps": 2, "measure_steps": 5, "min_window_s": 0.1, "max_window_s": 1.0, "device": "cpu", "seed": 0}


def run(config: dict, trial_dir) -> TrialResult:
    return run_in_process(config, trial_dir, timeout_s=240, pythonpath=os.getcwd())


def round_trips(result: TrialResult, trial_dir) -> TrialResult:
    """The launcher's TrialResult, its result.json (as the runner wrote it) and what crosses Ray are one."""
    assert isinstance(result, TrialResult)
    assert TrialResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result  # nothing lost, nothing added
    on_disk = json.loads((trial_dir / "result.json").read_text())  # the format: plain JSON, keys left out when None
    assert on_disk == {k: v for k, v in result.to_dict().items() if k not in ("trial_wall_s", "launcher")}
    assert TrialResult.read(trial_dir / "result.json").to_dict() == on_disk  # the launcher's two, in memory only
    assert result_of(json.loads(json.dumps(transport(3, trial_dir, result)))) == result
    return result


def test_a_one_rank_trial_round_trips(tmp_path):
    config = {
        **SHORT,
        "workload": {"name": "tiny_cnn"},
        "knobs": {"batch_size": 8, "num_threads": 1},
        "profile_steps": 2,
        "diagnose": True,
    }
    result = round_trips(run(config, tmp_path), tmp_path)
    assert result.ok and result.device.type == "cpu" and result.device.torch_threads == 1
    assert result.metric("samples_per_s") > 0 and result.diagnosis["bottleneck"] and result.profile
    assert result.ranks is None and result.launcher == "fork" and result.phases_s["window"] > 0
    record = record_of(3, result.knobs, result, tmp_path)
    assert record.throughput == result.metrics["samples_per_s"] and record.info["device_name"] == "cpu"
    # the ranks' merge of two real rank results (this one as rank 0 and 1; rank 1 the slower): one TrialResult
    slow = {**result.metrics, "samples_per_s": result.metrics["samples_per_s"] / 2}
    ranks = [
        TrialResult.from_dict({**result.to_dict(), "rank": 1, "metrics": slow}),
        TrialResult.from_dict({**result.to_dict(), "rank": 0}),
    ]
    merged = merge(ranks)
    assert isinstance(merged, TrialResult) and merged.ok and merged.rank is None and merged.knobs == result.knobs
    assert merged.metric("samples_per_s") == pytest.approx(1.5 * result.metrics["samples_per_s"])
    assert merged.metric("ranks") == 2 and merged.metric("rank_samples_per_s_min") == slow["samples_per_s"]
    assert [(r.rank, r.status) for r in merged.ranks] == [(0, "ok"), (1, "ok")]
    assert all(isinstance(r, RankResult) for r in merged.ranks)
    assert TrialResult.from_dict(merged.to_dict()) == merged


def test_a_two_rank_trial_and_its_scaling_reference_round_trip(tmp_path):
    config = {
        **SHORT,
        "workload": {"name": "tiny_transformer", "args": {"batch_size": 8}},
        "knobs": {},
        "ranks": 2,
        "profile_steps": 0,
        "diagnose": True,
    }
    result = round_trips(run(config, tmp_path), tmp_path)  # the ranks' merge, as the launcher returns it
    result = with_reference(result, config, run, tmp_path, rank_threads=1)  # a baseline's one-rank reference
    assert isinstance(result.scaling_reference, ScalingReference)
    assert TrialResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    assert result.ok and result.metric("ranks") == 2 and result.diagnosis
    assert [r.rank for r in result.ranks] == [0, 1] and all(r.status == "ok" and r.host for r in result.ranks)
    assert result.ranks[1].metrics["window_steps"] == result.ranks[0].metrics["window_steps"] >= 5
    ref = result.scaling_reference
    assert ref.status == "ok" and ref.samples_per_s == result.metric("scaling_reference_samples_per_s") > 0


def test_a_failed_trial_and_an_old_result_json_read(tmp_path):
    # what a trial killed before it wrote anything leaves (autotune.execution.launcher); no knobs, no metrics
    died = {
        "status": "error",
        "error_type": "TrialProcessDied",
        "error": "exited with code 1",
        "trial_wall_s": 0.5,
        "launcher": "fork",
    }
    assert TrialResult.from_dict(died).to_dict() == died
    # result.json as the runner wrote it before the typed contract: its dict as is, key order included
    old = {
        "status": "oom",
        "knobs": {"batch_size": 8},
        "device": {"type": "cpu", "name": "cpu", "cpus": 2},
        "host": "h",
        "torch": "2.5",
        "metrics": {"mem_rss_peak_gib": 1.5, "step_ms_mean": None},
        "error_type": "OutOfMemoryError",
        "error": "out of memory",
        "traceback": "...",
        "trial_s": 1.0,
        "parity": {"passed": False, "reason": "late", "steps": 0, "max_rel_dev": None},
        "parity_late": True,
    }
    (tmp_path / "result.json").write_text(json.dumps(old, indent=2) + "\n")
    assert TrialResult.read(tmp_path / "result.json").to_dict() == old


@pytest.mark.parametrize(
    "change, key",
    [
        ({"bottleneck": "input"}, "`bottleneck`"),  # a key the contract lacks
        ({"metrics": {"samples_per_s": "fast"}}, "`metrics.samples_per_s` must be a number"),
        ({"status": None}, "`status` must be str"),
        ({"device": {"type": "cpu", "name": "cpu"}}, "`device.cpus` is missing"),
        ({"ranks": [{"rank": 0, "status": "ok", "host": "h", "metrics": {}, "gpu": 0}]}, "`ranks[0].gpu`"),
        ({"ranks": [{"rank": "0", "status": "ok", "host": "h", "metrics": {}}]}, "`ranks[0].rank` must be an integer"),
        ({"optimizer_fused": 1}, "`optimizer_fused` must be bool"),
    ],
)
def test_an_unknown_key_or_a_wrong_type_names_the_key(tmp_path, change, key):
    with pytest.raises(ResultError, match=key.replace("[", r"\[").replace("]", r"\]")):
        TrialResult.from_dict({"status": "ok", "metrics": {}, **change})
    (tmp_path / "result.json").write_text(json.dumps({"status": "ok", **change}))
    with pytest.raises(ResultError, match="result.json: "):  # the file is named too
        TrialResult.read(tmp_path / "result.json")
