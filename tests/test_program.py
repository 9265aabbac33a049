"""A user's own program as the trial (autotune.execution.program and the
launcher's program path), searched by `autotune search` as a user runs it."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.decide.budget import NOTHING_LEFT
from autotune.records.run_dir import read_run
from autotune.records.state import SearchState
from autotune.trial.result import TOKENS, TrialResult

pytestmark = pytest.mark.timeout(600)

PROGRAMS = Path(__file__).parent / "programs"
ROOT = Path(__file__).parent.parent
TRIAL = {
    "warmup_steps": 2,
    "measure_steps": 5,
    "min_window_s": 0.3,
    "max_window_s": 2.0,
    "profile_steps": 0,
    "timeout_s": 120,
}


# a program that builds its model and optimizer, then waits forever: no optimizer step, ever
NO_STEP = """\
import time

import torch

model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def wait_forever():
    while True:
        time.sleep(1)


wait_forever()
"""
NO_STEP_LINE = NO_STEP.splitlines().index("        time.sleep(1)") + 1  # where its main thread waits


def search(tmp_path, command, knobs, n_trials=3, trial=None, spec_extra=None, backend="local"):
    """`autotune search` on a program, on the local backend (test_network searches a program through Ray, the
    default where Ray is installed: the others save its ~10 s start)."""
    spec = {
        "name": "p",
        "workload": {"command": command},
        "search_space": {"preset": None, "knobs": knobs},
        "trial": {**TRIAL, **(trial or {})},
        "search": {"n_trials": n_trials, "seed": 1, "confirm_rounds": 0},
        "output_dir": str(tmp_path / "run"),
        **(spec_extra or {}),
    }
    for name in os.listdir(PROGRAMS):  # the spec's directory holds the program, as a user's would
        if name.endswith(".py"):
            (tmp_path / name).write_text((PROGRAMS / name).read_text())
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = Path(sys.executable).parent / "autotune"
    return subprocess.run(
        [str(cli), "search", str(tmp_path / "spec.yaml"), "-q", "--backend", backend],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def bench_program(run_dir, *args: str) -> dict:
    """scripts/bench/bench_program.py on a finished search: its last line (measured = exported)."""
    bench = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench" / "bench_program.py"), str(run_dir), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert bench.returncode == 0, bench.stderr[-2000:]
    return json.loads(bench.stdout.strip().splitlines()[-1])


def loader_loop_searched(where: Path) -> dict:
    """What a search of `python loader_loop.py ...` over num_workers and the attention kernel (from `where`, its
    run dir `where/run`) must have done: every trial ran, both worker counts; the attention kernel fixed, its model
    is no transformers model; the baseline its own settings, found by torch's hooks (no line of autotune in it); no
    trial saved a model. Its best_config.yaml."""
    run = read_run(where / "run")
    assert {r.status for r in run.records} <= {"ok", "pruned"} and len(run.records) >= 2
    assert {r.knobs["num_workers"] for r in run.records} == {0, 1}
    space = SearchState.read(where / "run").space
    assert space["search"] == {"num_workers": [0, 1]}
    assert space["fixed"]["attention"].startswith("Sequential is not a transformers model")
    first = TrialResult.read(where / "run" / "trials" / "0000" / "result.json")
    assert first.knobs == {} and first.own_knobs["batch_size"] == 16  # the baseline: its own settings
    assert first.used == ["torch:autocast", "torch:loader", "torch:model", "torch:optimizer", "torch:zero_grad"]
    assert not (where / "model.pt").exists()  # every trial ended after its window: no final save
    best = yaml.safe_load((where / "run" / "best_config.yaml").read_text())
    assert best["workload"]["command"][:2] == ["python", "loader_loop.py"] and best["workload"]["dir"] == str(where)
    return best


@pytest.mark.slow  # in CI: test_network searches this program through Ray to the end (its space, its baseline, its
# best's command), and bench_programs' smoke runs bench_program.py on a program's search
def test_a_dataloader_program_is_searched_to_the_end(tmp_path):
    proc = search(
        tmp_path,
        "python loader_loop.py --steps 400 --batch_size 16",
        {"num_workers": [0, 1], "attention": ["sdpa", "eager"]},
    )  # a program through Ray: test_network's search
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    best = loader_loop_searched(tmp_path)
    # measured = exported: the program itself in production mode, baseline and best (scripts/bench/bench_program.py)
    last = bench_program(tmp_path / "run", "--pairs", "1", "--steps", "8", "--warmup", "2")
    assert last["claimed_speedup_x"] == best["measured"]["speedup_x"] and len(last["pairs"]) == 1
    assert all(x > 0 for x in last["baseline_samples_per_s"] + last["best_samples_per_s"])


def test_a_command_with_no_spec_is_searched_in_its_time_budget_and_says_the_production_command(tmp_path):
    (tmp_path / "tiny_steps.py").write_text((PROGRAMS / "tiny_steps.py").read_text())
    cli = Path(sys.executable).parent / "autotune"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}  # the last screen's lines whole
    proc = subprocess.run(  # 3 trials, or 30 s if sooner: a budget counts the probe, which another search may slow
        [str(cli), "search", "--budget", "30s", "--n-trials", "3", "-q", "--backend", "local", "--"]
        + ["python", "tiny_steps.py"],
        cwd=tmp_path,  # where the user runs it: the program's directory, runs/ made there
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("tiny_steps-")  # named after its script
    spec = yaml.safe_load((run_dir / "spec.yaml").read_text())  # what `--resume` runs again
    assert spec["workload"] == {**spec["workload"], "command": ["python", "tiny_steps.py"], "dir": str(tmp_path)}
    assert spec["search"]["time_budget_s"] == 30 and spec["safety"]["keep_effective_batch"]
    state = SearchState.read(run_dir)
    # its probe: the methods it calls, and what torch's hooks reach beside them (autotune.instrument._torch)
    assert state.program["used"] == [
        *("data", "dataloader_kwargs", "step"),
        *("torch:autocast", "torch:model", "torch:optimizer", "torch:zero_grad"),
    ]
    assert state.program["own"]["batch_size"] == 8  # its own batch, `cfg.dataloader_kwargs(batch_size=8)`: the
    assert state.space["baseline"]["batch_size"] == 8  # baseline's
    assert "num_threads" in state.space["search"]  # the default preset's knobs it takes
    assert "compile" in state.space["search"]  # through its model's first forward (torch's hooks)
    assert state.space["fixed"]["padding_free"].startswith("not used by your program: it iterates no padded")
    best = yaml.safe_load((run_dir / "best_config.yaml").read_text())
    production = f"autotune run runs/{run_dir.name}/best_config.yaml -- python tiny_steps.py"
    assert best["production"]["command"] == production and best["production"]["adds"] == []  # no flag: cfg's
    changed = {f["knob"]: f["tuned"] for f in best["safety"]}
    assert best["production"]["applies"] == changed  # through autotune.config() in the process
    lines = proc.stdout.splitlines()
    assert f"run it: {production}" in lines  # the last screen's command
    adds = [line for line in lines if line.startswith("  it adds: ")]
    assert len(adds) == (1 if changed else 0) and all(
        a.startswith("  it adds: set in its process: ") and a.count("=") == len(changed) for a in adds
    )
    again = subprocess.run([str(cli), *production.split()[1:], "--steps", "5"], cwd=tmp_path, env=env)  # as said
    assert again.returncode == 0


def test_an_own_value_the_device_cannot_run_is_no_baseline_to_replace():
    from autotune import knobs as K
    from autotune.execution.program import inert

    cpu, h100 = K.Device("cpu", 2), K.Device("cuda", 8, "H100", (9, 0))
    own = {"pin_memory": True, "num_workers": 2}  # a Trainer's defaults: pinned memory, which a CPU ignores
    assert inert(own, cpu, {}) == {"pin_memory": False} and inert(own, h100, {}) == {}
    assert inert(own, cpu, {"pin_memory": True}) == {}  # a spec's baseline says what it says (and is replaced)


@pytest.mark.parametrize(
    "command,says",
    [
        ("no_such_program --x", "workload.command: cannot run `no_such_program`"),
        (
            "python tiny_steps.py --mode exit_early",
            "the program exited with code 0 before its first optimizer step (it imported torch, but made no "
            "optimizer): a trial measures a torch optimizer's steps",
        ),
    ],
)
def test_a_program_that_cannot_be_a_trial_is_refused_in_one_line_before_any_trial(tmp_path, command, says):
    proc = search(tmp_path, command, {"num_workers": [0, 1]}, trial={"timeout_s": 6})
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0]
    assert not (tmp_path / "run" / "trials").exists()  # no trial ran


def refused(tmp_path, *options: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """`autotune search OPTIONS --backend local -- python prog.py` on NO_STEP, as a user runs it from its
    directory: the finished command and its wall time."""
    (tmp_path / "prog.py").write_text(NO_STEP)
    started = time.monotonic()
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "autotune"), "search", *options, "--backend", "local", "--"]
        + ["python", "prog.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "probe" / "trial.log").exists() and not (run_dir / "trials").exists()  # its log kept
    return proc, time.monotonic() - started


SAW = "it imported torch and made an optimizer, but iterated no DataLoader"
WHERE = f"its main thread was in `wait_forever` (prog.py:{NO_STEP_LINE})"


def test_a_program_with_no_first_step_in_its_limit_is_refused_saying_what_it_did_and_where_it_was(tmp_path):
    proc, wall = refused(tmp_path, "--first-step-limit", "5s", "-q")
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert proc.stderr == (
        "error: workload.command: the program finished no optimizer step within its first-step limit of 0:05 "
        f"(`--first-step-limit` or trial.first_step_s sets it): {SAW}; {WHERE}; see {run_dir}/probe/trial.log\n"
    )
    assert wall < 30
    # the probe as a phase of the search, a line as it starts and as it ends (-q)
    start, end = proc.stdout.splitlines()
    assert start == "probe: running your program once at its own settings (a first step due within 0:05)"
    assert re.fullmatch(r"probe: ended after 0:(0[5-9]|[12]\d)", end), end  # the fork server's imports before it


@pytest.mark.slow  # CI tier: the refusal at a 5 s limit (test_program) and the budget's cap (test_deadlines)
def test_the_probe_of_a_program_with_no_first_step_never_waits_past_the_budget(tmp_path):
    proc, wall = refused(tmp_path, "--budget", "20s", "-q")  # the first-step limit left at its 2 minutes
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert re.fullmatch(
        r"error: workload\.command: the program finished no optimizer step within its first-step limit of "
        r"0:(19|20) \(what was left of the time budget; `--budget` sets it\): "
        + re.escape(f"{SAW}; {WHERE}; see {run_dir}/probe/trial.log\n"),
        proc.stderr,
    ), proc.stderr
    assert wall < 75


@pytest.mark.slow  # in CI: test_launcher's plain-process ranks ended at their first-step limit (the same watch)
def test_a_program_started_as_a_plain_process_has_the_same_first_step_limit(tmp_path):
    # a fresh process imports torch in its limit: 2-3 s here, more under load
    proc, wall = refused(tmp_path, "--first-step-limit", "10s", env={"AUTOTUNE_LAUNCHER": "spawn"})
    (run_dir,) = (tmp_path / "runs").iterdir()
    said = (
        "error: workload.command: the program finished no optimizer step within its first-step limit of 0:10 "
        f"(`--first-step-limit` or trial.first_step_s sets it): {SAW}"
    )
    # where its main thread was: where the fresh process's instrumentation registers faulthandler (forked: the server)
    assert proc.stderr in (
        f"{said}; {WHERE}; see {run_dir}/probe/trial.log\n",
        f"{said}; see {run_dir}/probe/trial.log\n",
    )
    assert wall < 30


@pytest.mark.slow  # the default limit's 2 minutes: in CI, the same refusal at a limit of 5 s, and under a budget
def test_a_program_with_no_first_step_is_refused_at_the_default_limit(tmp_path):
    proc, wall = refused(tmp_path, "-q")
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert proc.stderr == (
        "error: workload.command: the program finished no optimizer step within its first-step limit of 2:00 "
        f"(`--first-step-limit` or trial.first_step_s sets it): {SAW}; {WHERE}; see {run_dir}/probe/trial.log\n"
    )
    assert 120 <= wall < 150


def hung_searched(run_dir: Path, stdout: str, frame: str) -> tuple:
    """What a search of a program whose Dataset hangs in a loader worker must have left (`frame`: the Dataset's
    method the worker waits in, "Windows.__getitem__"): the one trial with workers `hung`, where it waited named
    in its error, its row in trials.csv and its MLflow run; no other trial with workers; the last screen names
    it. The hung record and the others."""
    import pandas as pd
    from mlflow.tracking import MlflowClient

    run = read_run(run_dir)
    (hung,) = [r for r in run.records if r.status == "hung"]
    others = [r for r in run.records if r is not hung]
    assert hung.knobs["num_workers"] > 0 and all(r.knobs["num_workers"] == 0 for r in others), [
        (r.number, r.status, r.knobs["num_workers"]) for r in run.records
    ]
    assert hung.error_type == "NoStep" and hung.hung == {"kind": "loader", "where": f"loader worker 0 in {frame}"}
    assert f"; waiting for loader worker 0, which is in `{frame}` (" in hung.error
    row = pd.read_csv(run_dir / "trials.csv").set_index("trial").loc[hung.number]
    assert (row["status"], row["error"]) == ("hung", hung.error)
    runs = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}").search_runs(["1"])
    (mlrun,) = [r for r in runs if r.data.tags.get("trial_number") == str(hung.number)]
    assert (mlrun.data.tags["outcome"], mlrun.data.tags["hung.where"]) == ("hung", f"loader worker 0 in {frame}")
    said = f"1 trial hung: num_workers={hung.knobs['num_workers']} (loader worker 0 in {frame}): see "
    assert any(line.startswith(said) and line.endswith("/trial.log") for line in stdout.splitlines()), stdout
    return hung, others


def test_a_program_whose_dataset_hangs_in_a_loader_worker_is_hung_and_no_worker_count_is_tried_again(tmp_path):
    """tests/programs/hang_loop.py, a plain loop with no line of autotune (the zero-code path): its Dataset waits
    forever in a forked loader worker. The trial with workers ends `hung` at its first-step limit, naming the
    worker's frame (its row, its MLflow run, the last screen); num_workers > 0 is ruled out, so the grid's other
    worker count never runs, and the search ends with the rest of its space. (The same with `--budget 3m` and the
    default space, a Trainer script's too: the slow tests below.)"""
    from tests.test_launcher import processes_in

    proc = search(
        tmp_path,
        "python hang_loop.py --steps 100000 --batch_size 8",
        {"num_workers": [0, 1, 2]},
        n_trials=3,
        trial={"first_step_s": 8},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    hung, others = hung_searched(tmp_path / "run", proc.stdout, "Windows.__getitem__")
    assert hung.error.startswith("the program finished no optimizer step within its first-step limit of 0:08")
    assert [r.status for r in others] == ["ok"]  # the baseline; num_workers=2 was ruled out, not run
    log = (tmp_path / "run" / "trials" / f"{hung.number:04d}" / "trial.log").read_text()
    assert "autotune: the stacks of loader worker 0 (pid " in log  # each process's, after the main process's
    assert processes_in(tmp_path) == []  # the program and its worker
    # the grid's num_workers=2: ruled out by the hang, never run
    assert json.loads((tmp_path / "run" / "search.json").read_text())["ended"] == NOTHING_LEFT


@pytest.mark.slow  # in CI: the grid search of hang_loop.py above (hung, ruled out, recorded, on the last screen),
# test_launcher's hung loader worker (its stacks, no process left), test_strategy's hang rules (and `--resume`'s)
@pytest.mark.timeout(900)  # ~4 min alone; a search measuring on this CPU holds it longer (the device lock)
@pytest.mark.parametrize(
    "command, frame",
    [
        ("python hang_loop.py --steps 100000 --batch_size 16", "Windows.__getitem__"),  # a plain loop, zero-code
        (
            "python clm_hang.py --output_dir out --max_steps 100000 --per_device_train_batch_size 4 --report_to none"
            " --save_strategy no",
            "Corpus.__getitem__",
        ),  # an HfArgumentParser Trainer script
    ],
    ids=["plain-loop", "trainer"],
)
def test_a_program_whose_dataset_hangs_in_workers_is_searched_on_in_its_3_minutes(tmp_path, command, frame):
    """Issue 63's user: `autotune search spec.yaml --budget 3m` on a program whose Dataset hangs in a loader
    worker, the CPU-sized preset (quick: the default's compile trials take ~30 s each to compile here). The trial with workers is hung within 30 s of its first-step limit (3x the baseline's
    first step + 30 s), its row, its MLflow run and the last screen naming the worker's frame; no other trial
    with workers; the search ends in its budget with 5 other trials or more."""
    for name in ("hang_loop.py", "clm_hang.py"):
        (tmp_path / name).write_text((PROGRAMS / name).read_text())
    spec = {"name": "hang", "workload": {"command": command}, "search_space": {"preset": "quick"}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    cli = Path(sys.executable).parent / "autotune"
    started = time.monotonic()
    proc = subprocess.run(
        [str(cli), "search", "spec.yaml", "--budget", "3m", "-o", "run"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=800,
    )
    wall = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    hung, others = hung_searched(tmp_path / "run", proc.stdout, frame)
    limit = re.search(r"first-step limit of (\d+):(\d\d) \(3 x the baseline's first step", hung.error)
    assert limit, hung.error
    assert hung.info["trial_wall_s"] < int(limit[1]) * 60 + int(limit[2]) + 30
    assert len(others) >= 1 + 5 and all(r.status in ("ok", "pruned") for r in others)
    searched = json.loads((tmp_path / "run" / "search.json").read_text())
    print(f"wall {wall:.0f} s; hung trial {hung.info['trial_wall_s']:.0f} s; {len(others)} other trials; {searched}")


@pytest.mark.slow  # in CI: test_reliability's faults (error trials, the search goes on), test_launcher's failed
# trial (its traceback in trial.log)
def test_a_candidate_that_raises_is_an_error_trial_and_the_search_goes_on(tmp_path):
    proc = search(
        tmp_path,
        ["python", "tiny_steps.py", "--mode", "fail_with_workers"],
        {"num_workers": [0, 1], "set_to_none": [True, False]},
        n_trials=3,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = read_run(tmp_path / "run")
    failed = [r for r in run.records if r.knobs["num_workers"] == 1]
    assert failed and all(r.status == "error" for r in failed)
    log = (tmp_path / "run" / "trials" / f"{failed[0].number:04d}" / "trial.log").read_text()
    assert "RuntimeError: this program breaks with loader workers" in log  # its traceback
    assert any(r.status == "ok" and not r.is_baseline for r in run.records) or len(run.records) >= 2


@pytest.mark.slow
def test_a_custom_loop_without_a_loader_is_searched_through_its_own_flags(tmp_path):
    import numpy as np

    np.random.default_rng(0).integers(0, 65, 50000, dtype=np.uint16).tofile(tmp_path / "data.bin")
    spec_args = {"batch_size": {"values": [4, 16], "safety": "dynamics"}}
    proc = search(
        tmp_path,
        "python memmap_loop.py --data data.bin --batch_size 4 --max_iters 400",
        {"num_workers": [0, 2]},
        n_trials=3,
        spec_extra={
            "search_space": {"preset": None, "knobs": {"num_workers": [0, 2]}, "workload_args": spec_args},
            "safety": {"level": "dynamics"},
        },
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = read_run(tmp_path / "run")
    space = SearchState.read(tmp_path / "run").space
    assert space["search"] == {"args.batch_size": [4, 16]}
    assert space["fixed"]["num_workers"].startswith("not used by your program")  # no DataLoader
    big = next(r for r in run.records if r.knobs["args.batch_size"] == 16)
    config = json.loads((tmp_path / "run" / "trials" / f"{big.number:04d}" / "config.json").read_text())
    assert config["workload"]["command"][-2:] == ["--batch_size", "16"]  # the flag replaced, not repeated
    assert config["workload"]["command"].count("--batch_size") == 1
    result = TrialResult.read(tmp_path / "run" / "trials" / f"{big.number:04d}" / "result.json")
    assert result.used == ["data", "step"] and "data_wait_frac" in result.metrics
    assert big.metrics["samples_per_s"] == pytest.approx(32 * big.metrics["steps_per_s"])  # 16 x 2 micro-batches
    assert len(result.losses) >= 3 and all(x > 0 for x in result.losses)
    # cfg.step(tokens=...): a language model's search, in tokens/s (16 tokens a sample) from its objective on
    assert big.metrics["tokens_per_s"] == pytest.approx(16 * big.metrics["samples_per_s"])
    assert run.unit is TOKENS and big.measured == big.metrics["tokens_per_s"]  # a pruned trial's too
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{tmp_path / 'run' / 'optuna.db'}")
    told = {t.number: t.values[0] for t in study.trials if t.values and not t.user_attrs.get("virtual")}
    assert told and all(
        told[r.number] == pytest.approx(r.metrics["tokens_per_s"]) for r in run.records if r.number in told
    )
    best = yaml.safe_load((tmp_path / "run" / "best_config.yaml").read_text())["measured"]
    assert best["unit"] == "tokens" and best["best_tokens_per_s"] > 0 and best["best_samples_per_s"] > 0
    # in production, the program's own steps compared in tokens/s too (scripts/bench/bench_program.py)
    last = bench_program(tmp_path / "run", "--pairs", "1", "--steps", "12", "--warmup", "2")
    assert last["unit"] == "tokens"
    for side in ("baseline", "best"):  # 16 tokens a sample
        assert last[f"{side}_tokens_per_s"][0] == pytest.approx(16 * last[f"{side}_samples_per_s"][0])


@pytest.mark.slow
def test_an_environment_variable_is_searched_in_a_fresh_process_of_its_own(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the baseline: left unset
    proc = search(
        tmp_path,
        "python tiny_steps.py",
        {"set_to_none": [True]},
        n_trials=2,
        spec_extra={
            "search_space": {
                "preset": None,
                "knobs": {},
                "workload_args": {"OMP_NUM_THREADS": {"values": [1], "env": True, "safety": "safe"}},
            }
        },
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    seen = set()
    for trial in sorted((tmp_path / "run" / "trials").iterdir()):
        config = json.loads((trial / "config.json").read_text())
        result = TrialResult.read(trial / "result.json")
        assert config["workload"]["command"][1:] == ["tiny_steps.py"]  # an environment knob is no flag
        seen.add(config["workload"]["args"]["OMP_NUM_THREADS"])
        if config["workload"]["args"]["OMP_NUM_THREADS"] == 1:
            assert config["workload"]["env"] == {"OMP_NUM_THREADS": "1"} and result.device.torch_threads == 1
        else:  # unset, as in this environment
            assert config["workload"]["env"] == {"OMP_NUM_THREADS": ""}
            assert result.device.torch_threads == len(os.sched_getaffinity(0))
    assert seen == {"", 1}


@pytest.mark.slow  # in CI: test_scale_out's cfg.wrap in a torchrun-launched loop, test_ranks' 2-rank DDP trial
def test_a_two_rank_torchrun_program_is_searched_with_both_ranks_measured(tmp_path):
    proc = search(
        tmp_path,
        "python ddp_loop.py --steps 2000 --batch_size 16",
        {"num_workers": [0, 1]},
        n_trials=2,
        trial={"min_window_s": 0.2, "max_window_s": 1.0},
        spec_extra={"resources": {"ranks_per_trial": 2}},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = read_run(tmp_path / "run")
    assert len(run.records) == 2 and {r.status for r in run.records} == {"ok"}
    for record in run.records:
        result = TrialResult.read(tmp_path / "run" / "trials" / f"{record.number:04d}" / "result.json")
        assert [(x.rank, x.status) for x in result.ranks] == [(0, "ok"), (1, "ok")]
        rates = [x.metrics["samples_per_s"] for x in result.ranks]
        windows = [x.metrics["window_s"] for x in result.ranks]
        steps = {x.metrics["steps_per_s"] * x.metrics["window_s"] for x in result.ranks}
        assert max(steps) == pytest.approx(min(steps))  # the same window's steps on both ranks
        assert result.metrics["window_s"] == max(windows)  # the slowest rank's window, the ranks' samples summed
        assert result.metrics["samples_per_s"] == pytest.approx(
            sum(r * w for r, w in zip(rates, windows)) / max(windows)
        )
    assert not (tmp_path / "model.pt").exists()  # both ranks ended after their window


def trl_data(where, monkeypatch):
    """TRL's SFT script's tiny Llama and texts made in `where`, datasets' cache there too (not the user's)."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(where / "hf_datasets"))
    made = subprocess.run(
        [sys.executable, str(PROGRAMS / "trl_sft_data.py"), str(where), "--rows", "1000"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-2000:]


@pytest.mark.slow  # in CI: test_instrument's TRL tests (TrlParser reads the knobs, an SFTTrainer is a trial, a
# packed batch counts its texts), and test_instrument's HF trial for the rest of a Trainer script's path
def test_trls_own_sft_script_is_searched_to_the_end_with_no_line_changed(tmp_path, monkeypatch):
    pytest.importorskip("trl", reason="trl is not installed (pip install 'autotune[test]'): TRL's SFT script")
    trl_data(tmp_path, monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # two threads on a shared 2-core host: windows 20x apart
    spec = yaml.safe_load((PROGRAMS / "trl_sft.yaml").read_text())  # its command, as bench_programs runs it
    command = spec["workload"]["command"].replace("--max_length 256", "--max_length 128")
    # packing: TRL's own flag, a knob the probe finds the script can take (no spec says how to pass it)
    knobs = {"batch_size": [4, 16], "packing": [False, True]}
    proc = search(tmp_path, command, knobs, n_trials=3, spec_extra={"safety": {"level": "dynamics"}})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = read_run(tmp_path / "run")
    assert len(run.records) == 3 and {r.status for r in run.records} <= {"ok", "pruned"}
    # the script's own settings, as the probe found them: TRL checkpoints every layer, the model's sdpa
    assert (run.space.baseline["activation_checkpointing"], run.space.baseline["attention"]) == ("full", "sdpa")
    assert run.unit is TOKENS  # searched in tokens/s, through the instrumented Trainer's batches
    for r in (r for r in run.records if r.status == "ok"):
        assert r.throughput == r.metrics["tokens_per_s"] and r.metrics["tokens_per_step"] <= r.knobs["batch_size"] * 128
        per_step = r.metrics["samples_per_s"] / r.metrics["steps_per_s"]
        if r.knobs["packing"]:  # texts packed into 128-token rows: a step trains more texts than rows
            assert per_step > r.knobs["batch_size"]
        else:
            assert per_step == pytest.approx(r.knobs["batch_size"])
    best = yaml.safe_load((tmp_path / "run" / "best_config.yaml").read_text())
    assert best["workload"]["command"][:3] == ["python", "-m", "trl.scripts.sft"] and best["measured"]["speedup_x"] > 0
    assert not (tmp_path / "out").exists()  # every trial ended after its window: no final save


@pytest.mark.slow  # in CI: the no-spec search of tiny_steps (the command form, end to end), the TRL probe's own
# settings (test_instrument), the asked-for LM knob's refusal (test_cli)
@pytest.mark.timeout(1500)  # ~4 min alone; a search measuring on this CPU holds it longer (the device lock)
def test_trls_own_sft_script_is_searched_with_no_spec_in_tokens_with_the_lm_knobs(tmp_path, monkeypatch):
    """Issue 52's one-line form on TRL's SFT script as it ships, from the installed package: `autotune search --
    python -m trl.scripts.sft ARGS`, trl_sft.yaml's arguments and no spec; the space is what the probe finds the
    script takes."""
    pytest.importorskip("trl", reason="trl is not installed (pip install 'autotune[test]'): TRL's SFT script")
    trl_data(tmp_path, monkeypatch)
    command = yaml.safe_load((PROGRAMS / "trl_sft.yaml").read_text())["workload"]["command"]
    command = command.replace("--max_length 256", "--max_length 128")
    cli = Path(sys.executable).parent / "autotune"
    proc = subprocess.run(
        [str(cli), "search", "--budget", "2m", "--n-trials", "3", "-q", "--backend", "local", "-o", "run", "--"]
        + command.split(),
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run = read_run(tmp_path / "run")
    assert run.unit is TOKENS and run.records[0].throughput == run.records[0].metrics["tokens_per_s"]
    # its own settings, as the probe read them: its flags' batch, TRL's checkpointing of every layer, sdpa
    base = run.space.baseline
    assert (base["batch_size"], base["activation_checkpointing"], base["attention"]) == (4, "full", "sdpa")
    search = run.space.search
    assert search["batch_size"] == [1, 2, 4]  # micro-batches, accumulated up to its own 4
    assert search["attention"] == ["eager", "sdpa"] and search["padding_free"] == [False, True]
    assert search["activation_checkpointing"] == ["off", "full", "selective"]
    for knob in ("liger_kernels", "float8"):  # not run here, with the reason
        assert "CUDA only" in run.space.fixed[knob]
    best = yaml.safe_load((tmp_path / "run" / "best_config.yaml").read_text())
    assert best["production"]["command"].startswith("autotune run run/best_config.yaml -- python -m trl.scripts.sft ")
    assert f"run it: {best['production']['command']}" in proc.stdout.splitlines()
    assert not (tmp_path / "out").exists()  # every trial ended after its window: no final save
