"""autotune.config(): the three modes, the methods, and the measured loop of a
real program in a trial (tests/programs/loader_loop.py run as its own process)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import autotune
from autotune.config import unused
from autotune.trial.result import TrialResult

PROGRAMS = Path(__file__).parent / "programs"
ROOT = Path(__file__).parent.parent


def test_plain_mode_returns_the_programs_own_values(monkeypatch):
    monkeypatch.delenv("AUTOTUNE_TRIAL", raising=False)
    monkeypatch.delenv("AUTOTUNE_CONFIG", raising=False)
    cfg = autotune.config()
    assert not cfg.in_trial and cfg.knobs == {}
    assert cfg.dataloader_kwargs(batch_size=8, num_workers=3) == {"batch_size": 8, "num_workers": 3}
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert cfg.prepare(model, opt) == (model, opt)
    assert list(cfg.steps([1, 2, 3])) == [1, 2, 3]
    cfg.step(samples=4, loss=1.0)
    assert sorted(cfg.used) == ["dataloader_kwargs", "prepare", "step", "steps"]


def test_production_sets_only_the_knobs_the_search_changed(tmp_path):
    path = tmp_path / "best_config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "knobs": {"num_workers": 2, "batch_size": 64, "pin_memory": False, "precision": "32-true"},
                "device": {"type": "cpu"},
                "safety": [{"knob": "num_workers", "baseline": 0, "tuned": 2}],
            }
        )
    )
    cfg = autotune.config(path)
    assert cfg.knobs == {"num_workers": 2}  # batch 64 was the baseline's: the program's own batch stays
    assert cfg.dataloader_kwargs(batch_size=16, num_workers=0) == {"batch_size": 16, "num_workers": 2}
    with cfg.data():
        pass
    assert list(cfg.steps(range(3))) == [0, 1, 2]


def test_config_and_load_config_are_one_class_that_differ_in_the_knobs_they_set(tmp_path):
    """`autotune.config(path)` sets the knobs the search changed, `load_config(path)` every knob of the file; the
    methods are the same ones, with one behaviour."""
    from autotune.config import Config

    path = tmp_path / "best_config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "knobs": {"num_workers": 2, "batch_size": 64, "precision": "bf16-mixed", "channels_last": True},
                "device": {"type": "cpu"},
                "batch": {"grad_accumulation_steps": 2},
                "safety": [{"knob": "num_workers", "baseline": 0, "tuned": 2}, {"knob": "channels_last"}],
            }
        )
    )
    mine, loaded = autotune.config(path), autotune.load_config(path)
    assert type(mine) is type(loaded) is Config and not mine.in_trial and not loaded.in_trial
    assert mine.knobs == {"num_workers": 2, "channels_last": True} and loaded.knobs["batch_size"] == 64
    assert mine.dataloader_kwargs(batch_size=16) == {"batch_size": 16, "num_workers": 2}
    assert loaded.dataloader_kwargs() == {
        "batch_size": 64,
        "num_workers": 2,
        "pin_memory": False,
        "persistent_workers": False,
    }
    for cfg in (mine, loaded):  # bf16 set, or no precision: a disabled scaler, whose calls pass through
        scaler, loss = cfg.grad_scaler(), torch.tensor(2.0)
        assert not scaler.is_enabled() and scaler.scale(loss) is loss
        model, optimizer = cfg.prepare(torch.nn.Conv2d(3, 4, 1))
        assert model.weight.is_contiguous(memory_format=torch.channels_last) and optimizer is None
        double = cfg.to_device(torch.ones(2, 3, 4, 4), lambda b: b * 2)  # your preprocess, then the layout
        assert double.sum() == 2 * 96 and double.is_contiguous(memory_format=torch.channels_last)
        assert cfg.grad_accumulation_steps == 2
    with pytest.warns(DeprecationWarning, match="grad_accumulation_steps"):
        assert loaded.accumulation_steps == 2
    fp16 = autotune.load_config(path)
    fp16.knobs["precision"] = "16-mixed"
    assert fp16.grad_scaler().is_enabled()


def test_a_knob_whose_method_is_never_called_is_not_used():
    assert unused("num_workers", ["steps", "prepare"]).startswith("not used by your program")
    assert unused("num_workers", ["dataloader_kwargs"]) is None
    assert unused("num_threads", []) is None  # applied by config() itself
    assert unused("args.batch_size", []) is None  # a flag of the program


def run_trial(tmp_path, request, args=(), program="loader_loop.py"):
    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / "config.json").write_text(json.dumps(request))
    from autotune import instrument

    # as the launcher starts it: the instrumentation's sitecustomize first on its path (a program with no line)
    env = instrument.with_env({**os.environ, "AUTOTUNE_TRIAL": str(trial / "config.json"), "PYTHONPATH": str(ROOT)})
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / program), *args],
        cwd=trial,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, trial


def test_a_programs_window_starts_once_its_loaders_queue_has_turned_over(tmp_path):
    """The program's DataLoader makes 2 workers x 3 batches ahead: its warm-up takes them before the window."""
    request = {
        "workload": {"command": ["python", "loader_loop.py"]},
        "knobs": {"num_workers": 2, "prefetch_factor": 3},
        "warmup_steps": 2,
        "warmup_min_s": 0.0,
        "measure_steps": 5,
        "min_window_s": 0.2,
        "max_window_s": 1.0,
    }
    proc, trial = run_trial(tmp_path, request, ["--steps", "3000", "--batch_size", "4"])
    assert proc.returncode == 0, proc.stderr
    assert TrialResult.read(trial / "result.json").metrics["warmup_steps_run"] == 6


@pytest.mark.slow  # CI tier: test_program's DataLoader program search times and ends every trial after its window
def test_a_program_in_a_trial_is_timed_and_ended_after_its_window(tmp_path):
    request = {
        "workload": {"command": ["python", "loader_loop.py"]},
        "knobs": {"num_workers": 1},
        "warmup_steps": 2,
        "measure_steps": 5,
        "min_window_s": 0.2,
        "max_window_s": 3.0,
    }
    proc, trial = run_trial(
        tmp_path, request, ["--steps", "3000", "--batch_size", "8"]
    )  # the window (3 s at most) ends first
    assert proc.returncode == 0, proc.stderr
    result = TrialResult.read(trial / "result.json")
    assert result.status == "ok" and result.knobs == {"num_workers": 1}
    m = result.metrics
    assert m["window_steps"] >= 5 and m["warmup_steps_run"] == 2
    assert m["samples_per_s"] == pytest.approx(8 * m["steps_per_s"])  # samples counted from the batches
    assert 0 <= m["data_wait_frac"] < 1  # measured at the DataLoader iterator's next()
    # no line of autotune: torch's hooks reach its loader, model, optimizer and zero_grad (autotune.instrument._torch)
    assert result.used == ["torch:autocast", "torch:loader", "torch:model", "torch:optimizer", "torch:zero_grad"]
    assert not (trial / "model.pt").exists()  # the process ended after the window: no final save
    assert (trial / "first_step").exists()


def test_a_program_that_ends_after_its_windows_floors_is_measured_on_the_steps_it_ran(tmp_path):
    """A window still short of its statistical target when the program's loop ends, but past its floors
    (measure_steps, min_window_s), is closed there: the steps it timed are a measurement, marked as such."""
    request = {
        "workload": {"command": ["python", "loader_loop.py"]},
        "warmup_steps": 2,
        "measure_steps": 4,
        "min_window_s": 0.0,
        "max_window_s": 600.0,
        "target_ci": 1e-9,
    }
    proc, trial = run_trial(tmp_path, request, ["--steps", "20", "--batch_size", "4"])
    result = TrialResult.read(trial / "result.json")
    assert result.status == "ok", result.error
    assert result.metrics["window_ended_by_program"] == 1.0 and result.metrics["window_steps"] >= 4


def test_a_program_that_ends_before_its_window_is_an_error_naming_why(tmp_path):
    request = {"workload": {"command": ["python", "loader_loop.py"]}, "warmup_steps": 5, "measure_steps": 50}
    proc, trial = run_trial(tmp_path, request, ["--steps", "8", "--batch_size", "4"])
    result = TrialResult.read(trial / "result.json")
    assert result.status == "error" and result.error_type == "TooFewSteps"
    assert "ended after 8 steps" in result.error
