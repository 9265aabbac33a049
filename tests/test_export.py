"""best_config.yaml -> load_config -> the config (autotune.config.Config) that applies the knobs; the export's
code templates checked against it."""

import pytest
import torch
import yaml

from autotune import load_config
from tests.workloads import Recorder


def write(path, knobs, device=None):
    device = device or {"type": "cpu", "name": "cpu", "torch": str(torch.__version__)}
    path.write_text(yaml.safe_dump({"knobs": knobs, "device": device}))
    return path


def test_load_config_applies_the_knobs(tmp_path):
    cfg = load_config(
        write(
            tmp_path / "best.yaml",
            {
                "num_workers": 2,
                "batch_size": 64,
                "channels_last": True,
                "precision": "bf16-mixed",
                "set_to_none": False,
            },
        )
    )
    assert cfg.dataloader_kwargs() == {
        "batch_size": 64,
        "num_workers": 2,
        "pin_memory": False,
        "persistent_workers": False,
    }
    model = Recorder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = cfg.prepare(model, optimizer)
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last)
    x = cfg.to_device(torch.randn(4, 3, 8, 8))
    with cfg.autocast():
        loss = model(x).float().sum()
    loss.backward()
    optimizer.step()
    cfg.zero_grad(optimizer)
    assert model.seen[0]["autocast_dtype"] == torch.bfloat16 and model.seen[0]["channels_last"]
    assert all(p.grad is not None for p in model.parameters())  # set_to_none: False
    assert not cfg.grad_scaler().is_enabled()  # bf16: no scaling (a disabled GradScaler passes its calls through)


def test_a_config_from_another_device_or_torch_warns(tmp_path):
    with pytest.warns(UserWarning, match="tuned on CUDA"):
        load_config(write(tmp_path / "a.yaml", {}, {"type": "cuda", "name": "H100", "torch": str(torch.__version__)}))
    with pytest.warns(UserWarning, match="was tuned with torch 1.13"):
        load_config(write(tmp_path / "b.yaml", {}, {"type": "cpu", "torch": "1.13.1"}))


def test_not_a_config(tmp_path):
    (tmp_path / "x.yaml").write_text("hello: 1\n")
    with pytest.raises(ValueError, match="not an autotune best_config.yaml"):
        load_config(tmp_path / "x.yaml")


def test_load_config_builds_the_fused_optimizer(tmp_path):
    cfg = load_config(write(tmp_path / "best.yaml", {"fused_optimizer": True}))
    model = Recorder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    model, fused = cfg.prepare(model, optimizer)
    assert type(fused) is torch.optim.AdamW and fused is not optimizer
    assert all(g["fused"] and g["weight_decay"] == 0.05 for g in fused.param_groups)
    before = model.conv.weight.detach().clone()
    model(cfg.to_device(torch.randn(4, 3, 8, 8))).sum().backward()
    fused.step()
    assert not torch.equal(model.conv.weight, before)
    assert fused.state[model.conv.weight]["step"].dtype == torch.float32  # the fused kernel's own step counter
    off = load_config(write(tmp_path / "off.yaml", {}))
    assert off.prepare(model, optimizer)[1] is optimizer  # not tuned: your optimizer as it is


# -- -f python and -f lightning apply what the config applies -------------------------------------------------------


TEMPLATE_KNOBS = {
    "num_workers": 2,
    "batch_size": 16,
    "channels_last": True,
    "precision": "bf16-mixed",
    "set_to_none": False,
    "cudnn_benchmark": True,
    "fused_optimizer": True,
}


def _flags():
    return torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision(), torch.get_num_threads()


@pytest.mark.parametrize("compile_mode", ["none", "default"])
def test_the_python_template_applies_what_load_config_prepare_applies(tmp_path, compile_mode):
    """`autotune export -f python` run on a real tiny model beside `load_config(...).prepare`: the same loader
    arguments, process flags, model (device, layout, compiled or not), fused optimizer, batch, precision, scaler
    and zero_grad."""
    from autotune.export.best_config import render

    knobs = {**TEMPLATE_KNOBS, "compile": compile_mode, "num_threads": torch.get_num_threads()}
    data = {"knobs": knobs, "device": {"type": "cpu", "name": "cpu", "torch": str(torch.__version__)}}
    before = _flags()
    try:
        ns = {}
        exec(render(data, "python"), ns)
        template_flags = _flags()
        torch.backends.cudnn.benchmark, _, _ = before
        torch.set_float32_matmul_precision(before[1])
        cfg = load_config(write(tmp_path / "best.yaml", knobs, data["device"]))
        torch.manual_seed(0)
        theirs = Recorder()
        mine = Recorder()
        mine.load_state_dict(theirs.state_dict())
        theirs = ns["prepare"](theirs)
        their_opt = ns["prepare_optimizer"](torch.optim.AdamW(theirs.parameters(), lr=1e-2))
        mine, my_opt = cfg.prepare(mine, torch.optim.AdamW(mine.parameters(), lr=1e-2))
        assert _flags() == template_flags  # cuDNN, matmul precision, threads
    finally:
        torch.backends.cudnn.benchmark = before[0]
        torch.set_float32_matmul_precision(before[1])
    assert ns["LOADER_KWARGS"] == cfg.dataloader_kwargs()
    assert type(theirs) is type(mine)  # compiled (torch.compile's wrapper) or not, alike
    assert [p.device for p in theirs.parameters()] == [p.device for p in mine.parameters()]
    layout = [p.is_contiguous(memory_format=torch.channels_last) for p in theirs.parameters() if p.dim() == 4]
    assert layout == [p.is_contiguous(memory_format=torch.channels_last) for p in mine.parameters() if p.dim() == 4]
    assert layout == [True]
    assert type(their_opt) is type(my_opt) and [g["fused"] for g in their_opt.param_groups] == [
        g["fused"] for g in my_opt.param_groups
    ]
    assert (ns["SCALER"] is not None) == cfg.grad_scaler().is_enabled()
    x = torch.randn(4, 3, 8, 8)
    assert ns["to_device"](x).stride() == cfg.to_device(x).stride()
    if compile_mode != "none":  # compiled alike: inductor's build is not run here (test_knobs' slow test runs it)
        return
    ns["train_step"](theirs, their_opt, x, lambda model, batch: model(batch).float().sum())
    with cfg.autocast():
        loss = mine(cfg.to_device(x)).float().sum()
    loss.backward()
    my_opt.step()
    cfg.zero_grad(my_opt)
    assert theirs.seen == mine.seen  # the batch's layout and the autocast's dtype
    assert [p.grad is None for p in theirs.parameters()] == [p.grad is None for p in mine.parameters()]
    for a, b in zip(theirs.parameters(), mine.parameters()):
        torch.testing.assert_close(a, b)


def test_the_lightning_template_is_what_the_instrumented_trainer_takes(tmp_path):
    """`autotune export -f lightning`'s trainer and loader arguments are those the config gives a Lightning script
    run under `autotune run` (autotune.instrument._lightning_callback.trainer_kwargs, cfg.dataloader_kwargs)."""
    import autotune
    from autotune.export.best_config import render
    from autotune.instrument._lightning_callback import trainer_kwargs

    data = {
        "knobs": {**TEMPLATE_KNOBS, "cudnn_benchmark": False, "compile": "none"},
        "device": {"type": "cpu", "name": "cpu"},
        "measured": {"speedup_x": 1.5, "baseline_samples_per_s": 100.0, "best_samples_per_s": 150.0},
        "safety": [flag("batch_size", 8, 16), flag("num_workers", 0, 2), flag("precision", "32-true", "bf16-mixed")],
    }
    path = tmp_path / "best_config.yaml"
    path.write_text(yaml.safe_dump(data))
    ns = {}
    exec(render(data, "lightning"), ns)
    cfg = autotune.config(path)
    given = trainer_kwargs({}, cfg, None)
    assert {k: given[k] for k in ns["trainer_kwargs"]} == ns["trainer_kwargs"] == {"precision": "bf16-mixed"}
    assert cfg.dataloader_kwargs() == ns["dataloader_kwargs"] == {"batch_size": 16, "num_workers": 2}


# -- -f hf and -f lightning: what changed from the baseline, merged over the user's own arguments --------------------


def flag(knob, baseline, tuned, safety="safe"):
    return {"knob": knob, "baseline": baseline, "tuned": tuned, "safety": safety, "note": "n"}


TUNED = {
    "knobs": {
        "batch_size": 32,
        "num_workers": 2,
        "precision": "bf16-mixed",
        "set_to_none": False,
        "channels_last": True,
        "num_threads": 1,
        "fused_optimizer": True,
    },
    "device": {"type": "cpu", "name": "cpu"},
    "measured": {"speedup_x": 1.5, "baseline_samples_per_s": 100.0, "best_samples_per_s": 150.0},
    # the baseline: an HF Trainer's (fused AdamW, 2 workers), at batch 8 in fp32, with channels_last already
    "safety": [
        flag("batch_size", 8, 32, "dynamics"),
        flag("precision", "32-true", "bf16-mixed", "numerics"),
        flag("set_to_none", True, False),
        flag("num_threads", None, 1),
    ],
}


HEADER = (
    "# autotune: 1.5x over the baseline (100.0 -> 150.0 samples/s), measured on cpu\n"
    "# dynamics: batch_size 8 -> 32: n\n"
    "# numerics: precision 32-true -> bf16-mixed: n\n"
)


def export(tmp_path, data, fmt):
    """`autotune export RUN -f FMT`, as a user runs it."""
    from typer.testing import CliRunner

    from autotune.cli.main import app

    (tmp_path / "best_config.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    result = CliRunner().invoke(app, ["export", str(tmp_path), "-f", fmt])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_hf_export_is_what_changed_and_merges_over_the_users_arguments(tmp_path):
    from transformers import TrainingArguments

    text = export(tmp_path, TUNED, "hf")
    assert text == HEADER + (
        "# The TrainingArguments that differ from the baseline; merge them over your own (tuned values win):\n"
        "#   args = TrainingArguments(**{**your_kwargs, **TUNED})\n"
        "TUNED = {'per_device_train_batch_size': 32, 'bf16': True, 'fp16': False}\n"
        "# Not TrainingArguments fields; apply them in your script:\n"
        "# set_to_none=False: the Trainer zeroes gradients with model.zero_grad(); before Trainer(model=model): "
        "model.zero_grad = functools.partial(torch.nn.Module.zero_grad, model, set_to_none=False)\n"
        "# num_threads=1: torch.set_num_threads(1) at the top of your script (intra-op threads, as measured)\n"
    )
    ns = {}
    exec(text, ns)
    mine = {
        "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 8,
        "dataloader_num_workers": 2,
        "fp16": False,
        "use_cpu": True,
        "report_to": [],
    }
    args = TrainingArguments(**{**mine, **ns["TUNED"]})  # no "got multiple values for keyword argument"
    assert (args.per_device_train_batch_size, args.bf16, args.fp16, args.dataloader_num_workers) == (32, True, False, 2)
    same = {**TUNED, "safety": []}  # the baseline measured best: nothing to change
    assert "TUNED = {}  # the baseline's arguments measured best\n" in export(tmp_path, same, "hf")


def test_lightning_export_is_what_changed_and_merges_over_the_users_arguments(tmp_path):
    import lightning.pytorch as pl

    text = export(tmp_path, TUNED, "lightning")
    assert text == HEADER + (
        "import torch\n"
        "\n"
        "torch.set_num_threads(1)  # intra-op threads, as measured\n"
        "# what differs from the baseline; merge over your own arguments (tuned values win):\n"
        "trainer_kwargs = {'precision': 'bf16-mixed'}\n"
        "dataloader_kwargs = {'batch_size': 32}\n"
        "# trainer = lightning.Trainer(**{**your_trainer_kwargs, **trainer_kwargs})\n"
        "# loader = DataLoader(dataset, **{**your_loader_kwargs, **dataloader_kwargs})\n"
        "# set_to_none=False: Lightning calls optimizer.zero_grad() (set_to_none=True); override "
        "LightningModule.optimizer_zero_grad to call optimizer.zero_grad(set_to_none=False)\n"
    )
    ns = {}
    threads = torch.get_num_threads()
    try:
        exec(text, ns)
    finally:
        torch.set_num_threads(threads)
    mine = {"precision": "32-true", "gradient_clip_val": 1.0, "accelerator": "cpu", "logger": False}
    trainer = pl.Trainer(**{**mine, **ns["trainer_kwargs"]})  # no clash on precision
    assert trainer.precision == "bf16-mixed" and trainer.gradient_clip_val == 1.0
    loader = torch.utils.data.DataLoader(
        list(range(64)), **{**{"batch_size": 8, "num_workers": 0}, **ns["dataloader_kwargs"]}
    )
    assert loader.batch_size == 32


def test_a_language_models_knobs_export_as_training_arguments_or_as_what_to_apply(tmp_path):
    from transformers import TrainingArguments

    data = {
        "knobs": {"attention": "eager", "activation_checkpointing": "selective", "padding_free": True},
        "device": {"type": "cpu", "name": "cpu"},
        "measured": {"speedup_x": 1.2, "baseline_tokens_per_s": 100.0, "best_tokens_per_s": 120.0, "unit": "tokens"},
        "safety": [
            flag("attention", "sdpa", "eager", "numerics"),
            flag("activation_checkpointing", "full", "selective"),
            flag("padding_free", False, True, "numerics"),
        ],
    }
    text = export(tmp_path, data, "hf")
    ns = {}
    exec(text, ns)
    # checkpointing is a field (every second layer); the attention kernel and padding-free rows are not
    assert ns["TUNED"] == {"activation_checkpointing_kwargs": {"every_n_layers": 2}}
    assert "# attention='eager': model.set_attn_implementation('eager')" in text
    assert "# padding_free=True: each padded batch as one row with position ids" in text
    args = TrainingArguments(output_dir=str(tmp_path / "out"), activation_checkpointing=True, **ns["TUNED"])
    assert args.activation_checkpointing_kwargs == {"every_n_layers": 2}
    lightning = export(tmp_path, data, "lightning")
    assert "# activation_checkpointing='selective': `model, _ = cfg.prepare(model)`" in lightning
    python = export(tmp_path, data, "python")
    lines = python.splitlines()
    at = lines.index("# a language model's knobs: apply them to your model first")
    assert lines[at : at + 2] == [
        "# a language model's knobs: apply them to your model first",
        "# attention='eager': model.set_attn_implementation('eager') (or from_pretrained(..., attn_implementation="
        "'eager'))",
    ]


def test_an_export_whose_best_is_the_baseline_says_so_and_nothing_of_a_layout_it_keeps(tmp_path):
    """A README walk: a search whose baseline held (a tie of the windows) exported "1.0x over the baseline" and a
    `to_device` promising channels_last inputs with channels_last off."""
    kept = {k: v for k, v in TUNED["knobs"].items() if k != "channels_last"}
    data = {
        **TUNED,
        "knobs": {**kept, "channels_last": False},
        "measured": {"speedup_x": 1.0, "baseline_samples_per_s": 100.0, "best_samples_per_s": 100.0},
        "safety": [],
    }
    data["measured"].update(best_trial=0, baseline_trial=0)
    text = export(tmp_path, data, "python")
    assert text.startswith(
        "# autotune: the baseline's own settings (100.0 samples/s): nothing faster held up, measured on cpu\n"
    )
    assert "channels_last" not in text.split("def to_device", 1)[1].split('"""', 2)[1]
