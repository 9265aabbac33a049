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
from autotune.cli import app
from autotune.search import run

TRIAL = {"warmup_steps": 2, "measure_steps": 5, "min_window_s": 0.2, "max_window_s": 1.0, "profile_steps": 2}


def processes_in(path: Path) -> list[int]:
    """PIDs whose working directory is under `path` (trial processes run in their trial dir)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(Path(os.readlink(proc / "cwd"))).startswith(str(path)):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


@pytest.mark.timeout(400)
def test_every_fault_is_recorded_and_the_search_goes_on(tmp_path, ray_local):
    spec = S.parse({
        "name": "faults", "workload": {"factory": "tests.workloads:make_faulty"},
        "search_space": {"preset": None, "knobs": {"batch_size": [16, 32, 64, 128], "num_workers": [0, 1]}},
        # no diagnosis: its 2x-batch probe of batch 32 would run into the batch-64 hang
        "trial": {**TRIAL, "timeout_s": 12, "diagnose": False}, "search": {"sampler": "grid", "n_trials": 8},
        "safety": {"level": "dynamics"},
        "output_dir": str(tmp_path / "run"),
    })
    result = run(spec)
    by = {(r.knobs["batch_size"], r.knobs["num_workers"]): r for r in result.records}
    # the whole grid, each once, but for batch 128 with a worker: batch 128 ran out of
    # memory without one, and workers change no device memory (the OOM ladder)
    assert len(result.records) == 7 and len(by) == 7 and (128, 1) not in by
    assert by[16, 0].status == "ok" and by[16, 0].is_baseline and result.best is by[16, 0]
    nan = by[32, 0]
    assert (nan.status, nan.error_type, nan.error) == ("error", "NonFiniteLoss", "the loss is NaN or inf")
    oom = by[128, 0]
    assert oom.status == "oom" and oom.error_type == "OutOfMemoryError" and "injected" in oom.error
    assert oom.metrics["mem_rss_peak_gib"] > 0  # the memory at the failure, with the batch size in the knobs
    for workers in (0, 1):
        hung = by[64, workers]
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
    assert len(faults) == 6 and result.stopped_reason is None  # 6 faults, the search finished anyway
    assert result.ended == "every point of the space measured or known infeasible"
    study = optuna.load_study(study_name="faults", storage=f"sqlite:///{result.run_dir / 'optuna.db'}")
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 1 and states.count(optuna.trial.TrialState.FAIL) == 6


def write_spec(path: Path, n_trials: int) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "stop", "workload": {"name": "tiny_cnn"},
        "search_space": {"preset": None, "knobs": {"batch_size": [16, 32, 64], "channels_last": [False, True]}},
        "trial": TRIAL, "search": {"n_trials": n_trials}, "safety": {"level": "dynamics"},
        "output_dir": str(path.parent / "run")}))
    return path


def start_search(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "autotune.cli", "search", *args, "-q"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def wait_for_rows(csv: Path, n: int, proc, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if csv.exists() and len(pd.read_csv(csv)) >= n:
            return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    raise AssertionError(f"no {n} finished trials in {timeout} s")


def descendants(pid: int) -> list[int]:
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def count(run_dir: Path) -> dict:
    """What each store holds: CSV rows, MLflow trial runs, Optuna finished trials."""
    rows = pd.read_csv(run_dir / "trials.csv")
    runs = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}").search_runs(["1"])
    study = optuna.load_study(study_name="stop", storage=f"sqlite:///{run_dir / 'optuna.db'}")
    done = [t for t in study.trials  # trials that ran: not virtual ones (repeats told to the sampler)
            if t.state.is_finished() and not t.user_attrs.get("interrupted") and not t.user_attrs.get("virtual")]
    return {"csv": sorted(rows["trial"]), "mlflow": sorted(int(r.data.tags["trial_number"]) for r in runs
                                                           if r.data.tags.get("autotune.role") == "trial"),
            "optuna": sorted(t.number for t in done)}


@pytest.mark.timeout(400)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_search_loses_nothing_and_resumes_to_the_budget(tmp_path, sig):
    spec = write_spec(tmp_path / "s.yaml", n_trials=5)
    run_dir = tmp_path / "run"
    proc = start_search(str(spec))
    wait_for_rows(run_dir / "trials.csv", 2, proc)
    os.kill(proc.pid, sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "interrupted after" in out and f"continue with `autotune search --resume {run_dir}`" in out
    stopped = count(run_dir)
    assert stopped["csv"] == stopped["mlflow"] == stopped["optuna"] and len(stopped["csv"]) >= 2
    assert processes_in(run_dir) == []  # the running trial was stopped

    proc = start_search("--resume", str(run_dir))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    final = count(run_dir)
    assert final["csv"] == final["mlflow"] == final["optuna"]
    assert len(final["csv"]) == 5 and len(set(final["csv"])) == 5  # the budget, no trial lost or repeated
    assert set(stopped["csv"]) <= set(final["csv"])
    assert yaml.safe_load((run_dir / "best_config.yaml").read_text())["measured"]["trials"] == 5


@pytest.mark.timeout(400)
def test_sigkill_between_trials_leaves_the_stores_consistent(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", n_trials=4)
    run_dir = tmp_path / "run"
    proc = start_search(str(spec))
    wait_for_rows(run_dir / "trials.csv", 2, proc)
    doomed = [proc.pid, *descendants(proc.pid)]  # the driver, Ray, the trial: nothing gets to clean up
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    killed = count(run_dir)
    # every recorded trial is in all three stores; Optuna may know one more, finished
    # but not yet recorded, which --resume records from its result.json
    assert killed["csv"] == killed["mlflow"] and set(killed["csv"]) <= set(killed["optuna"])
    assert len(killed["optuna"]) - len(killed["csv"]) <= 1

    proc = start_search("--resume", str(run_dir))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    final = count(run_dir)
    assert final["csv"] == final["mlflow"] == final["optuna"] and len(final["csv"]) == 4


runner = CliRunner()


def spec_file(tmp_path, **overrides) -> Path:
    data = {"workload": {"name": "tiny_cnn"}, "output_dir": str(tmp_path / "run"), **overrides}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("overrides, message", [
    ({"workload": {"factory": "tests.workloads:not_a_workload"}},
     "workload: workload factory `tests.workloads:not_a_workload` returned dict; it must return autotune.Workload"),
    ({"workload": {"factory": "no_such_pkg.train:make"}},
     "workload: workload factory `no_such_pkg.train:make`: cannot import `no_such_pkg.train`: ModuleNotFoundError: No module named 'no_such_pkg'"
     "; run the search from the directory that contains `no_such_pkg` (trials import it the same way), or add that "
     "directory to PYTHONPATH"),
    ({"tracking": {"uri": "http://127.0.0.1:9"}},
     "tracking.uri: cannot reach an MLflow server at `http://127.0.0.1:9` ([Errno 111] Connection refused); start one "
     "(`mlflow server --host 127.0.0.1 --port 5000`) or leave tracking.uri out for a local store"),
    ({"search_space": {"preset": None, "knobs": {"cudnn_benchmark": [True]}}},
     "search_space: nothing to search on this device; every knob is fixed: num_workers (not in the search space); "
     "pin_memory (not in the search space); batch_size (not in the search space); precision (not in the search space); "
     "compile (not in the search space); set_to_none (not in the search space); channels_last (not in the search space); "
     "cudnn_benchmark (cuDNN runs only on CUDA devices; no CUDA device)"),
])
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
    assert result.stderr == "error: give a spec (`autotune search spec.yaml`) or a search to continue (`--resume RUN_DIR`)\n"
