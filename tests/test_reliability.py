"""Faults in trials, interruptions and bad input never lose a search."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from autotune import spec as S
from autotune.cli.main import app
from autotune.decide.budget import NOTHING_LEFT
from autotune.execution import reaper
from autotune.execution.driver import run
from autotune.host import procfs
from autotune.records.state import SearchState

TRIAL = {"warmup_steps": 2, "measure_steps": 5, "min_window_s": 0.2, "max_window_s": 1.0, "profile_steps": 2}


def processes_in(path: Path) -> list[int]:
    """PIDs whose working directory is under `path` (trial processes run in their trial dir)."""
    return [pid for pid in procfs.processes() if str(procfs.cwd(pid)).startswith(str(path))]


@pytest.mark.timeout(400)
def test_every_fault_is_recorded_and_the_search_goes_on(tmp_path, ray_local):
    spec = S.parse(
        {
            "name": "faults",
            "workload": {"factory": "tests.workloads:make_faulty"},
            "search_space": {"preset": None, "knobs": {"batch_size": [16, 32, 64, 128], "num_workers": [0, 1]}},
            # no diagnosis: its 2x-batch probe of batch 32 would run into the batch-64 hang
            "trial": {**TRIAL, "timeout_s": 12, "diagnose": False},
            "search": {"sampler": "grid", "n_trials": 8, "confirm_rounds": 0},
            "safety": {"level": "dynamics"},
            "output_dir": str(tmp_path / "run"),
        }
    )
    result = run(spec)
    by = {(r.knobs["batch_size"], r.knobs["num_workers"]): r for r in result.records}
    # the whole grid, each once, but for batch 128 with a worker: batch 128 ran out of
    # memory without one, and workers change no device memory (the OOM ladder)
    assert len(result.records) == 7 and len(by) == 7 and (128, 1) not in by
    assert by[16, 0].status == "ok" and by[16, 0].is_baseline and by[64, 0].status == "ok"
    assert result.best in (by[16, 0], by[64, 0])
    nan = by[32, 0]
    assert (nan.status, nan.error_type, nan.error) == ("error", "NonFiniteLoss", "the loss is NaN or inf")
    oom = by[128, 0]
    assert oom.status == "oom" and oom.error_type == "OutOfMemoryError" and "injected" in oom.error
    assert oom.metrics["mem_rss_peak_gib"] > 0  # the memory at the failure, with the batch size in the knobs
    hung = by[64, 1]  # a hang without loader workers: test_launcher's hung trial
    assert hung.status == "timeout" and hung.error == "trial ran past timeout_s=12 and was killed"
    for batch in (16, 32):
        killed = by[batch, 1]
        assert killed.status == "error" and "DataLoader worker" in killed.error, killed.error
    assert processes_in(result.run_dir) == []  # the hung trials and their loader workers are gone

    # every failure is in MLflow with its reason, and in Optuna as FAIL
    runs = MlflowClient(f"sqlite:///{result.run_dir / 'mlflow.db'}").search_runs(["1"])
    reasons = {r.data.tags.get("failure_reason", "") for r in runs if r.data.tags.get("status") not in (None, "ok")}
    assert len(reasons) >= 4 and any(r.startswith("Timeout: ") for r in reasons)
    faults = [r for r in result.records if r.status != "ok"]
    assert len(faults) == 5 and result.stopped_reason is None  # 5 faults, the search finished anyway
    assert result.ended == NOTHING_LEFT
    study = optuna.load_study(study_name="faults", storage=f"sqlite:///{result.run_dir / 'optuna.db'}")
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 2 and states.count(optuna.trial.TrialState.FAIL) == 5


def write_spec(path: Path, n_trials: int) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "name": "stop",
                "workload": {"name": "tiny_cnn"},
                # compute-side knobs only: the rate model predicts none of them (each needs its own
                # measurement), so the budget is reached by trials that ran, never skipped
                "search_space": {"preset": None, "knobs": {"channels_last": [False, True], "num_threads": [1, 2, 3]}},
                "trial": TRIAL,
                "search": {"n_trials": n_trials, "confirm_rounds": 0},
                "output_dir": str(path.parent / "run"),
            }
        )
    )
    return path


def start_search(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", "search", *args, "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for_rows(csv: Path, n: int, proc, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if csv.exists() and len(pd.read_csv(csv)) >= n:
            return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    raise AssertionError(f"no {n} finished trials in {timeout} s")


def count(run_dir: Path) -> dict:
    """What each store holds: CSV rows, MLflow trial runs, Optuna finished trials (the reference reads' rows and
    runs are not trials: autotune.execution.reads)."""
    rows = pd.read_csv(run_dir / "trials.csv")
    rows = rows[rows["read"].isna()] if "read" in rows else rows
    runs = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}").search_runs(["1"])
    study = optuna.load_study(study_name="stop", storage=f"sqlite:///{run_dir / 'optuna.db'}")
    done = [
        t
        for t in study.trials  # trials that ran: not virtual ones (repeats told to the sampler)
        if t.state.is_finished() and not t.user_attrs.get("interrupted") and not t.user_attrs.get("virtual")
    ]
    return {
        "csv": sorted(rows["trial"]),
        "mlflow": sorted(int(r.data.tags["trial_number"]) for r in runs if r.data.tags.get("autotune.role") == "trial"),
        "optuna": sorted(t.number for t in done),
    }


def stop(proc, run_dir: Path, sig: int) -> dict:
    """Send `sig` to a running search; what the stores hold once it has stopped."""
    os.kill(proc.pid, sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    said = " ".join(out.split())  # the line wraps at the terminal's width (80 columns in a pipe)
    assert "interrupted after" in said and f"continue with `autotune search --resume {run_dir}`" in said
    stopped = count(run_dir)
    assert stopped["csv"] == stopped["mlflow"] == stopped["optuna"]
    assert processes_in(run_dir) == []  # the running trial was stopped
    return stopped


@pytest.mark.slow  # CI tier: test_local's SIGTERM stop and resume (the one loop's stopper; SIGINT and Ray's stop here)
@pytest.mark.timeout(500)
def test_a_stopped_search_loses_nothing_and_resumes_to_the_budget(tmp_path):
    """Ctrl-C (SIGINT), then a resume stopped by SIGTERM (as a scheduler stops a
    job), then a resume to the end: nothing lost or repeated at either stop. The
    SIGTERM'd search runs its trials through Ray, the other two on the local
    backend (one loop: both stop alike; a resume may change backend), which saves
    two Ray starts."""
    spec = write_spec(tmp_path / "s.yaml", n_trials=5)
    run_dir = tmp_path / "run"
    proc = start_search(str(spec), "--backend", "local")
    wait_for_rows(run_dir / "trials.csv", 2, proc)
    first = stop(proc, run_dir, signal.SIGINT)
    assert len(first["csv"]) >= 2

    proc = start_search("--resume", str(run_dir))
    wait_for_rows(run_dir / "trials.csv", len(first["csv"]) + 1, proc)
    second = stop(proc, run_dir, signal.SIGTERM)
    assert set(first["csv"]) < set(second["csv"])

    proc = start_search("--resume", str(run_dir), "--backend", "local")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    final = count(run_dir)
    assert final["csv"] == final["mlflow"] == final["optuna"]
    assert len(final["csv"]) == 5 and len(set(final["csv"])) == 5  # the budget, no trial lost or repeated
    assert set(second["csv"]) <= set(final["csv"])
    assert yaml.safe_load((run_dir / "best_config.yaml").read_text())["measured"]["trials"] == 5
    state = SearchState.read(run_dir)
    assert state.wall_s > state.wall_before_s > 0  # the resumed search counts every run


def cmdline(pid: int) -> str:
    return procfs.cmdline(pid)[:300] or "(gone)"


def alive(procs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """Those of `procs` (pid, start time) still running as the same process."""
    now = {(p.pid, p.start_ticks) for p in procfs.processes(live=True).values()}
    return procs & now


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sigkill_of_the_driver_leaves_the_stores_consistent_and_no_process_behind(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", n_trials=4)
    run_dir = tmp_path / "run"
    proc = start_search(str(spec))
    wait_for_rows(run_dir / "trials.csv", 2, proc)
    started = reaper.descendants(proc.pid, since=0)  # Ray's processes (its agents too), the fork server, a trial
    assert any("raylet" in procfs.cmdline(pid) for pid, _ in alive(started))
    os.kill(proc.pid, signal.SIGKILL)  # the driver alone, as `kill -9 PID` does: nothing in it gets to clean up
    proc.wait(timeout=30)
    deadline = time.time() + 20
    while alive(started) and time.time() < deadline:
        time.sleep(0.5)
    assert alive(started) == set(), "processes of the killed search outlived it: " + "; ".join(
        f"{pid}: {cmdline(pid)}" for pid, _ in alive(started)
    )
    killed = count(run_dir)
    # every trial in trials.csv (written last) is in the other two stores; the kill may
    # land between the writes of one trial, which Optuna or MLflow then hold alone:
    # --resume records it from its result.json, into its MLflow run (never a second one)
    assert set(killed["csv"]) <= set(killed["mlflow"]) and set(killed["csv"]) <= set(killed["optuna"])
    assert len(set(killed["mlflow"]) | set(killed["optuna"])) - len(killed["csv"]) <= 1

    proc = start_search("--resume", str(run_dir))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    final = count(run_dir)
    assert final["csv"] == final["mlflow"] == final["optuna"] and len(final["csv"]) == 4
    assert alive(started) == set()


runner = CliRunner()


def spec_file(tmp_path, **overrides) -> Path:
    data = {"workload": {"name": "tiny_cnn"}, "output_dir": str(tmp_path / "run"), **overrides}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"workload": {"factory": "tests.workloads:not_a_workload"}},
            "workload: workload factory `tests.workloads:not_a_workload` returned dict; it must return autotune.Workload",
        ),
        (
            {"workload": {"factory": "no_such_pkg.train:make"}},
            "workload: workload factory `no_such_pkg.train:make`: cannot import `no_such_pkg.train`: ModuleNotFoundError: No module named 'no_such_pkg'"
            "; run the search from the directory that contains `no_such_pkg` (trials import it the same way), or add that "
            "directory to PYTHONPATH",
        ),
        (
            {"tracking": {"uri": "http://127.0.0.1:9"}},
            "tracking.uri: cannot reach an MLflow server at `http://127.0.0.1:9` ([Errno 111] Connection refused); start one "
            "(`mlflow server --host 127.0.0.1 --port 5000`) or leave tracking.uri out for a local store",
        ),
        (
            {"search_space": {"preset": None, "knobs": {"cudnn_benchmark": [True]}}},
            "search_space: nothing to search on this device; every knob is fixed: cudnn_benchmark (cuDNN runs only on CUDA "
            "devices; no CUDA device); not in the search space: num_workers, pin_memory, prefetch_factor, persistent_workers, "
            "num_threads, batch_size, precision, channels_last, compile, set_to_none, fused_optimizer, attention, "
            "padding_free, packing, liger_kernels, float8, ddp_bucket_cap_mb, ddp_gradient_as_bucket_view, "
            "ddp_static_graph, sharding, fsdp_reshard_after_forward, activation_checkpointing, expandable_segments",
        ),
        (
            {"workload": {"factory": "tests.workloads:make_raising"}},
            "workload: workload factory `tests.workloads:make_raising` raised ValueError: expected a batch like [images, labels] "
            "from the dataset; fix the factory or its arguments (workload.args: {}); --debug shows the traceback",
        ),
        (
            {"workload": {"factory": "tests.workloads:make_small", "args": {"samples": 0}}},
            "workload: workload factory `tests.workloads:make_small`: the dataset is empty; nothing to train on",
        ),
        (
            {"workload": {"factory": "tests.workloads:make_small", "args": {"samples": 3, "batch_size": 8}}},
            "baseline: batch_size 8 is larger than the workload's dataset (3 samples); use a smaller batch or a larger dataset",
        ),
        (
            {"baseline": {"num_workers": 0, "prefetch_factor": 4}},
            "baseline: prefetch_factor=4: needs loader workers (num_workers > 0)",
        ),
    ],
)
def test_bad_input_is_one_error_and_writes_nothing(tmp_path, ray_local, overrides, message):
    result = runner.invoke(app, ["search", str(spec_file(tmp_path, **overrides))])
    assert result.exit_code == 2
    assert result.stderr == f"error: {message}\n"
    assert not (tmp_path / "run").exists()


def test_resume_needs_a_search(tmp_path):
    result = runner.invoke(app, ["search", "--resume", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr == f"error: `{tmp_path}` has no spec.yaml: not a search's output dir, nothing to resume\n"
    result = runner.invoke(app, ["search"])
    assert (
        result.stderr
        == "error: give a spec (`autotune search spec.yaml`), a training command after `--` (`autotune search -- "
        "python train.py`) or a search to continue (`--resume RUN_DIR`)\n"
    )


def test_an_output_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "run").write_text("my notes\n")
    result = runner.invoke(app, ["search", str(spec_file(tmp_path))])
    assert result.exit_code == 2 and (tmp_path / "run").read_text() == "my notes\n"
    assert result.stderr == (
        f"error: output_dir: `{tmp_path / 'run'}` is a file, not a directory; name a directory "
        "(it is created) or leave output_dir out for runs/<name>-<timestamp>\n"
    )


@pytest.mark.parametrize(
    "where, existing, why",
    [
        (f"{procfs.PROC}/autotune-cannot-write-here", str(procfs.PROC), "No such file or directory"),
        ("{tmp}/notes.txt/run", "{tmp}", None),
    ],
)
def test_an_unwritable_output_dir_is_one_line_and_nothing_starts(tmp_path, where, existing, why):
    (tmp_path / "notes.txt").write_text("my notes\n")
    out = where.format(tmp=tmp_path)
    result = runner.invoke(app, ["search", str(spec_file(tmp_path)), "--output-dir", out])
    assert result.exit_code == 2
    if why is None:  # the path runs through a file
        assert result.stderr == (
            f"error: output_dir: `{out}` cannot be created: `{tmp_path / 'notes.txt'}` is a file, "
            "not a directory; name a directory you can write (it is created) or leave output_dir "
            "out for runs/<name>-<timestamp>\n"
        )
    else:
        assert result.stderr == (
            f"error: output_dir: `{out}` cannot be written: creating a directory in `{existing}` "
            f"fails ({why}); name a directory you can write (it is created) or leave output_dir "
            "out for runs/<name>-<timestamp>\n"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "s.yaml"]  # nothing written, nothing started
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"


def test_a_yaml_syntax_error_is_one_line_with_its_place(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("workload:\n  name: tiny_cnn\n  args: {batch_size: 8\n")
    result = runner.invoke(app, ["search", str(path)])
    assert result.exit_code == 2
    assert result.stderr == f"error: {path}:4:1: not valid YAML: expected ',' or '}}', but got '<stream end>'\n"


def test_a_spec_and_resume_together_are_refused(tmp_path):
    result = runner.invoke(app, ["search", str(spec_file(tmp_path)), "--resume", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: give a spec or `--resume RUN_DIR`, not both: a resumed search runs the spec it "
        f"was started with (`{tmp_path / 'run' / 'spec.yaml'}`)\n"
    )


@pytest.mark.timeout(300)
def test_batches_larger_than_the_dataset_are_dropped_and_samples_counted(tmp_path, ray_local):
    spec = S.parse(
        {
            "name": "small",
            "workload": {"factory": "tests.workloads:make_small", "args": {"samples": 20}},
            "search_space": {"preset": None, "knobs": {"batch_size": [8, 16, 32, 64]}},
            "trial": {**TRIAL, "profile_steps": 0, "diagnose": False, "prune_margin": 0},
            "search": {"n_trials": 5, "confirm_rounds": 0},
            "safety": {"level": "dynamics"},
            "output_dir": str(tmp_path / "run"),
        }
    )
    result = run(spec)
    assert result.space.search == {"batch_size": [8, 16]}
    assert {
        "batch_size=32: larger than the dataset (20 samples)",
        "batch_size=64: larger than the dataset (20 samples)",
    } <= set(result.space.dropped)
    for r in result.records:  # every batch is full: samples/s is steps/s times the batch
        assert r.metrics["samples_per_s"] == pytest.approx(r.metrics["steps_per_s"] * r.knobs["batch_size"])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_trial_run_left_running_by_a_kill_is_finished_not_doubled(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", n_trials=3)
    run_dir = tmp_path / "run"
    proc = start_search(str(spec))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    # as if the driver died after creating trial 2's MLflow run, before its trials.csv row
    rows = pd.read_csv(run_dir / "trials.csv")
    last = int(rows.trial.max())
    rows[rows.trial != last].to_csv(run_dir / "trials.csv", index=False)
    client = MlflowClient(SearchState.read(run_dir).mlflow_uri)
    [left] = client.search_runs(
        [client.get_experiment_by_name("autotune").experiment_id], filter_string=f"tags.trial_number = '{last}'"
    )
    client.update_run(left.info.run_id, status="RUNNING")
    proc = start_search("--resume", str(run_dir))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    runs = client.search_runs([left.info.experiment_id], filter_string=f"tags.trial_number = '{last}'")
    assert [r.info.run_id for r in runs] == [left.info.run_id] and runs[0].info.status == "FINISHED"
    final = count(run_dir)
    assert final["csv"] == final["mlflow"] == final["optuna"] and len(final["csv"]) == 3


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_search_on_the_device_waits_its_turn(tmp_path):
    from autotune.execution.lock import lock_path

    go = tmp_path / "release"
    holder = subprocess.Popen(  # another search's lock, held until the test has seen ours wait
        [
            sys.executable,
            "-c",
            "import os, sys, time; from autotune.execution.lock import device_lock\n"
            "with device_lock('cpu', 'the-other-search'):\n"
            "    print('held', flush=True)\n"
            "    deadline = time.time() + 200\n"
            "    while not os.path.exists(sys.argv[1]) and time.time() < deadline: time.sleep(0.1)\n"
            "print('released', time.time(), flush=True)",
            str(go),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline() == "held\n"
    spec = write_spec(tmp_path / "s.yaml", n_trials=2)
    proc = start_search(str(spec))
    lines = []
    for line in proc.stdout:  # until our search says it waits
        lines.append(line)
        if line.startswith("waiting:"):
            break
    time.sleep(2)
    assert not (tmp_path / "run" / "trials.csv").exists()  # waiting: no trial of ours runs
    go.touch()
    released = float(holder.stdout.readline().split()[1])
    out = "".join(lines) + proc.communicate(timeout=250)[0]
    assert proc.returncode == 0, out
    assert (
        "waiting: another autotune search is measuring on this cpu (pid "
        f"{holder.pid}, the-other-search); waiting for it to finish"
    ) in " ".join(out.split())
    started = pd.read_csv(tmp_path / "run" / "trials.csv").started_unix
    assert (started >= released).all()  # no trial of ours ran while the other search held the device
    assert lock_path("cpu").exists()
