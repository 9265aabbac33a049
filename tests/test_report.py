"""`autotune report` and `autotune export` on a finished search, and the export
formats round-tripping into code that runs."""

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from autotune import load_config
from autotune.cli import app
from autotune.export import TunedConfig, render

runner = CliRunner()
pytestmark = pytest.mark.timeout(300)


def test_report_text(finished_run):
    run_dir, _ = finished_run
    result = runner.invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "baseline vs best (3 trials" in out and "speedup" in out
    assert "per-knob effect (median samples/s over the trials with that value)" in out
    assert "baseline: " in out and "-bound (" in out  # the diagnosis with its evidence
    for name in ("throughput_per_trial", "throughput_by_knob", "parallel_coordinates"):
        assert f"plot: {run_dir / 'plots' / name}.png" in out
        assert (run_dir / "plots" / f"{name}.png").stat().st_size > 10_000


def test_report_json_matches_the_csv(finished_run):
    run_dir, _ = finished_run
    result = runner.invoke(app, ["report", str(run_dir), "--format", "json", "--no-plots"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["trials"] == 3 and data["baseline"]["trial"] == 0 and data["stopped_reason"] is None
    assert data["speedup_x"] == pytest.approx(data["best"]["metrics"]["samples_per_s"] / data["baseline"]["metrics"]["samples_per_s"])
    assert set(data["knob_effects"]) == {"batch_size", "channels_last"}
    assert sum(e["trials"] for e in data["knob_effects"]["batch_size"]) == data["trials_ok"]
    assert data["fixed"]["pin_memory"] == "pinned memory only speeds host-to-GPU copies; no CUDA device"
    assert data["baseline"]["diagnosis"]["bottleneck"] in {"input", "overhead", "memory", "compute"}


def test_report_markdown(finished_run):
    run_dir, _ = finished_run
    out = runner.invoke(app, ["report", str(run_dir), "-f", "markdown", "--no-plots"]).stdout
    assert out.startswith("## autotune: 3 trials on cpu")
    assert "| samples/s |" in out and "**Speedup: " in out


def test_report_and_export_say_what_to_do_without_a_search(tmp_path):
    result = runner.invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr == (f"error: `{tmp_path}` is not a search's output dir (no search.json); "
                             "run `autotune search spec.yaml` first, or pass its output dir\n")
    result = runner.invoke(app, ["export", str(tmp_path)])
    assert result.exit_code == 2 and "has no best_config.yaml" in result.stderr
    result = runner.invoke(app, ["report", str(tmp_path), "-f", "html"])
    assert result.stderr == "error: --format `html` is not one of: text, json, markdown\n"


def test_export_yaml_and_json_round_trip(finished_run, tmp_path):
    run_dir, _ = finished_run
    original = load_config(run_dir / "best_config.yaml")
    out = tmp_path / "best.yaml"
    assert runner.invoke(app, ["export", str(run_dir), "-o", str(out)]).exit_code == 0
    assert load_config(out) == original
    as_json = json.loads(runner.invoke(app, ["export", str(run_dir), "-f", "json"]).stdout)
    assert as_json == yaml.safe_load((run_dir / "best_config.yaml").read_text())


CONFIG = {"knobs": {"num_workers": 1, "pin_memory": False, "batch_size": 8, "precision": "bf16-mixed", "compile": "none",
                    "set_to_none": False, "channels_last": True, "cudnn_benchmark": False},
          "device": {"type": "cpu", "name": "cpu"},
          "measured": {"speedup_x": 1.5, "baseline_samples_per_s": 100.0, "best_samples_per_s": 150.0},
          "safety": [{"knob": "precision", "baseline": "32-true", "tuned": "bf16-mixed", "safety": "numerics", "note": "n"}]}


def test_the_python_snippet_runs_and_applies_the_knobs():
    from tests.workloads import Recorder, WorkerTagged

    code = render({**CONFIG, "knobs": {**CONFIG["knobs"], "num_threads": 1}}, "python")
    assert code.startswith("# autotune: 1.5x over the baseline") and "# numerics: precision" in code
    ns = {}
    threads = torch.get_num_threads()
    try:
        exec(compile(code, "snippet.py", "exec"), ns)
        assert torch.get_num_threads() == 1  # what was measured is what runs
    finally:
        torch.set_num_threads(threads)
    # the user's own DataLoader arguments pass through (and win)
    loader = ns["make_loader"](WorkerTagged(), shuffle=False, drop_last=True, num_workers=0)
    assert (loader.batch_size, loader.num_workers, loader.drop_last) == (8, 0, True)
    model = ns["prepare"](Recorder())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss(model, batch):  # the workload contract: loss(model, batch) on a device batch
        images, labels, _ = batch
        return torch.nn.functional.cross_entropy(model(images), labels)

    loss = ns["train_step"](model, optimizer, next(iter(loader)), loss)
    assert torch.isfinite(loss)
    assert model.seen[0]["autocast_dtype"] == torch.bfloat16 and model.seen[0]["channels_last"]
    assert all(p.grad is not None for p in model.parameters())  # set_to_none=False


def test_the_lightning_form_has_the_trainer_and_loader_arguments():
    ns = {}
    exec(render(CONFIG, "lightning"), ns)
    assert ns["trainer_kwargs"] == {"precision": "bf16-mixed", "benchmark": False}
    assert ns["dataloader_kwargs"] == {"batch_size": 8, "num_workers": 1, "pin_memory": False,
                                       "persistent_workers": False}
    tf32 = render({**CONFIG, "knobs": {**CONFIG["knobs"], "precision": "tf32"}}, "lightning")
    assert "'precision': '32-true'" in tf32 and 'set_float32_matmul_precision("high")' in tf32


def test_load_config_applies_compile_cudnn_and_tf32(tmp_path):
    knobs = {**CONFIG["knobs"], "compile": "default", "cudnn_benchmark": True, "precision": "tf32", "channels_last": False}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "knobs": knobs}))
    cfg = load_config(path)
    assert isinstance(cfg, TunedConfig)
    try:
        model, _ = cfg.prepare(torch.nn.Linear(4, 2))
        assert isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
        assert torch.backends.cudnn.benchmark is True
        assert torch.get_float32_matmul_precision() == "high"
        fp16 = {**CONFIG, "knobs": {**knobs, "precision": "16-mixed"}, "batch": {"grad_accumulation_steps": 4}}
        path.write_text(yaml.safe_dump(fp16))
        cfg16 = load_config(path)
        assert isinstance(cfg16.grad_scaler(), torch.amp.GradScaler) and cfg16.accumulation_steps == 4
    finally:
        torch.backends.cudnn.benchmark = False
        torch.set_float32_matmul_precision("highest")
