"""The local backend (autotune.execution.local): the same search loop, strategy,
recorder and stoppers as with Ray, one trial at a time on this host, where
`import ray` and `import mlflow` fail (a GPU host); and what a spec asks that
such a host lacks, refused in one line."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from autotune.records.state import SearchState

from tests.conftest import write_spec

ROOT = Path(__file__).resolve().parent.parent
BLOCK = """import sys
for name in ("ray", "mlflow"):
    sys.modules[name] = None  # `import name` raises ImportError, here and in every trial process
"""


def hidden_env(tmp_path) -> dict:
    """The environment of a process (and its trials) where Ray and MLflow cannot be imported."""
    block = tmp_path / "block"
    block.mkdir(exist_ok=True)
    (block / "sitecustomize.py").write_text(BLOCK)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(block), str(ROOT)])}


def trial_rows(run_dir: Path) -> list:
    """The trials' numbers in trials.csv, not its reference reads' rows (`read`: autotune.execution.reads)."""
    import pandas as pd

    rows = pd.read_csv(run_dir / "trials.csv")
    return sorted((rows[rows["read"].isna()] if "read" in rows else rows)["trial"])


def autotune(env, *args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow  # in CI: the local backend with Ray and MLflow hidden, stopped, resumed and finished (the SIGTERM
# test below), the anchor re-read and the re-measurement (test_confirm), `report --format json` (test_report)
@pytest.mark.timeout(330)
def test_a_search_without_ray_or_mlflow_writes_a_run_dir_the_report_reads(tmp_path):
    env = hidden_env(tmp_path)
    probe = subprocess.run([sys.executable, "-c", "import ray"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "import of ray halted" in probe.stderr  # the block works
    run_dir = tmp_path / "run"
    spec = write_spec(tmp_path / "spec.yaml", search={"n_trials": 3, "seed": 0, "confirm_rounds": 1})
    proc = autotune(env, "search", str(spec), "--output-dir", str(run_dir), "--quiet", timeout=300)  # auto: local
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    said = " ".join(proc.stdout.split())  # lines wrap at 80 columns in a pipe
    assert f"details: autotune report {run_dir}" in said and "autotune ui" not in said  # no MLflow store to show

    from autotune.records.run_dir import read_run

    run = read_run(run_dir)  # the run-dir format `autotune report` reads
    assert len(run.records) == 3 and run.baseline.number == 0 and run.best is not None and run.ended == "3 trials"
    assert run.baseline.diagnosis["moves"] and not (run_dir / "mlflow.db").exists()
    assert (run_dir / "best_config.yaml").exists() and (run_dir / "optuna.db").exists()
    state = SearchState.read(run_dir)
    assert state.mlflow_uri is None and state.n_trials == 3
    for r in run.records:  # each trial ran in its own process, under the block too
        assert (Path(r.trial_dir) / "result.json").exists() and r.info["trial_wall_s"] > 0
    # the anchor, read again in a fresh process (confirm.reread_anchor): its throughput the two reads' mean
    reads = [run.baseline.metrics[k] for k in ("anchor_first_samples_per_s", "anchor_reread_samples_per_s")]
    assert (Path(run.baseline.trial_dir) / "reread" / "result.json").exists()
    assert run.baseline.throughput == pytest.approx(sum(reads) / 2)
    if run.best is not run.baseline:  # the best re-measured against the baseline, as with Ray
        from autotune.decide.confirm import RERUNS

        confirm = state.confirm
        aside = confirm.get("disturbed_pairs", [])  # measured under the host's other load: again, not counted
        assert confirm["rounds"] == 1 or len(aside) > RERUNS
        assert "re-measuring the best against the baseline" in proc.stdout
        runs = {p.parent.name for p in (run_dir / "confirm").glob("*/result.json")}
        assert {r for r in runs if not r.startswith("parity-") and "-again" not in r} == {"00-baseline", "00-best"}
    report = autotune(env, "report", str(run_dir), "--format", "json", "--no-plots")
    assert report.returncode == 0, report.stderr[-2000:]
    summary = json.loads(report.stdout)
    assert summary["trials"] == 3 and summary["ended"] == "3 trials" and summary["best"]["trial"] == run.best.number


@pytest.mark.parametrize(
    "overrides, args, line",
    [
        (
            {"resources": {"ray_address": "127.0.0.1:6379"}},
            (),
            "resources.ray_address: `127.0.0.1:6379` is a Ray cluster, and Ray is not installed here",
        ),
        (
            {"tracking": {"uri": "http://127.0.0.1:5999"}},
            (),
            "tracking.uri: `http://127.0.0.1:5999` needs MLflow, which is not installed here (pip install mlflow)",
        ),
        (
            {"resources": {"device": "cpu", "ranks_per_trial": 2, "rank_placement": "spread"}},
            (),
            "resources.rank_placement: spread puts ranks on a cluster's nodes, which needs Ray",
        ),
        ({}, ("--backend", "ray"), "backend `ray`: Ray is not installed here (pip install 'ray[tune]')"),
        ({"search": {"strategy": "v1"}}, (), "search.strategy: `v1` is gone; autotune searches one way (what v2 was)"),
    ],
)
def test_what_the_host_lacks_is_refused_in_one_line(tmp_path, overrides, args, line):
    spec = write_spec(tmp_path / "spec.yaml", output_dir=str(tmp_path / "run"), **overrides)
    proc = autotune(hidden_env(tmp_path), "search", str(spec), *args)
    assert proc.returncode == 2 and not (tmp_path / "run").exists(), proc.stderr[-2000:]
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(out) == 1 and line in out[0]


def test_a_cluster_address_is_refused_by_the_local_backend(tmp_path):
    """Ray installed: `--backend local` still runs here only, and says so."""
    from autotune.execution.backends import choose
    from autotune.execution.local import LocalBackend
    from autotune.spec import SpecError, parse

    spec = parse({"workload": {"name": "tiny_cnn"}, "resources": {"ray_address": "127.0.0.1:6379"}}, "spec")
    with pytest.raises(SpecError, match=r"`127.0.0.1:6379` is a Ray cluster, and this search runs on this host"):
        choose("local", resources=spec.resources, tracking=spec.tracking)
    spec.resources.ray_address = None
    assert isinstance(choose("local", resources=spec.resources, tracking=spec.tracking), LocalBackend)
    with pytest.raises(SpecError, match="backend `cloud` is not one of: auto, local, ray"):
        choose("cloud", resources=spec.resources, tracking=spec.tracking)


@pytest.mark.slow  # CI tier: test_strategy's resume from the storage, rerunning interrupted trials
@pytest.mark.timeout(400)
def test_sigterm_stops_a_local_search_and_a_resume_finishes_it(tmp_path):
    """The local backend's Ctrl-C stopper (SIGTERM as Ctrl-C): the running trial stopped, what finished saved,
    `--resume` runs the rest with nothing lost or repeated; Ray and MLflow hidden throughout. The SIGTERM goes to the
    search's whole process group, as `timeout` and a scheduler send it: its fork server is in that group (a README
    walk: it died first, and the pair in flight was recorded as failed, "the fork server exited"), to a search started
    with Ctrl-C ignored, as a script's background job is."""
    import optuna

    from tests.test_reliability import processes_in, wait_for_rows, write_spec as stop_spec

    env, run_dir = hidden_env(tmp_path), tmp_path / "run"
    spec = stop_spec(tmp_path / "s.yaml", n_trials=3)

    def start(*args):
        return subprocess.Popen(
            [sys.executable, "-m", "autotune.cli", "search", *args, "-q"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            # as a script's background job starts it: Ctrl-C ignored, so a SIGTERM passed on as one was lost
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )

    proc = start(str(spec))
    wait_for_rows(run_dir / "trials.csv", 1, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "interrupted after" in out, out
    assert "fork server" not in out and "fork server" not in (run_dir / "trials.csv").read_text()
    assert f"continue with `autotune search --resume {run_dir}`" in " ".join(out.split())  # wrapped at 80 columns
    assert SearchState.read(run_dir).ended == "interrupted"
    assert processes_in(run_dir) == []  # the running trial was stopped
    first = trial_rows(run_dir)

    proc = start("--resume", str(run_dir))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    rows = trial_rows(run_dir)
    study = optuna.load_study(study_name="stop", storage=f"sqlite:///{run_dir / 'optuna.db'}")
    ran = sorted(
        t.number
        for t in study.trials
        if t.state.is_finished() and not t.user_attrs.get("interrupted") and not t.user_attrs.get("virtual")
    )
    assert set(first) < set(rows) and rows == ran and len(rows) == 3  # nothing lost or repeated
    assert SearchState.read(run_dir).ended == "3 trials"
