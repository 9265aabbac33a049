"""Records of a search: which trial is the best, and what may be compared."""

from pathlib import Path

from autotune import knobs as K
from autotune.records import SearchResult, TrialRecord, pick_best, pruning_savings
from autotune.report import as_dict


def record(number, samples_per_s, device="NVIDIA H100 80GB HBM3", status="ok", wall=10.0, **knobs):
    return TrialRecord(number=number, status=status, knobs={**K.pytorch_defaults(32), **knobs},
                       metrics={"samples_per_s": samples_per_s}, is_baseline=number == 0,
                       info={"device_name": device, "trial_wall_s": wall})


def test_a_heterogeneous_cluster_never_mixes_device_types():
    records = [record(0, 100.0), record(1, 150.0, num_workers=4),
               record(2, 900.0, device="NVIDIA H200", num_workers=8)]  # faster, but another GPU
    assert pick_best(records).number == 1
    space = K.Space(baseline=records[0].knobs, search={"num_workers": [0, 4, 8]}, fixed={}, dropped=[])
    d = as_dict(SearchResult(Path("."), space, K.Device("cuda", 16, "NVIDIA H100 80GB HBM3"), records, records[0],
                             pick_best(records), 1.0, {}))
    assert d["speedup_x"] == 1.5 and d["trials_ok"] == 2
    assert d["other_devices"] == [{"trial": 2, "device_name": "NVIDIA H200", "host": None, "samples_per_s": 900.0}]
    assert [e["trials"] for e in d["knob_effects"]["num_workers"]] == [1, 1, 0]  # the H200 trial is not an effect


def test_pruning_savings_are_against_a_complete_trial():
    records = [record(0, 100.0, wall=10.0), record(1, 120.0, wall=12.0), record(2, 50.0, status="pruned", wall=4.0)]
    assert pruning_savings(records) == {"trials_pruned": 1, "pruning_saved_s": 8.0}  # median complete: 12 s
    assert pick_best(records).number == 1 and records[2].throughput is None
