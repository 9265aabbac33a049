"""best_config.yaml -> load_config -> a TunedConfig that applies the knobs."""

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
    cfg = load_config(write(tmp_path / "best.yaml", {"num_workers": 2, "batch_size": 64, "channels_last": True,
                                                     "precision": "bf16-mixed", "set_to_none": False}))
    assert cfg.dataloader_kwargs() == {"batch_size": 64, "num_workers": 2, "pin_memory": False,
                                       "persistent_workers": False}
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
    assert cfg.grad_scaler() is None


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
