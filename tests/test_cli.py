"""The command line as a user sees it: exact messages, exit codes, a real search, the UI."""

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli.main import app
from autotune.records.state import SearchState
from tests.conftest import free_port, serving, write_spec

runner = CliRunner()


def test_bad_spec_is_one_line_exit_2_no_traceback(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", search={"sampler": "bayes"})
    result = runner.invoke(app, ["search", str(spec)])
    assert result.exit_code == 2
    assert (
        result.stderr
        == f"error: {spec}: search.sampler: Input should be 'autotune', 'tpe', 'random' or 'grid', got 'bayes'\n"
    )
    assert "Traceback" not in result.output


def test_missing_spec_file(tmp_path):
    result = runner.invoke(app, ["search", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert result.stderr == f"error: spec file `{tmp_path / 'nope.yaml'}` not found\n"


def test_a_bad_budget_is_one_line_exit_2(tmp_path):
    spec = write_spec(tmp_path / "s.yaml")
    result = runner.invoke(app, ["search", str(spec), "--budget", "5 weeks"])
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --budget: '5 weeks' is not a duration; give a positive number of seconds, or with a unit: 90s, 5m, 1h\n"
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["--"], "nothing after `--`: give your training command there, e.g. `autotune search -- python train.py`"),
        (
            ["--", "no-such-program-here", "--lr", "1"],
            "`no-such-program-here` is not a command on PATH: give the command that runs your training, e.g. "
            "`autotune search -- python train.py`",
        ),
        (
            ["-q", "--", "python", "-u", "train.py", "--lr", "1"],
            "`train.py` not found in {cwd}: give the command that runs your training, e.g. "
            "`autotune search -- python train.py`",
        ),
        (
            ["--", "torchrun", "--nproc-per-node", "2", "train.py"],  # a launcher's: each rank's script must be there
            "`train.py` not found in {cwd}: give the command that runs your training, e.g. "
            "`autotune search -- python train.py`",
        ),
        (
            ["s.yaml", "--", "python", "tiny_steps.py"],
            "give a spec or a command after `--`, not both: `s.yaml` names its own program (workload.command)",
        ),
        (
            ["--resume", "run", "--", "python", "tiny_steps.py"],
            "give `--resume RUN_DIR` or a command after `--`, not both: a resumed search runs the command it was "
            "started with (`run/spec.yaml`)",
        ),
        (
            ["python", "tiny_steps.py"],
            "`python tiny_steps.py`: a training command goes after `--`: `autotune search [OPTIONS] -- python "
            "tiny_steps.py`",
        ),
        (
            ["tiny_steps.py"],
            "`tiny_steps.py` is a program, not a spec: run it after `--`, `autotune search -- python tiny_steps.py`",
        ),
        (
            ["--first-step-limit", "soon", "--", "python", "tiny_steps.py"],
            "--first-step-limit: 'soon' is not a duration; give a positive number of seconds, or with a unit: 90s, "
            "5m, 1h",
        ),
        (
            ["--budget", "2", "minutes", "--", "python", "tiny_steps.py"],  # a new user's first try (a README walk)
            "`minutes` is no spec file: a duration is one word, its unit joined to it (`--budget 2m`, 90s, 1h)",
        ),
        (
            ["--n-trials", "0", "--", "python", "tiny_steps.py"],
            "--n-trials: give 1 or more (the baseline is the first trial), got 0",
        ),
        (
            [],
            "give a spec (`autotune search spec.yaml`), a training command after `--` (`autotune search -- python "
            "train.py`) or a search to continue (`--resume RUN_DIR`)",
        ),
    ],
)
def test_a_search_of_a_command_refuses_bad_input_in_one_line_before_anything_runs(tmp_path, monkeypatch, args, says):
    shutil.copy(Path(__file__).parent / "programs" / "tiny_steps.py", tmp_path)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["search", *args])
    assert result.exit_code == 2
    assert result.stderr == f"error: {says.format(cwd=tmp_path)}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_steps.py"]  # nothing written


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="flash attention's reason here is this CPU's (no CUDA device)"
)
def test_a_language_models_knob_asked_for_that_cannot_run_here_is_one_line_exit_2(tmp_path):
    space = {"preset": None, "knobs": {"batch_size": [16, 32], "attention": ["sdpa", "flash_attention_3"]}}
    spec = write_spec(tmp_path / "s.yaml", search_space=space, output_dir=str(tmp_path / "run"))
    result = runner.invoke(app, ["search", str(spec), "--backend", "local"])
    assert result.exit_code == 2
    assert result.stderr == (
        "error: search_space.knobs.attention: flash_attention_3 cannot run here: FlashAttention is CUDA only; no "
        "CUDA device; here it runs eager, sdpa: ask for those, or leave attention out (the lm preset tries what "
        "runs)\n"
    )
    assert not (tmp_path / "run").exists()  # nothing written


def test_budget_durations():
    from autotune.decide.budget import parse_duration

    assert [parse_duration(t) for t in ("300", "90s", "5m", "1.5h")] == [300, 90, 300, 5400]


def test_debug_shows_the_exception(tmp_path):
    from autotune.spec import SpecError

    result = runner.invoke(app, ["search", str(tmp_path / "nope.yaml"), "--debug"])
    assert isinstance(result.exception, SpecError)


def test_a_factory_that_does_not_import_is_a_user_error(tmp_path, ray_local):
    spec = write_spec(
        tmp_path / "s.yaml", workload={"factory": "no_such_pkg.train:make"}, output_dir=str(tmp_path / "run")
    )
    result = runner.invoke(app, ["search", str(spec)])
    assert result.exit_code == 2
    assert result.stderr == (
        "error: workload: workload factory `no_such_pkg.train:make`: cannot import `no_such_pkg.train`: "
        "ModuleNotFoundError: No module named 'no_such_pkg'; run the search from the directory that "
        "contains `no_such_pkg` (trials import it the same way), or add that directory to PYTHONPATH\n"
    )


@pytest.mark.timeout(300)
def test_search_prints_trials_summary_and_paths(finished_run):
    run_dir, result = finished_run
    assert result.exit_code == 0, result.output
    out = result.output
    assert "autotune search on cpu" in out
    assert "fixed pin_memory=off: pinned memory only speeds host-to-GPU copies; no CUDA device" in out
    assert out.count("samples/s") >= 3 and "[1/3] trial   0 ok baseline  " in out
    assert "[3/3] trial" in out and "left)" in out  # progress with an ETA, one line per trial
    assert "incumbent" not in out  # the incumbent on the line of the trial that made it one
    screen = out[out.index("\n\n") :]  # the last screen: the answer first, its command, the table
    assert screen.split("\n")[2].startswith(("speedup", "a tie", "no config")), screen
    # a long run-dir path wraps inside the word at 80 columns: compared with the white space taken out
    command = f'run it: cfg = autotune.load_config("{run_dir / "best_config.yaml"}")'
    assert "".join(command.split()) in "".join(screen.split())
    assert "baseline vs best (3 trials" in screen
    assert f"details: autotune report {run_dir} · trials: autotune ui {run_dir}" in " ".join(screen.split())
    assert "per-knob effect" not in out and "wrote:" not in out  # in `autotune report`


def get_json(url, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read() or b"{}")


def test_ui_without_a_search_says_what_to_do(tmp_path):
    result = runner.invoke(app, ["ui", str(tmp_path)])
    assert result.exit_code == 2
    assert (
        result.stderr
        == f"error: `{tmp_path}` has no mlflow.db; run `autotune search spec.yaml` first, or pass its output dir\n"
    )


@pytest.mark.slow  # CI tier: test_network's search on loopback only; the ui command's bad input in this module
@pytest.mark.timeout(180)
def test_ui_serves_the_search_runs_on_loopback(finished_run):
    run_dir, _ = finished_run
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with serving([sys.executable, "-m", "autotune.cli", "ui", str(run_dir), "--port", str(port)], base):
        exp = get_json(base + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=autotune")["experiment"]
        assert {"key": "mlflow.experimentKind", "value": "custom_model_development"} in exp["tags"]
        runs = get_json(base + "/api/2.0/mlflow/runs/search", {"experiment_ids": [exp["experiment_id"]]})["runs"]
        trials = [
            r for r in runs if any(t["key"] == "autotune.role" and t["value"] == "trial" for t in r["data"]["tags"])
        ]
        assert len(runs) == 4 and len(trials) == 3
        assert all(any(m["key"] == "samples_per_s" for m in r["data"]["metrics"]) for r in trials)
        assert all({p["key"] for p in r["data"]["params"]} >= {"batch_size", "channels_last"} for r in trials)
        parent = next(r for r in runs if r not in trials)
        listed = get_json(f"{base}/api/2.0/mlflow/artifacts/list?run_id={parent['info']['run_id']}&path=plots")
        assert {f["path"] for f in listed["files"]} >= {
            "plots/throughput_per_trial.png",
            "plots/parallel_coordinates.png",
        }


def test_ui_link_opens_the_trials_fastest_first_with_their_columns(finished_run, tmp_path):
    """The view the printed link names is in the store: this search's trials, flat
    (no parent run among them), by samples_per_s; a store without it gets it."""

    from mlflow.tracking import MlflowClient

    from autotune.integrations import tracking
    from autotune.cli.ui import _trials_url

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(finished_run[0] / "mlflow.db", run_dir / "mlflow.db")
    SearchState.read(finished_run[0]).write(run_dir)
    parent = SearchState.read(run_dir).mlflow_parent_run_id
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("autotune")
    key = tracking.VIEW_TAG + f"autotune-{parent}"
    view = json.loads(exp.tags[key])
    assert _trials_url(run_dir, run_dir / "mlflow.db", "http://127.0.0.1:5000") == (
        f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs"
        f"?workflowType=machine_learning&viewStateShareKey=autotune-{parent}"
    )
    order = view["orderByKey"].replace("`", "") + (" ASC" if view["orderByAsc"] else " DESC")
    runs = client.search_runs([exp.experiment_id], view["searchFilter"], order_by=[order])
    assert [r.data.tags["autotune.role"] for r in runs] == ["trial"] * 3
    speeds = [r.data.metrics["samples_per_s"] for r in runs]
    assert speeds == sorted(speeds, reverse=True)
    knobs = [k.removeprefix("space.") for k in client.get_run(parent).data.params if k.startswith("space.")]
    assert knobs and view["selectedColumns"] == [
        "metrics.`samples_per_s`",
        "metrics.`tokens_per_s`",
        "metrics.`mfu`",
        "metrics.`speedup_x`",
        "tags.`remeasured`",
        "tags.`pairs`",
        "tags.`outcome`",
        "tags.`safety.parity`",
        *(f"params.`{k}`" for k in knobs),
        "tags.`safety.flags`",
    ]
    assert [c["metricKey"] for c in view["compareRunCharts"]] == ["samples_per_s", "tokens_per_s", "speedup_x"]
    assert all(
        {"samples_per_s", "speedup_x"} <= set(r.data.metrics)
        and set(knobs) <= set(r.data.params)
        and {"outcome", "safety.flags"} <= set(r.data.tags)
        for r in runs
    )
    client.delete_experiment_tag(exp.experiment_id, key)  # a store from before the view was saved
    _trials_url(run_dir, run_dir / "mlflow.db", "http://127.0.0.1:5000")
    assert json.loads(client.get_experiment(exp.experiment_id).tags[key]) == view


@pytest.mark.slow  # in CI: the same first screen read from the store (test_tracking: its columns, 4 figures, the
# winner's row with its re-measured speedup), and the served API (test_ui_serves_the_search_runs_on_loopback)
@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="chromium is not installed (apt-get install chromium): the UI's first screen is not checked",
)
@pytest.mark.timeout(300)
def test_ui_first_screen_in_chromium_shows_the_trials_by_throughput(finished_run, tmp_path):
    """A real browser on the printed link: every trial a row, fastest first, the
    samples_per_s column drawn at 4 significant figures, the best's row named so with its re-measured speedup and
    the pairs' range, the sidebar in model-training mode (Debian's chromium; `apt-get install chromium`)."""
    import re
    import subprocess

    from mlflow.tracking import MlflowClient

    run_dir, _ = finished_run
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with serving([sys.executable, "-m", "autotune.cli", "ui", str(run_dir), "--port", str(port)], base) as proc:
        url = re.search(r"http://\S+", proc.stdout.readline().decode()).group(0)
        dom = subprocess.run(
            [
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                f"--user-data-dir={tmp_path}",
                "--window-size=1600,1000",
                "--virtual-time-budget=20000",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=240,
        ).stdout
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("autotune").experiment_id])
    trials = sorted(
        (r for r in runs if r.data.tags["autotune.role"] == "trial"), key=lambda r: -r.data.metrics["samples_per_s"]
    )
    rows = dict(re.findall(r'row-index="(\d+)" row-id="(\w+)"', dom))
    assert [rows.get(str(i)) for i in range(len(rows))] == [r.info.run_id for r in trials], dom[-3000:]
    assert 'col-id="metrics.`samples_per_s`"' in dom
    assert "Model registry" in dom and "Judges" not in dom  # the sidebar in model-training mode, not GenAI
    # numbers a person reads (4 significant figures), the winner's row named so, with its re-measured speedup
    shown = re.findall(r'id="cell-metrics.`(?:samples_per_s|speedup_x)`-\d+" class="ag-cell-value">([^<]*)<', dom)
    assert shown and all(len(re.sub(r"\D", "", v).lstrip("0")) <= 4 for v in shown), shown
    from autotune.export import answer as A
    from autotune.records.run_dir import read_run

    for record, best, cells, _ in A.rows(read_run(run_dir)):
        assert not best or f"trial-{record.number:03d} ({'baseline, ' if record.is_baseline else ''}best)" in dom
        for key, value in cells.items():
            assert re.search(rf'id="cell-tags.`{key}`-\d+" class="ag-cell-value">{re.escape(value)}<', dom), value


def test_a_baseline_the_device_cannot_run_is_replaced_loudly(tmp_path):
    # the baseline alone, on the local backend: the replacement is the plan's, said before any trial and on the
    # last screen whatever runs the trials
    spec = write_spec(
        tmp_path / "s.yaml",
        baseline={"precision": "16-mixed"},
        output_dir=str(tmp_path / "run"),
        search_space={"preset": None, "knobs": {"batch_size": [16, 32]}},
        search={"n_trials": 1, "confirm_rounds": 0},
    )
    result = runner.invoke(app, ["search", str(spec), "--quiet", "--backend", "local"])
    assert result.exit_code == 0, result.output
    line = "precision='16-mixed': fp16 mixed precision with GradScaler needs a CUDA device; using '32-true'"
    assert f"not run: baseline {line}" in result.stdout  # when the search starts
    assert f"baseline replaced: {line}" in " ".join(result.stdout.split())  # and on the last screen


def test_the_command_exits_with_its_code_after_the_exit_handlers_without_the_teardown(tmp_path):
    """`autotune` (cli.main) runs the exit handlers, flushes, and leaves with the
    command's exit code, skipping the interpreter's teardown."""
    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('exit handler ran', flush=True))\n"
        "sys.argv = ['autotune', 'search', 'missing.yaml']\n"
        "from autotune.cli.main import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert done.returncode == 2, done.stderr
    assert "missing.yaml" in done.stderr and done.stdout.strip() == "exit handler ran"
    helped = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "--help"], capture_output=True, text=True, timeout=120
    )
    assert helped.returncode == 0 and "search" in helped.stdout


def test_export_from_online_writes_the_loader_settings_over_best_config(tmp_path):
    import yaml

    log = tmp_path / "online.log"
    log.write_text(
        "other output\n"
        'autotune online: summary after 9 steps | {"event": "summary", "settings": {"num_workers": 3, '
        '"prefetch_factor": 2, "pin_memory": false, "persistent_workers": false}}\n'
    )
    alone = CliRunner().invoke(app, ["export", "--from-online", str(log)])
    assert alone.exit_code == 0, alone.output
    assert yaml.safe_load(alone.output) == {
        "knobs": {"num_workers": 3, "prefetch_factor": 2, "pin_memory": False, "persistent_workers": False}
    }
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "best_config.yaml").write_text(yaml.safe_dump({"knobs": {"num_workers": 0, "precision": "bf16-mixed"}}))
    merged = CliRunner().invoke(app, ["export", str(run_dir), "--from-online", str(log)])
    assert yaml.safe_load(merged.output)["knobs"] == {
        "num_workers": 3,
        "precision": "bf16-mixed",
        "prefetch_factor": 2,
        "pin_memory": False,
        "persistent_workers": False,
    }
    (run_dir / "best_config.yaml").write_text(
        yaml.safe_dump(
            {
                "knobs": {"num_workers": 0, "precision": "bf16-mixed"},
                "device": {"type": "cpu"},
                "safety": [{"knob": "precision", "baseline": "32-true", "tuned": "bf16-mixed", "safety": "numerics"}],
            }
        )
    )
    out = tmp_path / "best_online.yaml"
    assert CliRunner().invoke(app, ["export", str(run_dir), "--from-online", str(log), "-o", str(out)]).exit_code == 0
    import autotune

    assert autotune.config(out).dataloader_kwargs(batch_size=8)["num_workers"] == 3  # listed, so applied
    bad = CliRunner().invoke(app, ["export", "--from-online", str(run_dir / "best_config.yaml")])
    assert bad.exit_code == 2
    assert "has no `autotune online:` lines: not the log of an OnlineLoader run" in bad.output
