"""best_config.yaml loaded for production: `load_config` and the `TunedConfig` it returns, applied with plain
PyTorch. Needs torch and the knobs alone (no Ray, MLflow, Optuna or pydantic), and nothing of the search."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from autotune import knobs as K
from autotune.export import formats as scale_out


@dataclass
class TunedConfig:
    """A tuned configuration, applied with plain PyTorch."""

    knobs: dict[str, Any]
    device_type: str
    data: dict[str, Any]

    def dataloader_kwargs(self) -> dict[str, Any]:
        return K.loader_kwargs(self.knobs)

    @property
    def workload_args(self) -> dict[str, Any]:
        """Your workload factory's searched arguments, as tuned ({} when none were searched)."""
        return dict(self.data.get("workload_args") or {})

    @property
    def trial_workload_args(self) -> dict[str, Any]:
        """Every argument the search's best trial gave your factory: the spec's
        `workload.args`, the searched ones over them (to reproduce its numbers)."""
        return {**((self.data.get("workload") or {}).get("args") or {}), **self.workload_args}

    @property
    def num_threads(self) -> int | None:
        """Intra-op threads measured (None: torch's default); `prepare` applies it."""
        return self.knobs.get("num_threads")

    def prepare(self, model, optimizer=None):
        """Threads and backend flags, then the model on the device in its memory
        format, then compile. Parameters stay the same objects, so `optimizer`
        stays valid; with `fused_optimizer` it comes back rebuilt with fused=True
        (same class, groups and state): use the one returned."""
        K.apply_process_flags(self.knobs)
        K.apply_backend_flags(self.knobs)
        model = K.prepare_model(model, self.knobs, self.device_type)
        return model, None if optimizer is None else K.prepare_optimizer(optimizer, self.knobs)

    def wrap(self, model):
        """The model as the trials ran it, in torchtitan's order: activation
        checkpointing per repeated block, then device, memory format and compile
        (`prepare`'s), then, in a process group of two or more ranks (torchrun),
        DDP with the tuned bucket size, gradient views and static graph, or FSDP2
        `fully_shard` per block. Call it instead of `prepare`'s model part, after
        `dist.init_process_group()`, and build the optimizer after it (FSDP
        replaces the parameters by shards)."""
        import torch
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        device = (
            torch.device(self.device_type, int(os.environ.get("LOCAL_RANK", 0)))
            if self.device_type == "cuda"
            else torch.device("cpu")
        )
        K.apply_process_flags(self.knobs)
        K.apply_backend_flags(self.knobs)
        return K.wrap(model, self.knobs, device, world, scale_out.parallel(self.data)["blocks"])

    def to_device(self, batch, preprocess=None):
        """A loader batch on the device (non_blocking when pinned), then your
        on-device `preprocess` if any, then 4-D inputs in channels_last."""
        batch = K.to_device(batch, self.device_type, non_blocking=self.knobs["pin_memory"])
        if preprocess is not None:
            batch = preprocess(batch)
        return K.to_channels_last(batch) if self.knobs["channels_last"] else batch

    def autocast(self):
        return K.autocast(self.knobs, self.device_type)

    def grad_scaler(self):
        """A GradScaler for fp16, else None."""
        return K.grad_scaler(self.knobs, self.device_type)

    def zero_grad(self, optimizer) -> None:
        optimizer.zero_grad(set_to_none=self.knobs["set_to_none"])

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step that keep the baseline's effective batch
        (1: step every batch)."""
        return int((self.data.get("batch") or {}).get("grad_accumulation_steps") or 1)


def read(path: str | Path) -> dict[str, Any]:
    """A best_config.yaml's content: the one reader of the file (`load_config`, `autotune.config(path)`, the CLI's
    `export` and `run`). ValueError when it is not one (no `knobs` mapping)."""
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict) or not isinstance(data.get("knobs"), dict):
        raise ValueError(f"`{path}` is not an autotune best_config.yaml (no `knobs` mapping)")
    return data


def load_config(path: str | Path) -> TunedConfig:
    import torch

    data = read(path)
    knobs = {**K.pytorch_defaults(None), **K.canonical(data["knobs"])}
    device = data.get("device") or {}
    device_type = device.get("type", "cpu")
    if device_type == "cuda" and not torch.cuda.is_available():
        warnings.warn(
            f"{path} was tuned on CUDA ({device.get('name')}) but no CUDA device is available here; its numbers do not apply"
        )
    made_with = str(device.get("torch") or "")
    if made_with and made_with.split(".")[0] != torch.__version__.split(".")[0]:
        warnings.warn(f"{path} was tuned with torch {made_with}; this is torch {torch.__version__}")
    return TunedConfig(knobs, device_type, data)
