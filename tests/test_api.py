"""`autotune.search`: a real search (Ray, Optuna, MLflow) with a factory that
cannot be imported by module path, shipped to the trials by value."""

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

import autotune
from autotune.records.state import SearchState
from autotune.cli.main import app
from autotune.config import TunedConfig
from autotune import spec as S
from autotune.spec import SpecError
from autotune.workload import WorkloadError
from tests import api_workloads as AW
from tests.test_cluster import cluster, cluster_env  # noqa: F401  (a two-node Ray cluster on loopback)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # CI tier: test_cache's searches through autotune.search, test_api's unpicklable factory refused
@pytest.mark.timeout(300)
def test_a_factory_defined_in_a_function_is_searched_and_a_trial_reproduced(tmp_path, ray_local):
    width = 6  # a closure: travels with the pickled factory

    def make(batch_size=16, extra=1):
        return autotune.Workload(
            model=lambda: AW.cnn(width * extra), dataset=AW.images(), loss=AW.classify, batch_size=batch_size
        )

    spec = AW.spec(
        tmp_path / "run",
        n_trials=2,
        confirm_rounds=1,
        search_space={
            "preset": None,
            "knobs": {"batch_size": [16, 64]},
            "workload_args": {"extra": {"values": [1, 2], "safety": "safe"}},
        },
    )
    result = autotune.search(spec, workload=make)

    trials = result.trials
    assert isinstance(trials, pd.DataFrame) and len(trials) == 2
    assert list(trials["status"]) == ["ok"] * 2, trials[["status", "error"]]
    best_config = autotune.load_config(result.best_config_path)
    assert isinstance(best_config, TunedConfig) and not result.reused
    if result.best is not result.baseline:  # re-measured with the pickled factory too (a baseline best is not)
        # one round ran with the pickled factory (a round disturbed by outside load is set aside, and counts
        # as measured: the factory ran)
        assert "error" not in result.confirm, result.confirm
        assert result.confirm["rounds"] + len(result.confirm.get("disturbed_pairs", [])) >= 1, result.confirm
    assert best_config.knobs["batch_size"] == result.best.knobs["batch_size"]
    # the factory's own argument is a searched knob: its signature was read from the callable
    assert best_config.workload_args == {"extra": result.best.knobs["args.extra"]}
    assert set(trials["args.extra"]) <= {1, 2} and trials["args.extra"][0] == 1  # the baseline: the default
    run_dir = result.run_dir
    name = f"{__name__}.test_a_factory_defined_in_a_function_is_searched_and_a_trial_reproduced.<locals>.make"
    assert yaml.safe_load((run_dir / "spec.yaml").read_text())["workload"]["pickled"] == name
    assert yaml.safe_load((run_dir / "best_config.yaml").read_text())["workload"]["ref"] == name
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    parent = client.search_runs(
        [client.get_experiment_by_name("autotune").experiment_id], "tags.`autotune.role` = 'search'"
    )[0]
    assert parent.data.params["workload"] == name

    # --resume reads the spec as written, and the run dir's own workload.pkl (here: nothing left to run)
    written = S.load(run_dir / "spec.yaml")
    written.output_dir = run_dir
    resumed = autotune.search(written, resume=True)
    assert [r.number for r in resumed.records] == [0, 1] and resumed.best.number == result.best.number

    # a trial by hand: its config points at the run dir's workload.pkl, wherever the config is read from;
    # what the factory uses from the user's own modules (tests.api_workloads, not installed) travels by value
    config = run_dir / "trials" / "0001" / "config.json"
    assert json.loads(config.read_text())["workload"]["file"] == "../../workload.pkl"
    out = tmp_path / "again.json"
    again = json.loads(_trial_by_hand(config, out, ROOT).read_text())
    assert again["status"] == "ok" and again["knobs"]["batch_size"] == trials["batch_size"][1]
    elsewhere = json.loads(_trial_by_hand(config, out, tmp_path).read_text())  # where `tests` does not import
    assert elsewhere["status"] == "ok", elsewhere.get("error")


def _trial_by_hand(config: Path, out: Path, cwd: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "autotune.trial", str(config), "-o", str(out)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out


NOTEBOOK = """
import json, sys
import torch
import autotune

def make_workload(batch_size=16):          # in __main__, as in a notebook
    data = torch.utils.data.TensorDataset(torch.randn(256, 3, 8, 8), torch.randint(0, 4, (256,)))
    model = lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 4))
    return autotune.Workload(model=model, dataset=data, batch_size=batch_size,
                             loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]))

result = autotune.search(json.loads(sys.argv[1]), workload=make_workload)
print(json.dumps({"status": list(result.trials["status"]), "best": autotune.load_config(result.best_config_path).knobs["batch_size"]}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_factory_in_main_runs_with_the_spawn_launcher(tmp_path):
    """A script's `__main__` (a notebook's scope), every trial started from scratch."""
    env = {**os.environ, "AUTOTUNE_LAUNCHER": "spawn", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NOTEBOOK), json.dumps(AW.spec(tmp_path / "run"))],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == ["ok", "ok"] and out["best"] in (16, 64)
    assert (tmp_path / "run" / "workload.pkl").exists()
    assert "__main__.make_workload" in (tmp_path / "run" / "spec.yaml").read_text()


def test_a_workload_that_is_not_callable_is_one_line(tmp_path):
    with pytest.raises(WorkloadError) as e:
        autotune.search(AW.spec(tmp_path / "run"), workload="tests.api_workloads:make_cnn")
    assert str(e.value) == (
        "workload: expected a factory callable returning autotune.Workload, got str; or leave it "
        "out and name the factory in the spec (workload.name or workload.factory)"
    )


def test_a_spec_naming_a_workload_and_a_callable_is_one_line(tmp_path):
    with pytest.raises(SpecError) as e:
        autotune.search({**AW.spec(tmp_path / "run"), "workload": {"name": "tiny_cnn"}}, workload=AW.make_cnn)
    assert str(e.value) == (
        "spec: workload: the spec names `name: tiny_cnn` and a factory callable "
        "(`tests.api_workloads.make_cnn`) was given; give one (leave workload.name and "
        "workload.factory out to use the callable)"
    )


def test_a_factory_that_cannot_be_pickled_is_one_line_and_nothing_is_written(tmp_path):
    lock = threading.Lock()

    def make():
        with lock:
            return AW.make_cnn()

    with pytest.raises(SpecError) as e:
        autotune.search(AW.spec(tmp_path / "run"), workload=make)
    message = str(e.value)
    assert message.startswith(
        f"workload factory `{__name__}.test_a_factory_that_cannot_be_pickled_is_one_line_and_"
        "nothing_is_written.<locals>.make` cannot be pickled for the trial processes (TypeError: "
    )
    assert message.endswith("build such objects inside the factory, not around it") and "\n" not in message
    assert not (tmp_path / "run").exists()


def test_reuse_and_refresh_together_is_one_line(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(AW.spec(tmp_path / "run", workload={"name": "tiny_cnn"})))
    result = CliRunner().invoke(app, ["search", str(spec), "--reuse", "--refresh"])
    assert result.exit_code == 2 and result.stderr == "error: give `--reuse` or `--refresh`, not both\n"


HELPER = """
import torch
import autotune


class Net(torch.nn.Module):                 # a class of the helper: pickled by reference unless carried by value
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(192, 4)

    def forward(self, x):
        return self.fc(x.flatten(1))


def build(batch_size=16):
    data = torch.utils.data.TensorDataset(torch.randn(256, 3, 8, 8), torch.randint(0, 4, (256,)))
    return autotune.Workload(model=Net, dataset=data, batch_size=batch_size,
                             loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]))
"""

SYS_PATH_NOTEBOOK = """
import json, sys
sys.path.insert(0, "../lib")              # the helper is importable only through the notebook's sys.path
import nbhelper
import autotune

spec, backend = json.loads(sys.argv[1]), sys.argv[2]
if spec.get("workload"):                  # the factory by reference: `nbhelper:build`
    result = autotune.search(spec, backend=backend)
else:                                     # a notebook's function calling the helper
    def make_workload(batch_size=16):
        return nbhelper.build(batch_size)
    result = autotune.search(spec, workload=make_workload, backend=backend)
print(json.dumps({"status": list(result.trials["status"])}))
"""


def sys_path_notebook(tmp_path: Path, spec: dict, env: dict, backend: str = "auto") -> subprocess.CompletedProcess:
    """Run SYS_PATH_NOTEBOOK from tmp/nb with the helper in tmp/lib; PYTHONPATH names neither."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "nbhelper.py").write_text(textwrap.dedent(HELPER))
    (tmp_path / "nb").mkdir()
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SYS_PATH_NOTEBOOK), json.dumps(spec), backend],
        cwd=tmp_path / "nb",
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=280,
    )


def loads_without_the_helper(pickled: Path) -> str:
    """Unpickle and call the factory in a process that cannot import nbhelper."""
    code = "import pickle, sys; f = pickle.load(open(sys.argv[1], 'rb')); print(type(f().model()).__name__)"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(pickled)],
        cwd=pickled.parent,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


@pytest.mark.slow  # in CI: the factory defined in a function (its closure pickled, through Ray, to the trials)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("by_reference", [False, True])
def test_a_helper_on_the_notebooks_sys_path_reaches_the_trials(tmp_path, by_reference):
    """The trials on the driver's node get the driver's sys.path directories; the
    pickled factory carries the helper by value (a node without ../lib can load it).
    The function's case on the local backend (the trials' PYTHONPATH and the pickle
    are the driver's on either; Ray carries a pickled factory in
    test_a_factory_defined_in_a_function_is_searched_and_a_trial_reproduced), which
    saves a Ray start."""
    spec = AW.spec(tmp_path / "run")
    if by_reference:
        spec["workload"] = {"factory": "nbhelper:build"}
    proc = sys_path_notebook(tmp_path, spec, dict(os.environ), "auto" if by_reference else "local")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == ["ok", "ok"]
    if not by_reference:
        assert loads_without_the_helper(tmp_path / "run" / "workload.pkl") == "Net"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_factory_in_main_with_a_sys_path_helper_reaches_trials_on_another_node(tmp_path, cluster):
    """The pickled bytes travel with the request, the helper by value in them: a
    node without the run dir (or ../lib) runs the factory; re-measuring too."""
    spec = AW.spec(
        tmp_path / "run",
        search={"sampler": "grid", "n_trials": 4, "confirm_rounds": 1},
        search_space={"preset": None, "knobs": {"batch_size": [16, 32, 64, 128]}},
        resources={"ray_address": cluster, "device": "cpu", "cpus_per_trial": 1, "gpus_per_trial": 1},
    )
    proc = sys_path_notebook(tmp_path, spec, cluster_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_csv(tmp_path / "run" / "trials.csv")
    assert list(table["status"]) == ["ok"] * 4 and set(table["node_ip"]) == {"127.0.0.2", "127.0.0.3"}
    assert loads_without_the_helper(tmp_path / "run" / "workload.pkl") == "Net"
    confirm = SearchState.read(tmp_path / "run").confirm
    from autotune.decide.confirm import RERUNS

    # a pair under the host's other load is measured again (RERUNS in all), else the speedup is unknown
    assert (confirm["rounds"] == 1 or len(confirm.get("disturbed_pairs", [])) > RERUNS) and "error" not in confirm
    remote = table[table["node_ip"] == "127.0.0.3"]["trial"].iloc[0]
    config = json.loads((tmp_path / "run" / "trials" / f"{remote:04d}" / "config.json").read_text())
    assert config["workload"]["file"] == "../../workload.pkl"  # as on the driver's node: reproducible from the run dir
