"""The typed trial result (autotune.result): real 1-rank and 2-rank trials (tiny
workloads, few steps, fresh processes) round-trip through it, result.json and the
transport to the driver; a key the contract lacks or a wrong type is an error
naming the key. About 25 s on 2 CPUs."""

import json
import os

import pytest

from autotune.execution.launcher import run_in_process
from autotune.records.run_dir import received, record_of, transport
from autotune.trial.result import ResultError, TrialResult
from autotune.records.scaling import with_reference

pytestmark = pytest.mark.timeout(300)

SHORT = {"warmup_steps": 2, "measure_steps": 5, "min_window_s": 0.1, "max_window_s": 1.0, "device": "cpu", "seed": 0}


def run(config: dict, trial_dir) -> dict:
    return run_in_process(config, trial_dir, timeout_s=240, pythonpath=os.getcwd())


def round_trips(raw: dict, trial_dir) -> TrialResult:
    """The runner's dict, its result.json and what crosses Ray all read as one TrialResult."""
    result = TrialResult.from_dict(raw)
    assert result.to_dict() == raw  # nothing lost, nothing added
    assert TrialResult.read(trial_dir / "result.json").to_dict() == {
        k: v for k, v in raw.items() if k not in ("trial_wall_s", "launcher")
    }  # the launcher's, in memory
    assert received(json.loads(json.dumps(transport(3, trial_dir, result)))) == result
    return result


def test_a_one_rank_trial_round_trips(tmp_path):
    config = {
        **SHORT,
        "workload": {"name": "tiny_cnn"},
        "knobs": {"batch_size": 8, "num_threads": 1},
        "profile_steps": 2,
        "diagnose": True,
    }
    raw = run(config, tmp_path)
    result = round_trips(raw, tmp_path)
    assert result.ok and result.device.type == "cpu" and result.device.torch_threads == 1
    assert result.metric("samples_per_s") > 0 and result.diagnosis["bottleneck"] and result.profile
    assert result.ranks is None and result.launcher == "fork"
    record = record_of(3, result.knobs, result, tmp_path)
    assert record.throughput == raw["metrics"]["samples_per_s"] and record.info["device_name"] == "cpu"


def test_a_two_rank_trial_and_its_scaling_reference_round_trip(tmp_path):
    config = {
        **SHORT,
        "workload": {"name": "tiny_transformer", "args": {"batch_size": 8}},
        "knobs": {},
        "ranks": 2,
        "profile_steps": 0,
        "diagnose": True,
    }
    raw = run(config, tmp_path)
    round_trips(raw, tmp_path)
    raw = with_reference(raw, config, run, tmp_path, rank_threads=1)  # a baseline's one-rank reference (in memory)
    result = TrialResult.from_dict(raw)
    assert result.to_dict() == raw
    assert result.ok and result.metric("ranks") == 2 and result.diagnosis
    assert [r.rank for r in result.ranks] == [0, 1] and all(r.status == "ok" and r.host for r in result.ranks)
    assert result.ranks[1].metrics["window_steps"] == result.ranks[0].metrics["window_steps"] >= 5
    ref = result.scaling_reference
    assert ref.status == "ok" and ref.samples_per_s == result.metric("scaling_reference_samples_per_s") > 0


def test_a_failed_trial_and_an_old_result_json_read(tmp_path):
    # what a trial killed before it wrote anything leaves (autotune.launcher); no knobs, no metrics
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
