"""Applying knobs to a training job, stage by stage (torch imported on call, so
the registry stays importable without it)."""

from __future__ import annotations

import contextlib
from typing import Any

from autotune.knobs._registry import KNOBS, USER_PREFIX


def loader_kwargs(knobs: dict[str, Any]) -> dict[str, Any]:
    """DataLoader keyword arguments for these knobs: every `loader` knob, by its
    DataLoader name; a knob at torch's default (None) is left to torch."""
    out = {k.kwarg: knobs[name] for name, k in KNOBS.items() if k.stage == "loader" and name in knobs}
    return {k: v for k, v in out.items() if v is not None}


def over_loader_kwargs(yours: dict[str, Any], tuned: dict[str, Any]) -> dict[str, Any]:
    """A DataLoader's own arguments `yours` with the `tuned` ones (`loader_kwargs` of the knobs set) over them,
    for `cfg.dataloader_kwargs` and the torch hooks' DataLoader: without workers, the arguments only workers take
    (`prefetch_factor`, `persistent_workers`) are left out unless they are yours (DataLoader refuses them)."""
    out = {**yours, **tuned}
    if not out.get("num_workers"):
        for name in ("prefetch_factor", "persistent_workers"):
            if name not in yours:
                out.pop(name, None)
    return out


def build_loader(dataset, knobs: dict[str, Any], **kwargs):
    """The one DataLoader builder (the trial, the 2x-batch probe, loss parity and
    production code): the loader knobs, then the caller's own arguments (sampler,
    collate_fn, drop_last, shuffle, ...), which win."""
    from torch.utils.data import DataLoader

    return DataLoader(dataset, **{**loader_kwargs(knobs), **kwargs})


def seeded_loader(workload, knobs: dict[str, Any], steps: int, seed: int = 0):
    """The knobs' DataLoader over exactly `steps` full batches of `workload` in a
    seeded random order (every trial, probe and parity run sees the same data)."""
    import torch
    from torch.utils.data import RandomSampler

    sampler = RandomSampler(
        workload.dataset, num_samples=steps * knobs["batch_size"], generator=torch.Generator().manual_seed(seed)
    )
    return build_loader(workload.dataset, knobs, sampler=sampler, drop_last=True, collate_fn=workload.collate_fn)


def apply_process_flags(knobs: dict[str, Any]) -> None:
    """Process-wide settings: intra-op threads (None or absent: torch's default, untouched)."""
    import torch

    if knobs.get("num_threads") is not None:
        torch.set_num_threads(knobs["num_threads"])


def apply_backend_flags(knobs: dict[str, Any]) -> None:
    """Process-wide flags: cuDNN autotuning and fp32 matmul precision (tf32: TF32 matmuls and convolutions;
    another precision: full fp32 matmuls); a knob absent is left as the process has it."""
    import torch

    if "cudnn_benchmark" in knobs:
        torch.backends.cudnn.benchmark = bool(knobs["cudnn_benchmark"])
    if "precision" not in knobs:
        return
    if knobs["precision"] == "tf32":
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_float32_matmul_precision("highest")


def workload_args(knobs: dict[str, Any]) -> dict[str, Any]:
    """The user knobs among `knobs`, as factory keyword arguments."""
    return {k[len(USER_PREFIX) :]: v for k, v in knobs.items() if k.startswith(USER_PREFIX)}


def prepare_model(model, knobs: dict[str, Any], device=None, *, in_place: bool = False):
    """The model on `device` (None: where it is), then in the memory format, then compiled (compile last: it
    traces the model as it will run); a knob absent is left as the model has it. The one place these knobs reach
    a model: `cfg.prepare` and `cfg.wrap` (through `wrap`), the trial's (`wrap`), and, `in_place` (the caller
    keeps its own reference: `Module.compile()` instead of the `torch.compile` wrapper), the Lightning callback
    and the torch hooks (autotune.instrument). A language model's knobs come first (`_lm.prepare_lm`)."""
    import torch

    if device is not None:
        model = model.to(device)
    if knobs.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    mode = knobs.get("compile", "none")
    if mode not in (None, "none"):
        options = {} if mode == "default" else {"mode": mode}
        if in_place:
            model.compile(**options)
        else:
            model = torch.compile(model, **options)
    return model


def autocast_dtype(knobs: dict[str, Any]):
    """The dtype the precision autocasts to (None: no autocast; absent: none)."""
    import torch

    return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(knobs.get("precision"))


def autocast(knobs: dict[str, Any], device_type: str):
    """Context manager for the forward pass and loss."""
    import torch

    dtype = autocast_dtype(knobs)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def grad_scaler(knobs: dict[str, Any], device_type: str):
    """A GradScaler for fp16 (as production needs one), else None."""
    import torch

    if knobs.get("precision") != "16-mixed":
        return None
    return torch.amp.GradScaler(device_type)


def map_tensors(fn, batch):
    """Apply `fn` to every tensor of a batch of (nested) tuples, lists and dicts."""
    import torch

    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: map_tensors(fn, v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(fn, v) for v in batch)
    return batch


def to_device(batch, device, non_blocking: bool):
    return map_tensors(lambda t: t.to(device, non_blocking=non_blocking), batch)


def to_channels_last(batch):
    """Put the 4-D floating-point tensors of a batch in channels_last."""
    import torch

    def convert(t):
        if t.dim() == 4 and t.is_floating_point():
            return t.contiguous(memory_format=torch.channels_last)
        return t

    return map_tensors(convert, batch)


# --- the optimizer -----------------------------------------------------------------


def fuse_optimizer(optimizer):
    """`optimizer` rebuilt with fused=True: the same class, parameter groups
    (hyper-parameters) and state; the fused update runs on the parameters'
    device, so rebuild after the model is there. Already fused: returned as is."""
    import inspect

    if all(group.get("fused") for group in optimizer.param_groups):
        return optimizer
    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    if "fused" not in accepted:
        raise ValueError(f"{cls.__module__}.{cls.__qualname__} has no fused implementation (fused_optimizer=true)")
    flags = {"fused": True, "foreach": None}  # fused and foreach are exclusive
    kwargs = {k: v for k, v in {**optimizer.defaults, **flags}.items() if k in accepted}
    fused = cls([{**group, **flags} for group in optimizer.param_groups], **kwargs)
    if optimizer.state:  # a model trained before: its optimizer state goes along
        state = optimizer.state_dict()
        for group in state["param_groups"]:
            group.update(flags)
        fused.load_state_dict(state)
        lay_out_state_like_params(fused)
    return fused


def lay_out_state_like_params(optimizer) -> None:
    """Each per-parameter state tensor (momentum, Adam's moments) in its
    parameter's memory layout, as a fresh run creates it. A state_dict loaded
    into a channels_last model from a run without it keeps its contiguous
    layout, and torch's fused CPU SGD (2.14) then updates wrongly: measured, a
    1.18 relative update error on a small CNN (the unfused step: 7e-6)."""
    import torch

    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key, t in state.items():
                if isinstance(t, torch.Tensor) and t.shape == p.shape and t.stride() != p.stride():
                    state[key] = torch.empty_like(p, dtype=t.dtype).copy_(t)


def prepare_optimizer(optimizer, knobs: dict[str, Any]):
    """The optimizer as the knobs want it (after `prepare_model`: parameters on
    the device): fused when `fused_optimizer` is on, else as built."""
    return fuse_optimizer(optimizer) if knobs.get("fused_optimizer") else optimizer


def build_optimizer(workload, model, knobs: dict[str, Any]):
    """The workload's optimizer over the prepared model's parameters, with the
    knobs applied (the trial and loss parity; production: `autotune.config.Config.prepare`)."""
    return prepare_optimizer(workload.build_optimizer(model.parameters()), knobs)


def load_optimizer_state(optimizer, state: dict[str, Any]) -> None:
    """Load `state` (another run's optimizer state_dict) keeping this optimizer's
    own implementation (fused or not): a state_dict carries its groups' flags."""
    flags = {k: optimizer.param_groups[0][k] for k in ("fused", "foreach") if k in optimizer.param_groups[0]}
    optimizer.load_state_dict({**state, "param_groups": [{**g, **flags} for g in state["param_groups"]]})
    lay_out_state_like_params(optimizer)


def optimizer_of(workload) -> str | None:
    """The workload's optimizer class as "module:QualName": built over a dummy
    parameter, else (an optimizer that wants its model's own parameters, as a
    LightningModule's configure_optimizers does) over a model built on the CPU;
    None when neither builds (the trial finds out)."""
    import torch

    for params in (lambda: [torch.nn.Parameter(torch.zeros(1))], lambda: workload.model().parameters()):
        try:
            cls = type(workload.build_optimizer(params()))
            return f"{cls.__module__}:{cls.__qualname__}"
        except Exception:  # the user's code may fail in any way here: try the next, or leave it to the trial
            continue
    return None
