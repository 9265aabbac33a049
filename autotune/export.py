"""best_config.yaml, the production contract, and `load_config` to apply it.

    cfg = autotune.load_config("best_config.yaml")
    loader = DataLoader(dataset, **cfg.dataloader_kwargs())
    model, optimizer = cfg.prepare(model, optimizer)
    for batch in loader:
        batch = cfg.to_device(batch)
        with cfg.autocast():
            loss = ...
        ...
        cfg.zero_grad(optimizer)
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from autotune import __version__
from autotune import knobs as K


def safety_flags(knobs: dict[str, Any], baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """Each knob the best config changes from the baseline, with its safety class."""
    flags = []
    for name, value in knobs.items():
        if value != baseline.get(name):
            knob = K.KNOBS[name]
            flags.append({"knob": name, "baseline": baseline.get(name), "tuned": value,
                          "safety": knob.safety, "note": knob.safety_reason})
    return flags


def write_best_config(result, spec, path: Path) -> dict[str, Any]:
    best, base = result.best, result.baseline
    data = {
        "autotune": {"version": __version__, "search": spec.name, "run_dir": str(result.run_dir),
                     "created": datetime.now(timezone.utc).isoformat(timespec="seconds")},
        "workload": {"ref": spec.workload.ref, "args": spec.workload.args},
        "device": {"type": result.device.type, "name": result.device.name, "torch": best.info.get("torch")},
        "knobs": best.knobs,
        "measured": {
            "baseline_samples_per_s": round(base.throughput, 2),
            "best_samples_per_s": round(best.throughput, 2),
            "speedup_x": round(best.throughput / base.throughput, 3),
            "best_trial": best.number, "baseline_trial": base.number,
            "trials": len(result.records), "trials_ok": sum(1 for r in result.records if r.status == "ok"),
        },
        "safety": safety_flags(best.knobs, base.knobs),
        "fixed": result.space.fixed,
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return data


@dataclass
class TunedConfig:
    """A tuned configuration, applied with plain PyTorch."""

    knobs: dict[str, Any]
    device_type: str
    data: dict[str, Any]

    def dataloader_kwargs(self) -> dict[str, Any]:
        return K.loader_kwargs(self.knobs)

    def prepare(self, model, optimizer=None):
        """Backend flags, then the model on the device in its memory format, then
        compile. Parameters stay the same objects, so `optimizer` stays valid."""
        K.apply_backend_flags(self.knobs)
        return K.prepare_model(model, self.knobs, self.device_type), optimizer

    def to_device(self, batch):
        batch = K.to_device(batch, self.device_type, non_blocking=self.knobs["pin_memory"])
        return K.to_channels_last(batch) if self.knobs["channels_last"] else batch

    def autocast(self):
        return K.autocast(self.knobs, self.device_type)

    def grad_scaler(self):
        """A GradScaler for fp16, else None."""
        return K.grad_scaler(self.knobs, self.device_type)

    def zero_grad(self, optimizer) -> None:
        optimizer.zero_grad(set_to_none=self.knobs["set_to_none"])


def load_config(path: str | Path) -> TunedConfig:
    import torch

    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("knobs"), dict):
        raise ValueError(f"{path}: not an autotune best_config.yaml (no `knobs` mapping)")
    knobs = {**K.pytorch_defaults(None), **data["knobs"]}
    device = data.get("device") or {}
    device_type = device.get("type", "cpu")
    if device_type == "cuda" and not torch.cuda.is_available():
        warnings.warn(f"{path} was tuned on CUDA ({device.get('name')}) but no CUDA device is available here; its numbers do not apply")
    made_with = str(device.get("torch") or "")
    if made_with and made_with.split(".")[0] != torch.__version__.split(".")[0]:
        warnings.warn(f"{path} was tuned with torch {made_with}; this is torch {torch.__version__}")
    return TunedConfig(knobs, device_type, data)
