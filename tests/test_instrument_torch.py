"""torch itself, instrumented (autotune.instrument._torch): a training loop with no autotune line, run as a trial
(the launcher's environment: AUTOTUNE_TRIAL and the instrumentation's sitecustomize) and in production
(AUTOTUNE_CONFIG), its steps, samples, tokens, loss and data wait measured and its knobs applied."""

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from autotune.trial.result import TrialResult
from tests.test_instrument import child_env, run

PROGRAMS = Path(__file__).resolve().parent / "programs"
WINDOW = {"warmup_steps": 3, "measure_steps": 6, "min_window_s": 0.3, "max_window_s": 2.0, "profile_steps": 0}


def trial(tmp_path, program: str, knobs: dict, args=(), **request):
    """`program` (tests/programs) as a trial's process, copied to and run from `tmp_path`: (its result, the
    steps it wrote down, observed_loop.py's)."""
    (tmp_path / program).write_text((PROGRAMS / program).read_text())
    where = tmp_path / "trial"
    where.mkdir()
    config = {"workload": {"command": ["python", program]}, "knobs": knobs, **WINDOW, **request}
    (where / "config.json").write_text(json.dumps(config))
    proc = run([sys.executable, program, *args], child_env(AUTOTUNE_TRIAL=str(where / "config.json")), tmp_path)
    assert (where / "result.json").exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
    seen = tmp_path / "observed.jsonl"
    steps = [json.loads(line) for line in seen.read_text().splitlines()] if seen.exists() else []
    return TrialResult.read(where / "result.json"), steps, where


def test_a_plain_language_model_loop_is_a_trial_in_tokens_per_s_with_its_own_settings_the_baseline(tmp_path):
    result, _, where = trial(tmp_path, "plain_lm.py", {}, ["--steps", "100000", "--batch_size", "8"])
    assert result.status == "ok", result.error
    m = result.metrics
    assert m["tokens_per_s"] == pytest.approx(m["samples_per_s"] * 64)  # (8, 64) token ids a step: every one
    assert m["samples_per_s"] == pytest.approx(8 * m["steps_per_s"])  # the model's inputs' leading dimension
    assert 0 <= m["data_wait_frac"] < 1 and result.data_wait is None  # timed at its DataLoader's next()
    assert m["loss_last"] == pytest.approx(5.5, abs=0.5)  # ln(256): the scalar backward() ran on, read at the end
    assert m["flops_per_token"] > 0  # the outermost module handed over: its FLOPs counted
    assert result.used == ["torch:autocast", "torch:loader", "torch:model", "torch:optimizer", "torch:zero_grad"]
    own = result.own_knobs
    assert (own["batch_size"], own["num_workers"], own["fused_optimizer"], own["set_to_none"]) == (8, 0, False, True)
    assert "precision=16-mixed" in result.cannot  # fp16 needs a GradScaler the loop does not have
    assert not (tmp_path / "plain_lm.pt").exists()  # ended after its window: its own end never ran
    seen = (where / "seen").read_text()
    assert all(fact in seen for fact in ("torch imported", "an optimizer made", "a DataLoader iterated"))


def test_the_knobs_reach_a_plain_loop_each_the_way_torch_lets_it(tmp_path):
    knobs = {
        "num_workers": 1,
        "batch_size": 4,
        "precision": "bf16-mixed",
        "channels_last": True,
        "fused_optimizer": True,
        "set_to_none": False,
    }
    result, steps, _ = trial(tmp_path, "observed_loop.py", knobs)
    assert result.status == "ok", result.error
    last = steps[-1]
    assert (last["workers"], last["batch"], last["fused"]) == (1, 4, True)
    assert last["autocast"] and last["loss_dtype"] == "torch.float32"  # autocast around forward, its output fp32
    assert last["channels_last_input"] and last["weights_channels_last"]
    assert last["grads_none"] is False  # zero_grad(set_to_none=False)
    assert result.metrics["samples_per_s"] == pytest.approx(4 * result.metrics["steps_per_s"])


@pytest.mark.slow  # in CI: the baseline's own values read back (the plain language model's trial above)
def test_without_knobs_a_program_runs_as_it_wrote_itself(tmp_path):
    result, steps, _ = trial(tmp_path, "observed_loop.py", {})
    assert result.status == "ok", result.error
    last = steps[-1]
    assert (last["workers"], last["batch"], last["fused"], last["autocast"]) == (0, 8, None, False)  # untouched
    assert last["grads_none"] and not last["channels_last_input"] and not last["compiled"]


def test_a_skipped_gradscaler_step_is_a_step_and_a_second_optimizer_is_not(tmp_path):
    """Every 3rd step's gradients hold an inf: the scaler skips the optimizer's step, still the program's step; a
    critic's optimizer steps each iteration too, with fewer parameters: not the program's."""
    args = ["--scaler", "--inf_every", "3", "--critic", "--accumulate", "2"]
    result, steps, where = trial(tmp_path, "observed_loop.py", {}, args, warmup_steps=4, measure_steps=9)
    assert result.status == "ok", result.error
    m = result.metrics
    # one measured step an iteration, none lost: the last one ends the process in its optimizer step (before its
    # line); the window may have taken its first steps as more warm-up (measure.Window: warmup_extended_steps)
    ran = m["warmup_steps_run"] + m.get("warmup_extended_steps", 0) + m["window_steps"]
    assert ran == len(steps) + 1
    assert m["samples_per_s"] == pytest.approx(16 * m["steps_per_s"])  # 2 micro-batches of 8 a step
    assert "precision=16-mixed" not in (result.cannot or {})  # it scales its loss itself: fp16 can run
    assert 0.3 < m["loss_last"] < 1.7  # the unscaled loss (ln 4 at first), summed over the micro-batches


def test_a_program_that_reports_its_own_steps_is_counted_once(tmp_path):
    """tiny_steps.py calls cfg.step itself after its optimizer's step: torch's first step is forgotten (Loop.claim)."""
    result, _, _ = trial(tmp_path, "tiny_steps.py", {}, warmup_steps=2, measure_steps=5)
    assert result.status == "ok", result.error
    m = result.metrics
    assert m["samples_per_s"] == pytest.approx(8 * m["steps_per_s"])  # its own count, 8 a step, not 16
    assert m["warmup_steps_run"] == 2  # the warm-up started again at its first cfg.step


@pytest.mark.slow  # compile is ~20-30 s cold on this CPU; in CI: the compile knob's Lightning path (Module.compile)
def test_compile_compiles_the_outermost_module_in_place_and_its_steps_are_counted_outside_the_graph(tmp_path):
    result, steps, _ = trial(tmp_path, "observed_loop.py", {"compile": "default"}, warmup_steps=3)
    assert result.status == "ok", result.error
    assert steps[-1]["compiled"] and result.metrics["samples_per_s"] == pytest.approx(8 * result.metrics["steps_per_s"])


def test_every_patch_is_undone_and_a_failure_in_production_steps_aside(tmp_path, monkeypatch, capsys):
    import torch
    from torch.utils.data import DataLoader

    from autotune.instrument import _torch

    best = tmp_path / "best_config.yaml"
    best.write_text(yaml.safe_dump({"knobs": {"num_workers": 1}, "device": {"type": "cpu"}}))
    monkeypatch.setenv("AUTOTUNE_CONFIG", str(best))
    before = (DataLoader.__init__, torch.autograd.backward, torch.optim.AdamW.__init__, torch.optim.Optimizer.__init__)
    hooks = _torch.install()
    try:
        assert DataLoader.__init__ is not before[0] and torch.autograd.backward is not before[1]
        assert DataLoader(range(4)).num_workers == 1  # the production config's knob
        hooks.cfg.knobs["num_workers"] = "many"  # a value the instrumentation's own code cannot apply
        monkeypatch.setattr("autotune.knobs.loader_kwargs", lambda knobs: 1 / 0)
        loader = DataLoader(range(4), batch_size=2)  # the user's job goes on, as it wrote itself
        assert loader.num_workers == 0 and loader.batch_size == 2
        assert "autotune: the instrumentation of torch stepped aside (ZeroDivisionError" in capsys.readouterr().err
        after = (
            DataLoader.__init__,
            torch.autograd.backward,
            torch.optim.AdamW.__init__,
            torch.optim.Optimizer.__init__,
        )
        assert after == before  # it uninstalled itself: every class patch undone
    finally:
        _torch.uninstall()
    assert (DataLoader.__init__, torch.autograd.backward) == before[:2]


def test_autotune_run_applies_a_best_config_to_a_plain_loop(tmp_path):
    from tests.test_instrument import best_config

    path = best_config(tmp_path, {"num_workers": (0, 2), "channels_last": (False, True)})
    (tmp_path / "observed_loop.py").write_text((PROGRAMS / "observed_loop.py").read_text())
    env = child_env()
    proc = run(
        [sys.executable, "-m", "autotune.cli", "run", str(path), "--", "python", "observed_loop.py", "--steps", "3"],
        env,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    steps = [json.loads(line) for line in (tmp_path / "observed.jsonl").read_text().splitlines()]
    assert len(steps) == 3 and steps[-1]["workers"] == 2 and steps[-1]["channels_last_input"]
    # its one line, before the program's own (a README walk: "autotune run prints nothing of its own")
    assert proc.stderr.splitlines()[0] == (
        f"autotune run: applies num_workers=2, channels_last=on ({path}): python observed_loop.py --steps 3"
    )


@pytest.mark.slow  # in CI: bench_programs' smoke times memmap_loop's steps in production through the same log
def test_production_step_log_times_a_plain_loops_steps(tmp_path):
    """bench_program's step log (AUTOTUNE_STEP_LOG) under `autotune run`: torch's hooks mark each step."""
    from tests.test_instrument import best_config

    path = best_config(tmp_path, {"num_workers": (0, 0)})
    (tmp_path / "plain_lm.py").write_text((PROGRAMS / "plain_lm.py").read_text())
    log = tmp_path / "steps.json"
    env = {**child_env(), "AUTOTUNE_STEP_LOG": str(log), "AUTOTUNE_STOP_AFTER": "12"}
    proc = run([sys.executable, "-m", "autotune.cli", "run", str(path), "--", "python", "plain_lm.py"], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(log.read_text())
    assert len(got["marks"]) == 12 and got["samples"] == [16] * 12 and got["tokens"] == [16 * 64] * 12
    assert os.path.getsize(log) > 0


@pytest.mark.slow  # in CI: test_watch's production beats (none: no trial dir, so no watch) and this test's path
# without the pause (test_autotune_run_applies_a_best_config_to_a_plain_loop)
@pytest.mark.timeout(600)
def test_autotune_run_applies_no_stall_limit_to_a_long_eval_between_steps(tmp_path):
    """tests/programs/eval_pause.py under `autotune run`: 3 minutes of evaluation between two training steps (far
    past any trial's stall limit) is no hang in production: it runs to its end."""
    from tests.test_instrument import best_config

    path = best_config(tmp_path, {"num_workers": (0, 0)})
    (tmp_path / "eval_pause.py").write_text((PROGRAMS / "eval_pause.py").read_text())
    command = ["python", "eval_pause.py", "--steps", "10", "--eval_every", "5", "--eval_s", "180"]
    proc = run([sys.executable, "-m", "autotune.cli", "run", str(path), "--", *command], child_env(), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "done.txt").read_text() == "10 steps\n"
