import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

from autotune.trial.ranks import free_port  # noqa: F401  (the tests import it from here)

# Every Ray socket on 127.0.0.1, no usage reporting, no token warning (docs/design.md, the facts)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole test run (ray.init costs ~5 s)."""
    import ray

    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths have a length limit
    ray.init(
        num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, _temp_dir=temp, logging_level="ERROR"
    )
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def write_spec(path, **overrides):
    """A small search spec on the tiny workload."""
    import yaml

    data = {
        "workload": {"name": "tiny_cnn", "args": {"batch_size": 16}},
        "search_space": {
            "preset": None,
            "knobs": {"batch_size": [16, 64], "channels_last": [False, True], "pin_memory": [False, True]},
        },
        "trial": {"warmup_steps": 2, "measure_steps": 5, "min_window_s": 0.2, "max_window_s": 1.0, "profile_steps": 2},
        # no re-measuring unless a test asks (autotune.decide.confirm); finished_run does
        "search": {"n_trials": 3, "confirm_rounds": 0},
        "safety": {"level": "dynamics", "parity_steps": 6},  # parity as a search runs it, on fewer steps
        **overrides,
    }
    path.write_text(yaml.safe_dump(data))
    return path


def fixture_run(name: str, tmp_path, monkeypatch):
    """A finished run dir kept in tests/fixtures/runs (real searches on a 2-core CPU: the files its readers read,
    each result.json trimmed to its status, diagnosis and parity; no databases), copied to tmp_path/run with its
    paths made real (a program's dir: tmp_path), and read from tmp_path, as the user who started it there."""
    from pathlib import Path

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parent / "fixtures" / "runs" / name, run)
    for path in run.rglob("*"):
        if path.is_file():
            path.write_text(path.read_text().replace("{RUN_DIR}", str(run)).replace("{PROGRAM_DIR}", str(tmp_path)))
    monkeypatch.chdir(tmp_path)
    return run


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, ray_local):
    """One real search through the CLI, shared by the CLI, report and export tests."""
    from typer.testing import CliRunner

    from autotune.cli.main import app

    tmp = tmp_path_factory.mktemp("cli")
    spec = write_spec(tmp / "quick.yaml", output_dir=str(tmp / "run"), search={"n_trials": 3, "confirm_rounds": 1})
    result = CliRunner().invoke(app, ["search", str(spec), "--quiet"])
    return tmp / "run", result


@contextlib.contextmanager
def serving(cmd: list, url: str, timeout: float = 120):
    """Start a server in its own session, wait until `url`/health answers, and
    kill its whole process group at the end."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + timeout
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, proc.stdout.read().decode()[-2000:]
                time.sleep(1)
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture
def outside_hogs():
    """Processes that burn CPU and are not ours (reparented, as another user's job is)."""
    pids = []

    def start(n: int = 1) -> None:
        for _ in range(n):
            out = subprocess.run(
                ["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                capture_output=True,
                text=True,
                check=True,
            )
            pids.append(int(out.stdout))
        time.sleep(0.5)

    yield start
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
