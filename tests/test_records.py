"""Records of a search: which trial is the best, and what may be compared."""

import dataclasses
import json
from pathlib import Path

from autotune import knobs as K
from autotune.records.run_dir import SearchResult, pruning_savings
from autotune.records.trial_record import TrialRecord
from autotune.records.best import pick_best, risk
from autotune.export.analysis import as_dict


def record(number, samples_per_s, device="NVIDIA H100 80GB HBM3", status="ok", wall=10.0, **knobs):
    return TrialRecord(
        number=number,
        status=status,
        knobs={**K.pytorch_defaults(32), **knobs},
        metrics={"samples_per_s": samples_per_s},
        is_baseline=number == 0,
        info={"device_name": device, "trial_wall_s": wall},
    )


def test_a_heterogeneous_cluster_never_mixes_device_types():
    records = [
        record(0, 100.0),
        record(1, 150.0, num_workers=4),
        record(2, 900.0, device="NVIDIA H200", num_workers=8),
    ]  # faster, but another GPU
    assert pick_best(records).number == 1
    space = K.Space(baseline=records[0].knobs, search={"num_workers": [0, 4, 8]}, fixed={}, dropped=[])
    d = as_dict(
        SearchResult(
            Path("."),
            space,
            K.Device("cuda", 16, "NVIDIA H100 80GB HBM3"),
            records,
            records[0],
            pick_best(records),
            1.0,
            {},
        )
    )
    assert d["speedup_x"] == 1.5 and d["trials_ok"] == 2
    assert d["other_devices"] == [{"trial": 2, "device_name": "NVIDIA H200", "host": None, "samples_per_s": 900.0}]
    assert [e["trials"] for e in d["knob_effects"]["num_workers"]] == [1, 1, 0]  # the H200 trial is not an effect


def test_pruning_savings_are_against_a_complete_trial():
    records = [record(0, 100.0, wall=10.0), record(1, 120.0, wall=12.0), record(2, 50.0, status="pruned", wall=4.0)]
    assert pruning_savings(records) == {"trials_pruned": 1, "pruning_saved_s": 8.0}  # median complete: 12 s
    assert pick_best(records).number == 1 and records[2].throughput is None


def timed(number, samples_per_s, ci, **knobs):
    r = record(number, samples_per_s, **knobs)
    r.metrics["step_mean_ci95"] = ci
    return r


def test_a_tie_inside_the_measured_uncertainty_goes_to_the_safer_config():
    # the quickstart's case: batch 256 + channels_last (dynamics) 1.26x +-6% vs channels_last (safe) 1.19x +-4%
    records = [
        timed(0, 100.0, 0.02),
        timed(1, 119.0, 0.04, channels_last=True),
        timed(2, 126.0, 0.06, batch_size=256, channels_last=True),
    ]
    best = pick_best(records)
    assert best.number == 1
    assert best.tie["faster_trial"] == 2 and (best.tie["faster_ci95"], best.tie["chosen_ci95"]) == (0.06, 0.04)
    assert best.tie["chosen_risk"] == "safe, no changed knobs above the safe class"
    assert best.tie["faster_risk"] == "dynamics, 1 changed knob above the safe class"
    assert "5.9% faster than #1" in best.tie["note"] and "95% CIs overlap" in best.tie["note"]
    assert records[2].tie is None


def test_a_clear_win_is_not_a_tie_and_fewer_knobs_break_a_tie_within_a_class():
    records = [
        timed(0, 100.0, 0.02),
        timed(1, 119.0, 0.01, channels_last=True),
        timed(2, 126.0, 0.01, batch_size=256, channels_last=True),
    ]  # 119*1.01 < 126*0.99: no overlap
    assert pick_best(records).number == 2 and pick_best(records).tie is None
    records = [
        timed(0, 100.0, 0.01),
        timed(1, 152.0, 0.05, precision="bf16-mixed", fused_optimizer=True),
        timed(2, 150.0, 0.05, precision="bf16-mixed"),
        timed(3, 153.0, 0.05, batch_size=256),
    ]
    best = pick_best(records)  # all tie: numerics beats dynamics, then one numerics knob beats two
    assert best.number == 2 and best.tie["faster_trial"] == 3
    # no better than the baseline within the noise: the baseline's own knobs win
    records = [timed(0, 100.0, 0.05), timed(1, 104.0, 0.05, num_workers=1)]
    assert pick_best(records).number == 0 and pick_best(records).tie["faster_trial"] == 1
    # unknown precision claims no tie
    assert pick_best([record(0, 100.0), record(1, 101.0, num_workers=1)]).number == 1


def test_loader_knobs_add_no_risk_to_a_tie():
    # jpeg_pipeline: channels_last 81.7 +-9% tied with 2 workers + channels_last 89.1 +-8%; counting the
    # workers as a risk exported the first, 0.84x of the second side by side
    records = [
        timed(0, 60.0, 0.02),
        timed(1, 81.7, 0.09, channels_last=True),
        timed(2, 89.1, 0.08, channels_last=True, num_workers=2, pin_memory=True),
    ]
    best = pick_best(records)
    assert best.number == 2 and best.tie is None
    records.append(timed(3, 95.0, 0.1, channels_last=True, num_workers=2, precision="bf16-mixed"))
    best = pick_best(records)  # a numerics knob still loses its tie to the safer config
    assert best.number == 2 and best.tie["faster_trial"] == 3
    assert best.tie["chosen_risk"] == "safe, no changed knobs above the safe class"
    assert best.tie["faster_risk"] == "numerics, 1 changed knob above the safe class"
    loader = timed(4, 61.0, 0.02, num_workers=2)  # the baseline's knobs still win a tie: a change needs a gain
    assert pick_best([records[0], loader]).number == 0 and pick_best([records[0], loader]).tie["faster_trial"] == 4


def test_safe_class_knobs_with_rounding_level_numerics_add_no_risk_to_a_tie():
    # jpeg_pipeline, 2026-11-26: bf16 + channels_last 162.6 +-5.3% tied with bf16 alone 151.4 +-8.2%; counting
    # channels_last as a risk exported bf16 alone, 0.89x of the two together side by side (5 pairs, 0.87-0.95)
    both = dict(num_workers=2, num_threads=1, precision="bf16-mixed")
    records = [
        timed(0, 88.7, 0.03),
        timed(2, 162.6, 0.053, channels_last=True, **both),
        timed(8, 151.4, 0.082, **both),
        timed(4, 172.0, 0.07, channels_last=True, set_to_none=False, **both),
    ]
    assert risk(records[3].knobs, records[0].knobs) == risk(records[2].knobs, records[0].knobs) == (2, 1, True)
    # ... but a knob whose change made no difference beyond the noise against the config without it is not exported
    # (issue 62): set_to_none=False (#4 against #2), then channels_last (#2 against #8), each inside the windows' CIs
    best = pick_best(records)
    assert best.number == 8 and best.tie["faster_trial"] == 4
    assert best.tie["note"].startswith("set_to_none=off (trial #4, 172 samples/s +-7.0%); channels_last=on (")
    records[2].metrics["step_mean_ci95"] = records[1].metrics["step_mean_ci95"] = 0.02  # known closer: they count
    assert pick_best(records).number == 2


def test_a_window_that_tied_with_a_safer_incumbent_is_neither_the_best_nor_a_gain():
    """The search gave the tie to the incumbent (`tie_kept`): the export,
    the live table and patience agree with it, whatever the window's mean."""
    from autotune.decide.stoppers import Patience

    kept = timed(2, 130.0, 0.01, precision="bf16-mixed")  # its window tied with #1 within the process spread
    kept.metrics.update(tied=1.0, tie_kept=1.0)
    records = [timed(0, 100.0, 0.01), timed(1, 120.0, 0.01, num_workers=1), kept]
    assert not kept.contends and records[1].contends
    best = pick_best(records)  # 120 +-1% and 130 +-1% do not overlap: the tie was its window's, with the spread
    assert best.number == 1 and best.tie["faster_trial"] == 2 and "tied with a safer incumbent" in best.tie["note"]
    stop = Patience(records, patience=1, min_improvement=0.02)
    assert stop.stop()  # #2 gained nothing
    kept.metrics.pop("tie_kept")
    assert pick_best(records).number == 2 and not stop.stop()


def test_a_trial_measured_under_outside_load_does_not_decide_the_winner():
    records = [record(0, 100.0), record(1, 130.0, num_workers=1), record(2, 180.0, num_workers=2)]
    records[2].info["disturbed"] = "other processes used 40% of the host's CPU time during the window"
    assert pick_best(records).number == 1  # the undisturbed contender, though slower
    records[1].info["disturbed"] = records[2].info["disturbed"]
    assert pick_best(records).number == 2  # every one disturbed: the fastest, for the re-measurement to decide


def test_search_state_reads_an_older_run_dir_and_writes_back_what_it_did_not_know(tmp_path):
    from autotune.records.state import SearchState

    old = {"name": "s", "space": {"search": {}}, "n_trials": 3, "mlflow_uri": None, "optuna_study": "s", "x_old": 1}
    (tmp_path / "search.json").write_text(json.dumps(old))
    state = SearchState.read(tmp_path)
    assert state.n_trials == 3 and state.wall_s is None and not state.finished and state.extra == {"x_old": 1}
    dataclasses.replace(state, wall_s=2.5, ended="3 trials").write(tmp_path)
    again = json.loads((tmp_path / "search.json").read_text())
    assert again["x_old"] == 1 and again["wall_s"] == 2.5 and "stopped_reason" not in again
    assert SearchState.read(tmp_path).finished and SearchState.read_or_none(tmp_path / "none") is None


def test_a_knob_that_made_no_difference_beyond_the_noise_falls_back_to_the_baselines_value():
    """A transformer's winner exported channels_last (issue 62): its change made no difference beyond the noise
    against the same config without it, so the config without it is the best, as a tie goes."""
    records = [
        timed(0, 100.0, 0.02),
        timed(1, 150.0, 0.02, precision="bf16-mixed"),
        timed(2, 152.0, 0.02, precision="bf16-mixed", channels_last=True),  # within the noise of #1
        timed(3, 180.0, 0.02, precision="bf16-mixed", channels_last=True, num_workers=2),
        timed(4, 179.0, 0.02, precision="bf16-mixed", num_workers=2),  # the winner without channels_last
    ]
    best = pick_best(records)
    assert best.number == 4 and not best.knobs["channels_last"]
    assert best.tie["faster_trial"] == 3 and best.tie["note"].startswith("channels_last=on (trial #3, 180")
    assert "made no difference beyond the noise" in best.tie["note"]
    records[4].metrics["samples_per_s"] = 150.0  # without it, clearly slower: channels_last counts
    assert pick_best(records).number == 3
    assert pick_best(records[:4]).number == 3  # the config without it never measured: nothing to fall back to
