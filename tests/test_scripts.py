"""The measurement scripts run on a CPU (GPU parts skipped) and end with one JSON line."""

import csv
import json
import os
import subprocess
import sys

import pytest


@pytest.mark.timeout(300)
def test_gpu_check_runs_on_cpu_and_reports_fidelity():
    env = {**os.environ, "PYTHON": sys.executable, "REPS": "2", "FIDELITY_ARGS": "--min-window-s 0.3 --max-window-s 1"}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], capture_output=True, text=True, env=env, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    fidelity = report["fidelity"]
    assert fidelity["device_type"] == "cpu" and fidelity["reps"] == 2
    for key in ("cv_throughput", "trial_vs_plain_ratio", "profiler_overhead"):
        assert isinstance(fidelity[key], float), key
    assert 0.5 < fidelity["trial_vs_plain_ratio"] < 2  # the same job, measured two ways
    assert report["classic"] == {"skipped": "no CUDA device"}
    assert "throughput CV over 2 fresh trials" in proc.stderr


@pytest.mark.timeout(300)
def test_record_a_landscape_then_replay_it(tmp_path):
    out = tmp_path / "landscape.csv"
    record = [sys.executable, "scripts/record_landscape.py", "-o", str(out), "--workload", "tiny_cnn",
              "--grid", "batch_size=16,32", "--grid", "channels_last=false,true", "--grid", "pin_memory=false,true",
              "--cpus", "1", "--trial", "min_window_s=0.2", "--trial", "max_window_s=0.5"]
    proc = subprocess.run(record, capture_output=True, text=True, timeout=250)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dropped pin_memory=True: pinned memory only speeds host-to-GPU copies; no CUDA device" in proc.stdout
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 4 and all(r["status"] == "ok" and float(r["samples_per_s"]) > 0 for r in rows)
    assert all(float(r["trial_wall_s"]) > float(r["window_s"]) for r in rows)  # a trial's cost includes its warm-up
    baseline = [r for r in rows if r["bottleneck"]]  # PyTorch defaults at the workload's batch, diagnosed
    assert [(b["batch_size"], b["channels_last"]) for b in baseline] == [("32", "false")]

    again = subprocess.run(record, capture_output=True, text=True, timeout=60)
    assert "4 points recorded, 0 to go" in again.stdout  # recorded points are never measured twice
    assert len(list(csv.DictReader(out.open()))) == 4

    bench = subprocess.run([sys.executable, "scripts/bench_search.py", str(out), "--seeds", "3"],
                           capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0, bench.stderr[-3000:]
    report = json.loads(bench.stdout.strip().splitlines()[-1])["landscapes"]["landscape"]
    assert report["points"] == 4
    for strategy in ("autotune", "random", "tpe"):
        assert 1 <= report[strategy]["median_trials_to_95"] <= 4 and report[strategy]["median_seconds_to_95"] > 0


def test_bench_search_replays_the_committed_landscapes():
    proc = subprocess.run([sys.executable, "scripts/bench_search.py", "--seeds", "5"], capture_output=True, text=True,
                          timeout=250)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])["landscapes"]
    assert {"h100_resnet18_classic", "cpu2_tiny_cnn"} <= set(report)
    for entry in report.values():
        assert {"autotune", "random", "tpe"} <= set(entry) and entry["points"] >= 36


@pytest.mark.timeout(300)
def test_bench_exported_remeasures_baseline_and_best_in_a_plain_loop(finished_run):
    run_dir, _ = finished_run
    proc = subprocess.run([sys.executable, "scripts/bench_exported.py", str(run_dir), "--reps", "2", "--warmup", "2",
                           "--window-s", "0.5"], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["plain"]["range"]["best"]) == 2 and report["plain"]["baseline"] > 0
    # the same jobs measured two ways, compared (the script, not a test, judges the 5% target: timings vary)
    search, plain = report["search"], report["plain"]
    assert report["search_vs_plain"]["best"] == pytest.approx(search["best"] / plain["best"])
    assert report["speedup_claimed_vs_plain"] == pytest.approx(search["speedup_x"] / plain["speedup_x"])
    assert "speedup" in proc.stdout and "(target: within 5%)" in proc.stdout


@pytest.mark.timeout(300)
def test_bench_fused_measures_each_optimizer_unfused_and_fused_side_by_side():
    bench = [sys.executable, "scripts/bench_fused.py", "--model", "tiny_cnn", "--image-size", "16", "--batch-size", "8",
             "--reps", "1", "--warmup", "2", "--measure-steps", "3", "--min-window-s", "0.2", "--max-window-s", "0.5",
             "--precision", "32-true", "--no-channels-last"]
    proc = subprocess.run([*bench, "--optimizers", "sgd,adamw"], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (report["model"], report["reps"], set(report["effects"])) == ("tiny_cnn", 1, {"sgd", "adamw"})
    for name, cls in (("sgd", "SGD"), ("adamw", "AdamW")):
        unfused, fused = report["runs"][name]  # each a fresh trial process, and what ran in it
        assert (unfused["optimizer"], unfused["fused"], fused["optimizer"], fused["fused"]) == (cls, False, cls, True)
        effect = report["effects"][name]
        assert effect["speedup_x"] == pytest.approx(fused["samples_per_s"] / unfused["samples_per_s"], rel=1e-3)
        assert effect["saved_ms_per_step"] == pytest.approx(unfused["step_ms"] - fused["step_ms"], abs=1e-2)
    assert "fused/unfused (pairs)" in proc.stdout
    refused = subprocess.run([*bench, "--optimizers", "sgd,rmsprop"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "--optimizers: rmsprop not allowed; torch fuses: sgd, adam, adamw, adagrad" in refused.stderr


def test_bench_checkpointing_measures_both_sides_and_the_ladder_under_a_cap():
    bench = [sys.executable, "scripts/bench_checkpointing.py", "--batch-size", "4", "--seq-len", "16", "--reps", "1",
             "--steps", "2", "--cap-gib", "0.05", "--ladder", "4,8"]
    proc = subprocess.run(bench, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    (pair,) = report["pairs"]
    assert pair["off"]["status"] == pair["on"]["status"] == "ok" and pair["on"]["rss_gib"] > 0
    assert report["step_time_ratio_on_off"] == pytest.approx(pair["on"]["step_ms"] / pair["off"]["step_ms"])
    assert report["ladder"] == {"off": None, "on": None}  # 0.05 GiB: no batch fits either way
    assert "ladder ckpt=True batch 4: oom" in proc.stdout
