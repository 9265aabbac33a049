"""The measurement scripts run on a CPU (GPU parts skipped) and end with one JSON line."""

import csv
import json
import os
import runpy
import shlex
import statistics
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone

import pytest
import yaml


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gpu_check_runs_on_cpu_and_reports_fidelity():
    env = {**os.environ, "PYTHON": sys.executable, "REPS": "2", "FIDELITY_ARGS": "--min-window-s 0.3 --max-window-s 1"}
    proc = subprocess.run(["bash", "scripts/gpu/gpu_check.sh"], capture_output=True, text=True, env=env, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    fidelity = report["fidelity"]
    assert fidelity["device_type"] == "cpu" and fidelity["reps"] == 2
    for key in ("cv_throughput", "trial_vs_plain_ratio", "profiler_overhead"):
        assert isinstance(fidelity[key], float), key
    assert 0.5 < fidelity["trial_vs_plain_ratio"] < 2  # the same job, measured two ways
    assert report["classic"] == {"skipped": "no CUDA device"}
    assert "throughput CV over 2 fresh trials" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_record_a_landscape_then_replay_it(tmp_path):
    out = tmp_path / "landscape.csv"
    record = [
        sys.executable,
        "scripts/dev/record_landscape.py",
        "-o",
        str(out),
        "--workload",
        "tiny_cnn",
        "--grid",
        "batch_size=16,32",
        "--grid",
        "channels_last=false,true",
        "--grid",
        "pin_memory=false,true",
        "--cpus",
        "1",
        "--trial",
        "min_window_s=0.2",
        "--trial",
        "max_window_s=0.5",
    ]
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

    bench = subprocess.run(
        [sys.executable, "scripts/bench/bench_search.py", str(out), "--seeds", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bench.returncode == 0, bench.stderr[-3000:]
    report = json.loads(bench.stdout.strip().splitlines()[-1])["landscapes"]["landscape"]
    assert report["points"] == 4
    for strategy in ("autotune", "random", "tpe"):
        assert 1 <= report[strategy]["median_trials_to_95"] <= 4 and report[strategy]["median_seconds_to_95"] > 0


@pytest.mark.slow  # 20 s a seed; CI tier: test_strategy's climb and test_model's rate model on the same records
def test_bench_search_replays_the_committed_landscapes():
    proc = subprocess.run(
        [sys.executable, "scripts/bench/bench_search.py", "--seeds", "1"], capture_output=True, text=True, timeout=250
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])["landscapes"]
    assert {"h100_resnet18_classic", "cpu2_tiny_cnn"} <= set(report)
    for entry in report.values():
        assert {"autotune", "random", "tpe"} <= set(entry) and entry["points"] >= 36


def test_bench_model_replays_a_recorded_search_with_both_models(finished_run):
    run_dir, _ = finished_run
    proc = subprocess.run(
        [sys.executable, "scripts/bench/bench_model.py", str(run_dir)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    run = report["runs"][str(run_dir)]
    assert report["all"]["trials"] == run["trials"] == len(run["per_trial"])
    if run["trials"]:  # each row: trial, before, now, measured; the medians are over those rows
        errors = sorted(abs(m / now - 1) for _, _, now, m in run["per_trial"])
        assert run["now"] == pytest.approx(statistics.median(errors), abs=1e-3)
    assert "before" in proc.stdout and "now" in proc.stdout


@pytest.mark.slow  # CI tier: test_instrument's autotune run applies a best_config to a plain program
@pytest.mark.timeout(300)
def test_bench_exported_remeasures_baseline_and_best_in_a_plain_loop(finished_run):
    run_dir, _ = finished_run
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/bench/bench_exported.py",
            str(run_dir),
            "--reps",
            "2",
            "--warmup",
            "2",
            "--window-s",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["plain"]["range"]["best"]) == 2 and report["plain"]["baseline"] > 0
    # the same jobs measured two ways, compared (the script, not a test, judges the 5% target: timings vary)
    search, plain = report["search"], report["plain"]
    assert report["search_vs_plain"]["best"] == pytest.approx(search["best"] / plain["best"])
    assert report["speedup_claimed_vs_plain"] == pytest.approx(search["speedup_x"] / plain["speedup_x"])
    assert "speedup" in proc.stdout and "(target: within 5%)" in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_fused_measures_each_optimizer_unfused_and_fused_side_by_side():
    bench = [
        sys.executable,
        "scripts/bench/bench_fused.py",
        "--model",
        "tiny_cnn",
        "--image-size",
        "16",
        "--batch-size",
        "8",
        "--reps",
        "1",
        "--warmup",
        "2",
        "--measure-steps",
        "3",
        "--min-window-s",
        "0.2",
        "--max-window-s",
        "0.5",
        "--precision",
        "32-true",
        "--no-channels-last",
    ]
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


def test_bench_llm_rows_say_what_a_device_cannot_run_and_read_a_searchs_winner(tmp_path):
    bench = runpy.run_path("scripts/bench/bench_llm.py", run_name="bench_llm")
    from autotune import knobs as K

    cpu, h100 = K.Device("cpu", 2), K.Device("cuda", 16, "NVIDIA H100", (9, 0))
    rows = {r.name: r for r in bench["knob_rows"]("cpu", cpu)}
    assert "attention=sdpa" not in rows and "activation_checkpointing=full" not in rows  # the script's own
    assert rows["attention=eager"].why_not is None and rows["padding_free=True"].why_not is None
    assert "CUDA only" in rows["liger_kernels=True"].why_not and "CUDA only" in rows["float8=rowwise"].why_not
    assert "no backward pass on the CPU" in rows["attention=flex_attention"].why_not
    assert (rows["micro-batch 4 x 2"].knobs, rows["micro-batch 4 x 2"].accum) == ({"batch_size": 4}, 2)
    recipe, runs = bench["recipe_rows"](cpu)
    assert recipe.knobs["attention"] == "sdpa" and "liger_kernels=True" in recipe.why_not  # no flash, no Liger here
    assert runs.name == "recipe (this device)" and runs.why_not is None
    assert runs.knobs == {k: v for k, v in recipe.knobs.items() if k != "liger_kernels"}
    # on a GPU without liger-kernel or flash-attn installed (autotune installs nothing): sdpa, and not run
    (gpu_recipe, gpu_runs) = bench["recipe_rows"](h100)
    assert gpu_recipe.knobs["attention"] == "sdpa" and "liger-kernel is not installed" in gpu_recipe.why_not
    best = tmp_path / "best_config.yaml"
    best.write_text(
        yaml.safe_dump(
            {
                "knobs": {"batch_size": 2, "attention": "eager", "padding_free": True},
                "safety": [
                    {"knob": "batch_size", "baseline": 8, "tuned": 2, "safety": "numerics"},
                    {"knob": "padding_free", "baseline": False, "tuned": True, "safety": "numerics"},
                ],
            }
        )
    )
    winner = bench["found_row"](best)
    assert (winner.knobs, winner.accum) == ({"batch_size": 2, "padding_free": True}, 4)  # the effective batch kept


def test_bench_llm_refuses_a_found_row_without_its_best_config():
    refused = subprocess.run(
        [sys.executable, "scripts/bench/bench_llm.py", "--parts", "found"], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2 and "--parts found needs --found BEST_CONFIG_YAML" in refused.stderr


def test_gpu_day_dry_run_lists_each_step_with_its_cap_command_and_files():
    proc = subprocess.run(
        ["bash", "scripts/gpu/gpu_day.sh", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plan = json.loads(proc.stdout.strip().splitlines()[-1])
    keys = [s["step"] for s in plan["steps"]]
    assert keys == [
        "1-fidelity",
        "2-classic",
        "3-search",
        "3b-classic-found",
        "3c-lm-search",
        "3d-lm-found",
        "4-parity",
        "5-fused",
        "6-overhead",
        "6b-lm-knobs",
        "7-landscape",
    ]  # the issues' priority order: the language-model step after the classic search, before the parity rows
    assert plan["budget_s"] == 75 * 60 and sum(s["cap_s"] for s in plan["steps"][:-1]) <= plan["budget_s"]
    lm = {s["step"]: s for s in plan["steps"] if "-lm-" in s["step"]}
    caps = {s["step"]: s["cap_s"] for s in plan["steps"][:-1]}
    assert caps["3c-lm-search"] <= 13 * 60 and caps["3d-lm-found"] + caps["4-parity"] <= 13 * 60  # a loan each
    assert lm["3c-lm-search"]["command"][:5] == ["scripts/bench/bench_llm.py", "--size", "gpu", "--parts", "search"]
    found = lm["3d-lm-found"]["command"]
    assert found[found.index("--found") + 1].endswith("/lm-search/best_config.yaml")  # what 3c leaves (finish)
    assert any(w.endswith("/lm-search/best_config.yaml") for w in lm["3c-lm-search"]["writes"])
    assert plan["steps"][-1]["cap_s"] is None and "cap: the rest of the budget" in proc.stdout  # the landscape
    for step in plan["steps"]:
        assert step["parses"] == "ok", step  # each command line parses (and the search's spec reads) without a GPU
        assert f"{plan['dir']}/{step['step']}.json" in step["writes"]
        assert f"{step['step']}: " in proc.stdout and shlex.join(["python3", *step["command"]]) in proc.stdout
    fidelity = plan["steps"][0]["command"]
    assert fidelity[:3] == ["scripts/bench/bench_fidelity.py", "--workload", "resnet18_cifar"]
    assert "precision=bf16-mixed" in fidelity and "batch_size=256" in fidelity
    assert "scripts/bench/landscapes/<gpu>_resnet18_gpunorm.csv" in plan["steps"][-1]["writes"]
    assert "11 of 11 steps parse" in proc.stdout

    short = subprocess.run(
        ["bash", "scripts/gpu/gpu_day.sh", "--dry-run", "--budget-min", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert short.returncode == 2 and short.stderr.strip() == "error: --budget-min 0: must be > 0 (minutes)"
    typo = subprocess.run(
        ["bash", "scripts/gpu/gpu_day.sh", "--dry-run", "--redo", "9"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert (
        typo.returncode == 2
        and typo.stderr.strip() == "error: --redo 9: not a step; steps: 1, 2, 3, 3b, 3c, 3d, 4, 5, 6, 6b, 7"
    )


def test_gpu_day_runs_steps_in_order_records_failures_and_skips_what_is_done(tmp_path, monkeypatch):
    day = runpy.run_path("scripts/gpu/gpu_day.py", run_name="gpu_day")
    Step = day["Step"]
    typo = Step("x", "a typo", 60, [sys.executable, "scripts/bench/bench_fused.py", "--optimiser", "sgd"])
    assert day["check_parses"](typo) == "does not parse (exit 2)"  # caught by the dry run, before a GPU is lent

    ok = [sys.executable, "-c", "print('measured'); print('{\"x\": 1}')"]
    plan = [
        Step("1-fails", "exits 3", 60, [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]),
        Step("2-hangs", "outlives its cap", 1.5, [sys.executable, "-c", "import time; time.sleep(60)"]),
        Step("3-ok", "prints its JSON line", 60, ok),
        Step("4-too-long", "its cap does not fit the budget", 3600, ok),
    ]
    (tmp_path / "day.json").write_text(json.dumps({"gpu": "cpu", "started": "2026-11-24T00:00:00+00:00"}))
    monkeypatch.delenv("OUT", raising=False)
    assert day["run_day"](tmp_path, "cpu", 600, set(), plan) == 0
    records = {s.key: json.loads((tmp_path / f"{s.key}.json").read_text()) for s in plan[:3]}
    assert (records["1-fails"]["status"], records["1-fails"]["returncode"]) == ("failed", 3)
    assert "boom" in records["1-fails"]["error"]
    assert records["2-hangs"]["status"] == "timeout" and records["2-hangs"]["wall_s"] < 30
    assert records["3-ok"]["status"] == "ok" and records["3-ok"]["result"] == {"x": 1}
    assert "measured" in (tmp_path / "3-ok.log").read_text()
    assert not (tmp_path / "4-too-long.json").exists()  # not recorded: a later run does it
    readme = (tmp_path / "README.md").read_text()
    assert "| 1-fails | exits 3 | failed |" in readme
    assert "| 4-too-long | its cap does not fit the budget | not run |" in readme

    plan[2].argv = [sys.executable, "-c", "raise SystemExit('run twice')"]
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    assert day["run_day"](tmp_path, "cpu", 600, {"1"}, plan) == 0  # --redo 1: only step 1 runs again
    assert json.loads((tmp_path / "3-ok.json").read_text())["status"] == "ok"
    with tarfile.open(tmp_path / "out" / "gpu_day.tar.gz") as tar:  # what a device command brings back
        names = tar.getnames()
    assert {"3-ok.json", "README.md", "1-fails.log"} <= {n.rsplit("/", 1)[-1] for n in names}


def test_gpu_day_fits_a_short_loan_runs_only_the_steps_named_and_sees_its_detached_day_end(tmp_path, monkeypatch):
    """A 15-minute loan: --only 3 --only 3b --search-min 5 (the H200 day of 2026-11-26). The
    waiting command found its own ended day alive (a zombie) and held the GPU to its deadline."""
    day = runpy.run_path("scripts/gpu/gpu_day.py", run_name="gpu_day")
    Step = day["Step"]
    search = next(s for s in day["steps"](tmp_path, "h200", 300) if s.key == "3-search")
    assert search.cap_s == 480 and search.spec["search"]["time_budget_s"] == 300 and "5-minute" in search.what
    ok = [sys.executable, "-c", "print('{\"x\": 1}')"]
    plan = [Step("1-a", "not named", 60, ok), Step("3-b", "named", 60, ok), Step("3b-c", "named too", 60, ok)]
    (tmp_path / "day.json").write_text(json.dumps({"gpu": "cpu", "started": "2026-11-26T00:00:00+00:00"}))
    monkeypatch.delenv("OUT", raising=False)
    assert day["run_day"](tmp_path, "cpu", 600, set(), plan, {"3", "3b"}) == 0
    assert (
        not (tmp_path / "1-a.json").exists() and (tmp_path / "3-b.json").exists() and (tmp_path / "3b-c.json").exists()
    )
    assert "| 1-a | not named | not run |" in (tmp_path / "README.md").read_text()  # the day's table lists them all

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    (tmp_path / "day.pid").write_text(str(child.pid))
    time.sleep(1)  # ended, not reaped
    assert day["alive"](tmp_path / "day.pid") is None
    (tmp_path / "day.pid").write_text(str(os.getpid()))  # a process that is not this one's child, running
    assert day["alive"](tmp_path / "day.pid") == os.getpid()
    typo = subprocess.run(
        ["bash", "scripts/gpu/gpu_day.sh", "--dry-run", "--only", "8"], capture_output=True, text=True, timeout=120
    )
    assert (
        typo.returncode == 2
        and typo.stderr.strip() == "error: --only 8: not a step; steps: 1, 2, 3, 3b, 3c, 3d, 4, 5, 6, 6b, 7"
    )


def test_gpu_day_keeps_the_lm_searchs_small_files_and_leaves_its_model_behind(tmp_path, monkeypatch):
    """3c's search runs in the day's lm/ (the 134M Llama's weights, its texts, the trials): its trials.csv,
    search.json and best_config.yaml are kept in lm-search/ (3d reads the winner there, on this machine or the
    next, from the unpacked tree), and lm/ is not packed."""
    day = runpy.run_path("scripts/gpu/gpu_day.py", run_name="gpu_day")
    step = next(s for s in day["steps"](tmp_path, "h200") if s.key == "3c-lm-search")
    run = tmp_path / "lm" / "run"
    run.mkdir(parents=True)
    for name in ("trials.csv", "search.json", "best_config.yaml", "optuna.db"):
        (run / name).write_text(name)
    (tmp_path / "lm" / "model.safetensors").write_text("weights")
    day["finish"](step, tmp_path)
    assert sorted(f.name for f in (tmp_path / "lm-search").iterdir()) == [
        "best_config.yaml",
        "search.json",
        "trials.csv",
    ]
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    day["collect"](tmp_path, "h200")
    with tarfile.open(tmp_path / "out" / "gpu_day.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("lm-search/best_config.yaml") for n in names)
    assert not any("/lm/" in n or n.endswith("/lm") for n in names)


def test_classic_case_runs_the_found_config_with_its_searched_workload_args(tmp_path):
    """It read workload.args alone: the H200 search's winner (gpu_normalize searched) ran on the
    host pipeline and measured 0.28x the hand-tuned end state, input-bound."""
    classic = runpy.run_path("scripts/gpu/classic_case.py", run_name="classic")
    best = tmp_path / "best_config.yaml"
    best.write_text(
        yaml.safe_dump(
            {
                "workload": {"ref": "resnet18_cifar", "args": {"batch_size": 32}},
                "device": {"type": "cpu"},
                "knobs": {"num_workers": 8, "batch_size": 1024},
                "workload_args": {"gpu_normalize": True},
            }
        )
    )
    cases = classic["cases"](8, best)
    assert list(cases) == ["defaults", "hand-tuned end state", "found by autotune"]
    args, knobs = cases["found by autotune"]
    assert args == {"batch_size": 32, "gpu_normalize": True} and knobs["batch_size"] == 1024


def test_gpu_day_writes_outside_the_tree_goes_on_from_what_was_unpacked_and_packs_the_trees_paths(
    tmp_path, monkeypatch
):
    """The device tool makes each command's tree a copy of the checkout's: a day writing
    there lost its search's log. It writes in LIVE and packs what the tree will hold."""
    day = runpy.run_path("scripts/gpu/gpu_day.py", run_name="gpu_day")
    g, repo = day["seed"].__globals__, tmp_path / "repo"
    for name, value in {
        "ROOT": repo,
        "MEASUREMENTS": repo / "scripts" / "measurements",
        "LIVE": tmp_path / "live",
    }.items():
        monkeypatch.setitem(g, name, value)
    unpacked = repo / "scripts" / "measurements" / "h100-80gb-hbm3-2026-11-24"
    (unpacked / "search").mkdir(parents=True)
    (unpacked / "day.json").write_text(
        json.dumps({"gpu": "h100-80gb-hbm3", "started": datetime.now(timezone.utc).isoformat()})
    )
    (unpacked / "1-fidelity.json").write_text('{"status": "ok"}')
    (unpacked / "search" / "trials.csv").write_text("trial\n0\n")
    (repo / "scripts" / "bench" / "landscapes").mkdir(parents=True)
    (repo / "scripts" / "bench" / "landscapes" / "h100_resnet18_gpunorm.csv").write_text("point\n0\n")

    live = day["day_dir"]("h100-80gb-hbm3")  # not finished: this day goes on, in LIVE
    assert live == tmp_path / "live" / unpacked.name
    live.mkdir(parents=True)
    (live / "2-classic.json").write_text('{"status": "ok"}')  # this machine's, newer than the tree's copy
    day["seed"](live, "h100-80gb-hbm3")
    assert (live / "1-fidelity.json").read_text() == '{"status": "ok"}' and (live / "search" / "trials.csv").exists()
    (live / "h100_resnet18_gpunorm.csv").write_text("point\n0\n1\n")  # a point measured here
    day["seed"](live, "h100-80gb-hbm3")
    assert (live / "h100_resnet18_gpunorm.csv").read_text() == "point\n0\n1\n"  # what is live is kept
    (live / "run" / "trials").mkdir(parents=True)
    (live / "run" / "trials" / "trace.json").write_text("{}")
    (live / "day.pid").write_text("1")
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    day["collect"](live, "h100-80gb-hbm3")
    with tarfile.open(tmp_path / "out" / "gpu_day.tar.gz") as tar:
        names = set(tar.getnames())
        landscape = tar.extractfile("scripts/bench/landscapes/h100_resnet18_gpunorm.csv").read()
    rel = "scripts/measurements/h100-80gb-hbm3-2026-11-24"
    assert {f"{rel}/day.json", f"{rel}/1-fidelity.json", f"{rel}/2-classic.json", f"{rel}/search/trials.csv"} <= names
    assert not {n for n in names if n.endswith(("day.pid", "trace.json")) or "/run" in n}  # nor the run dir's traces
    assert landscape == b"point\n0\n1\n" and f"{rel}/h100_resnet18_gpunorm.csv" not in names


@pytest.mark.slow
def test_bench_checkpointing_measures_both_sides_and_the_ladder_under_a_cap():
    bench = [
        sys.executable,
        "scripts/bench/bench_checkpointing.py",
        "--batch-size",
        "4",
        "--seq-len",
        "16",
        "--reps",
        "1",
        "--steps",
        "2",
        "--cap-gib",
        "0.01",
        "--ladder",
        "4,8",
    ]
    proc = subprocess.run(bench, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    (pair,) = report["pairs"]
    assert pair["off"]["status"] == pair["on"]["status"] == "ok"
    assert all(
        0 < side["inuse_step_gib"] < side["inuse_peak_gib"] and side["rss_peak_gib"] > 0 for side in pair.values()
    )
    assert report["ratio_on_off"]["step_ms"] == pytest.approx(pair["on"]["step_ms"] / pair["off"]["step_ms"])
    assert report["ladder"] == {"off": None, "on": None}  # 0.01 GiB in use: no batch fits either way
    assert "ladder ckpt=True  batch    4: oom" in proc.stdout


@pytest.mark.slow
def test_bench_window_reads_each_prefix_of_one_long_window_per_process():
    """Two configs, two fresh processes each, 40-step windows: a row per prefix
    (10-30 steps, 0.25-5 s where the window lasts that long) and the whole window's."""
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/bench/bench_window.py",
            "--workload",
            "tiny_cnn",
            "--arg",
            "batch_size=8",
            "--steps",
            "40",
            "--warmup",
            "2",
            "--reps",
            "2",
            "--config",
            "",
            "--config",
            "channels_last=true",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c["knobs"] for c in out["configs"]] == [{}, {"channels_last": True}]
    for config in out["configs"]:
        assert len(config["samples_per_s"]) == 2 and all(r > 0 for r in config["samples_per_s"])
        rows = {r.get("steps", r.get("seconds")): r for r in config["prefixes"]}
        assert {10, 20, 30, 40} <= set(rows) and rows[40]["bias_median"] == 0.0  # the whole window: itself
        assert all(-1 < r["bias_median"] < 10 and r["covered"] in ("-", "0/2", "1/2", "2/2") for r in rows.values())
    assert "mean in CI" in proc.stdout and "channels_last" in proc.stdout


def test_search_phases_times_calls_that_exist():
    """search_phases.py wraps the search's own functions by name: one renamed (cli._importance,
    folded into plots.write_all) broke it before any search ran."""
    code = (
        "import runpy; runpy.run_path('scripts/dev/search_phases.py', run_name='phases')['instrument'](); print('ok')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]


def _venv_with_pip_refused(root):
    """`root`: a copy of the install script and pyproject.toml beside a .venv whose
    python is this one, except that `python -m pip` says so and fails."""
    (root / "scripts").mkdir()
    for name in ("scripts/install.sh", "pyproject.toml"):
        (root / name).write_bytes(open(name, "rb").read())
    bin_ = root / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").write_text(
        f'#!/usr/bin/env bash\n[ "$1 $2" = "-m pip" ] && {{ echo "pip $*"; exit 1; }}\n'
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    (bin_ / "python").chmod(0o755)
    (bin_ / "autotune").symlink_to(os.path.join(os.path.dirname(sys.executable), "autotune"))


def test_install_returns_at_once_when_pyproject_and_extras_are_what_it_installed(tmp_path):
    import hashlib

    _venv_with_pip_refused(tmp_path)
    digest = hashlib.sha256((tmp_path / "pyproject.toml").read_bytes()).hexdigest()
    (tmp_path / ".venv" / "installed").write_text(f"{digest} [test]\n")

    def install(extras):
        return subprocess.run(
            ["bash", "scripts/install.sh"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "EXTRAS": extras},
        )

    for extras in ("[test]", ""):  # asking for none: any extras installed from this pyproject.toml will do
        proc = install(extras)
        assert proc.returncode == 0 and "installed already" in proc.stdout, proc.stdout + proc.stderr
    proc = install("[gpu]")  # extras it never installed: pip runs (and here fails, saying so)
    assert proc.returncode == 1 and "install failed" in proc.stderr
    assert "pip -m pip install --upgrade pip" in (tmp_path / ".venv" / "install.log").read_text()
    (tmp_path / "pyproject.toml").write_text((tmp_path / "pyproject.toml").read_text() + "\n# a new dependency\n")
    proc = install("[test]")  # pyproject.toml changed since
    assert proc.returncode == 1 and "installed already" not in proc.stdout


@pytest.mark.slow  # in CI: test_online's same indices across online changes mid-epoch
@pytest.mark.timeout(120)
def test_bench_online_same_batches_ends_with_its_json_line():
    proc = subprocess.run(
        [sys.executable, "scripts/bench/bench_online.py", "--only", "same_batches"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "mid_epoch_changes" in proc.stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"same_batches": True}


# Every script in scripts/bench and scripts/dev runs in the CI tier at its smallest setting, and its last line
# parses as JSON (bench_overhead.py failed on main unseen: its full runs are slow-marked). {run}: a finished
# search (the session's); {tmp}: a temp dir; {spec}: a small search spec there. In the order they start, the
# longest first, two at a time: they measure nothing, so they may share the 2-core host.
SMOKE = {
    "bench/bench_fidelity.py": "--reps 1 --min-window-s 0.2 --max-window-s 0.3",
    "bench/bench_fused.py": "--model tiny_cnn --image-size 16 --batch-size 8 --reps 1 --warmup 2 --measure-steps 3"
    " --min-window-s 0.2 --max-window-s 0.3 --precision 32-true --no-channels-last --optimizers sgd",
    "bench/parity_table.py": "--workloads tiny_cnn --steps 2 --knobs set_to_none --no-planted",
    "bench/bench_exported.py": "{run} --reps 1 --warmup 2 --window-s 0.2",
    "bench/bench_checkpointing.py": "--batch-size 4 --seq-len 16 --dim 16 --layers 1 --reps 1 --steps 2 --cap-gib 0",
    "bench/bench_window.py": "--arg batch_size=8 --steps 12 --warmup 1 --reps 1",
    "dev/record_landscape.py": "-o {tmp}/landscape.csv --grid batch_size=8 --cpus 1 --trial min_window_s=0.2"
    " --trial max_window_s=0.3 --trial profile_steps=0",
    "bench/bench_online.py": "--only same_batches",
    "dev/coverage_moves.py": "{tmp}/before.json {tmp}/after.json",
}
SLOW_SMOKE = {  # their smallest runs take 25-40 s: a slow test each (the CI tier covers their parts: test_instrument's
    # TRL and padding runs, test_instrument_torch's hooks, test_program's searches of a program)
    "bench/bench_programs.py": "--only memmap_loop --smoke --pairs 1 --steps 12 --warmup 2 --out {tmp}/programs",
    "bench/bench_llm.py": "--smoke --work {tmp}/llm",
    "bench/bench_instrument_cost.py": "--inproc-pairs 1 --pairs 1 --short 2 --long 4",
    # 19-24 s each, the CI tier ~15 min on a slow hour of this host: test_search_phases_times_calls_that_exist (the
    # phases it times), test_builtin_program_runs_as_a_program_trial (bench_overhead's program side)
    "dev/search_phases.py": "{spec} --trials 1 --out {tmp}/run --backend local",
    "bench/bench_overhead.py": "--trials 2 --window-s 0.2",
    # 7-24 s each (the tier took 907 s with its install on a slow hour): test_launch_command's torchrun and
    # accelerate searches (ranks started and measured), test_confirm's re-measurement against the search's figure,
    # test_network's search through Ray (Ray started)
    "bench/bench_rank_startup.py": "--rounds 1 --approaches tasks",
    "bench/bench_drift.py": "--kinds quickstart --runs 1 --sides after --smoke --out {tmp}/drift",
    "bench/bench_ray_start.py": "--rounds 1 --variants autotune",
    # ~11 s: test_confirm's pairs in fresh processes (what remeasure_ways varies)
    "dev/remeasure_ways.py": "--kind quickstart --reps 1 --ways fork,spawn --window-s 0.2",
}
ELSEWHERE = {  # run in the CI tier by a test of their own, to its JSON line
    "bench/bench_model.py": "test_bench_model_replays_a_recorded_search_with_both_models",
    "bench/bench_search.py": "test_bench_search_replays_the_committed_landscapes",
    "bench/bench_program.py": "bench_programs.py's smoke run, on the search it makes",
    "bench/builtin_program.py": "test_builtin_program_runs_as_a_program_trial",  # a program, not a benchmark
    "bench/bench_compile.py": "test_bench_compile_loads_the_artifacts_in_production_and_says_a_stale_one",
    "bench/bench_peer.py": "test_bench_peer_runs_loadtune_and_autotune_to_its_json_line",
}
# a search's trial at its floor: no profile, no diagnosis (search_phases' search)
SMOKE_TRIAL = {"warmup_steps": 2, "min_window_s": 0.2, "max_window_s": 0.3, "profile_steps": 0, "diagnose": False}
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def _coverage_report(path, functions):
    files = {
        "autotune/a.py": {
            "summary": {"num_statements": 4, "covered_lines": 2},
            "functions": {name: {"summary": {"covered_lines": n}} for name, n in functions.items()},
        }
    }
    path.write_text(json.dumps({"files": files}))


def test_every_script_has_a_smoke_run():
    here = {
        f"{d}/{name}" for d in ("bench", "dev") for name in os.listdir(os.path.join(SCRIPTS, d)) if name.endswith(".py")
    }
    assert here == set(SMOKE) | set(SLOW_SMOKE) | set(ELSEWHERE)
    tests = {name for name in globals() if name.startswith("test_")}
    assert all(how in tests or " " in how for how in ELSEWHERE.values())


@pytest.fixture(scope="module")
def smoke_runs(finished_run, tmp_path_factory):
    """Every smoke run, started two at a time once the session's search has finished; each test waits for its
    own: (the finished process, its seconds)."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.conftest import write_spec

    run_dir, _ = finished_run
    tmp = tmp_path_factory.mktemp("smoke")
    spec = write_spec(tmp / "spec.yaml", trial=SMOKE_TRIAL)
    _coverage_report(tmp / "before.json", {"f": 1, "g": 1})
    _coverage_report(tmp / "after.json", {"f": 1, "g": 0})

    def run(script):
        args = {**SMOKE, **SLOW_SMOKE}[script].format(run=run_dir, tmp=tmp, spec=spec).split()
        started = time.perf_counter()
        argv = [sys.executable, os.path.join(SCRIPTS, script), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        return proc, time.perf_counter() - started

    class Runs(dict):  # a slow one (SLOW_SMOKE) starts when its test asks for it
        def __missing__(self, script):
            self[script] = pool.submit(run, script)
            return self[script]

    pool = ThreadPoolExecutor(max_workers=2)
    yield Runs({script: pool.submit(run, script) for script in SMOKE})
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("script", [*SMOKE, *(pytest.param(name, marks=pytest.mark.slow) for name in SLOW_SMOKE)])
@pytest.mark.timeout(600)
def test_each_script_runs_at_its_smallest_setting_to_its_json_line(script, smoke_runs):
    proc, seconds = smoke_runs[script].result()
    print(f"{script}: {seconds:.1f} s")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(out, dict) and out
    if script == "bench/bench_programs.py":  # a program's failure is a row, and bench_program.py ran to its JSON
        assert [r["program"] for r in out["programs"]] == ["memmap_loop"] and "error" not in out["programs"][0]
    if script == "dev/search_phases.py":  # it reports a failed search too
        assert [t["status"] for t in out["trials"]] == ["ok"], out["trials"]
    if script == "bench/bench_llm.py":  # its table in tokens/s, MFU unknown on a CPU, peak memory
        assert (out["size"], out["device"]["type"], out["search"]) == ("smoke", "cpu", None)
        assert out["model"]["layers"] == 2 and 0 < out["model"]["non_embedding_params"] < 1e6
        rows = {r["name"]: r for r in out["rows"]}
        assert list(rows) == ["baseline", "padding_free=True"]
        for row in rows.values():
            assert row["status"] == "ok" and row["tokens_per_s"] > 0 and row["mfu"] is None and row["mem_peak_gib"] > 0
        assert rows["baseline"]["speedup_x"] == 1.0 and len(out["load_avg"]["before"]) == 3
        assert "| config | tokens/s | vs baseline | MFU | peak RSS (GiB) | host busy | note |" in proc.stdout
        assert "| baseline |" in proc.stdout and "| unknown |" in proc.stdout


def test_builtin_program_runs_as_a_program_trial(tmp_path):
    """builtin_program.py is the built-in workload written as a program (bench_overhead.py --program runs it):
    one trial of it through the launcher, as that benchmark's program side runs it."""
    from autotune.execution.launcher import Launch, run_in_process

    root = os.path.dirname(SCRIPTS)
    config = {
        "workload": {
            "command": ["python", os.path.join(SCRIPTS, "bench", "builtin_program.py"), "--workload", "tiny_cnn"],
            "dir": root,
        },
        **{"warmup_steps": 2, "measure_steps": 3, "min_window_s": 0.2, "max_window_s": 0.3, "profile_steps": 0},
        "diagnose": False,
    }
    result = run_in_process(config, tmp_path / "trial", 120, root, {}, launch=Launch("spawn"))
    assert result.status == "ok", result.error
    assert result.metrics["samples_per_s"] > 0 and result.metrics["window_steps"] >= 1


def smoke_json(script: str, out) -> dict:
    """scripts/bench/`script` at its smallest setting (`--smoke`), writing under `out`: its last line, one JSON
    object (the script must exit 0)."""
    argv = [sys.executable, os.path.join(SCRIPTS, "bench", script), "--smoke", "--out", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=880)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # three CPU compiles (~2 min on this host): not in the CI tier. In CI: test_compiled (the bundle,
# the stale line), test_measure (the window's compile)
@pytest.mark.timeout(900)
def test_bench_compile_loads_the_artifacts_in_production_and_says_a_stale_one(tmp_path):
    out = smoke_json("bench_compile.py", tmp_path)["production"]
    assert out["loaded"].startswith("autotune: compiled artifacts loaded from compile_artifacts.tar (")
    assert out["stale"].startswith("autotune: compile_artifacts.tar is stale (made with torch 1.0.0, this is torch")
    assert set(out["first_step_s"]) == {"with", "without"}


@pytest.mark.slow  # it pip-installs loadtune 0.3.0 from PyPI and runs a search (~2 min): not in the CI tier
@pytest.mark.timeout(900)
def test_bench_peer_runs_loadtune_and_autotune_to_its_json_line(tmp_path):
    out = smoke_json("bench_peer.py", tmp_path)
    if not out["installed"]:
        pytest.skip(f"loadtune 0.3.0 did not install from PyPI: {out['error']}")
    assert set(out["samples_per_s"]) == {"baseline", "loadtune", "autotune_at_peer", "autotune_final"}
    assert out["peer_s"] > 0 and isinstance(out["done"], bool)
