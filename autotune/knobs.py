"""The eight performance knobs: domain, where each applies, safety class, and how
each is applied to a training job.

This module is imported by the CLI and the spec, so it must not import torch at
load time; the `apply_*` functions import it when called (inside a trial, or in
production code through `autotune.export.TunedConfig`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

PRECISIONS = ("32-true", "tf32", "bf16-mixed", "16-mixed")
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune")


@dataclass(frozen=True)
class Device:
    """What a trial runs on; decides which knob values apply."""

    type: str  # "cpu" or "cuda"
    cpus: int
    name: str = "cpu"
    capability: tuple[int, int] | None = None  # CUDA compute capability


@dataclass(frozen=True)
class Knob:
    name: str
    type: type
    pytorch_default: Any
    safety: str  # safe | numerics | dynamics | reproducibility
    safety_reason: str
    help: str
    choices: tuple | None = None
    # returns why `value` cannot apply on `device`, or None when it can
    unavailable: Callable[[Any, Device], str | None] = lambda value, device: None


def _no_cuda(what: str) -> Callable[[Any, Device], str | None]:
    def check(value, device):
        if value and device.type != "cuda":
            return f"{what}; no CUDA device"
        return None

    return check


def _workers(value, device):
    if value > device.cpus:
        return f"only {device.cpus} CPUs per trial host"
    return None


def _precision(value, device):
    cc = device.capability or (0, 0)
    if device.type != "cuda":
        if value == "tf32":
            return "TF32 is a tensor-core mode of CUDA GPUs; no CUDA device"
        if value == "16-mixed":
            return "fp16 mixed precision with GradScaler needs a CUDA device"
        return None
    if value in ("tf32", "bf16-mixed") and cc < (8, 0):
        return f"{value} needs compute capability >= 8.0 (this GPU: {cc[0]}.{cc[1]})"
    return None


def _compile(value, device):
    if value == "reduce-overhead" and device.type != "cuda":
        return "reduce-overhead captures CUDA graphs; no CUDA device"
    return None


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob("num_workers", int, 0, "safe", "no effect on numerics; each worker costs RAM and shared memory",
             "DataLoader worker processes", unavailable=_workers),
        Knob("pin_memory", bool, False, "safe", "no effect on numerics",
             "page-locked host batches + non_blocking host-to-device copies",
             unavailable=_no_cuda("pinned memory only speeds host-to-GPU copies")),
        Knob("batch_size", int, None, "dynamics",
             "changes optimization; scale the learning rate or accumulate gradients to keep the effective batch",
             "samples per optimizer step"),
        Knob("precision", str, "32-true", "numerics", "changes rounding; check loss parity (fp16 can overflow)",
             "autocast dtype / matmul precision", choices=PRECISIONS, unavailable=_precision),
        Knob("compile", str, "none", "numerics", "fused kernels round differently; check loss parity",
             "torch.compile mode", choices=COMPILE_MODES, unavailable=_compile),
        Knob("set_to_none", bool, True, "safe", "safe unless your code reads .grad after zero_grad",
             "optimizer.zero_grad(set_to_none=...)"),
        Knob("channels_last", bool, False, "safe", "different memory layout, rounding-level differences only",
             "model and 4-D inputs in torch.channels_last"),
        Knob("cudnn_benchmark", bool, False, "reproducibility",
             "cuDNN picks algorithms by timing, so runs are not bitwise reproducible",
             "torch.backends.cudnn.benchmark",
             unavailable=_no_cuda("cuDNN runs only on CUDA devices")),
    )
}


def to_cell(value) -> str:
    """A knob value as a CSV cell (landscapes): strings as they are, the rest as JSON (true, 32)."""
    import json

    return value if isinstance(value, str) else json.dumps(value)


def from_cell(name: str, raw: str):
    """A knob value from a CSV cell: a landscape's (true, 32) or a trials.csv's (True)."""
    knob = KNOBS[name]
    if knob.type is str:
        return raw
    if knob.type is bool:
        return raw.lower() == "true"
    return int(raw)


def pytorch_defaults(batch_size: int) -> dict[str, Any]:
    """The knobs as plain PyTorch leaves them, at the user's batch size."""
    return {name: (batch_size if name == "batch_size" else k.pytorch_default) for name, k in KNOBS.items()}


@dataclass
class Space:
    """The search space on one device: what is sampled, what is fixed and why."""

    baseline: dict[str, Any]
    search: dict[str, list]  # knobs with two or more applicable values
    fixed: dict[str, str]  # knob -> why it is not sampled (it stays at the baseline value)
    dropped: list[str]  # "knob=value: why" for values that cannot apply here


def resolve_space(lists: dict[str, list], baseline: dict[str, Any], device: Device,
                  allowed_classes: set[str] | None = None, keep_effective_batch: bool = False) -> Space:
    """Keep the values that apply on `device`; the baseline's value is always in
    the space, so the baseline is a point of the search and ratios compare like
    with like. A baseline value that cannot apply falls back to PyTorch's.
    `allowed_classes`: the safety classes the search may change (safety.level);
    `keep_effective_batch`: batch sizes must divide the baseline's (the rest is
    made up by gradient accumulation), which keeps the optimization unchanged."""
    base, search, fixed, dropped = {}, {}, {}, []
    for name, knob in KNOBS.items():
        value = baseline[name]
        why = knob.unavailable(value, device)
        if why:
            dropped.append(f"baseline {name}={value!r}: {why}; using {knob.pytorch_default!r}")
            value = knob.pytorch_default
        base[name] = value
        if name not in lists:
            fixed[name] = "not in the search space"
            continue
        # with accumulation the optimization batch is kept, but BatchNorm and rounding
        # see the micro-batch: a numerics-level change rather than a dynamics one
        safety = "numerics" if name == "batch_size" and keep_effective_batch else knob.safety
        if allowed_classes is not None and safety not in allowed_classes:
            fixed[name] = f"a {knob.safety} knob; safety.level allows only {', '.join(sorted(allowed_classes))} knobs"
            continue
        values = []
        for v in lists[name]:
            why = knob.unavailable(v, device)
            if not why and name == "batch_size" and keep_effective_batch and (v > value or value % v):
                why = f"keep_effective_batch: a micro-batch must divide the baseline batch {value}"
            if why:
                dropped.append(f"{name}={v!r}: {why}")
            elif v not in values:
                values.append(v)
        if value not in values:
            values.insert(0, value)
        if len(values) > 1:
            search[name] = values
        else:
            reasons = [d.split(": ", 1)[1] for d in dropped if d.startswith(f"{name}=")]
            fixed[name] = reasons[0] if reasons else "one value in the search space"
    return Space(base, search, fixed, dropped)


# --- applying knobs (torch imported on call) ------------------------------------


def loader_kwargs(knobs: dict[str, Any]) -> dict[str, Any]:
    """DataLoader keyword arguments for these knobs."""
    return {
        "batch_size": knobs["batch_size"],
        "num_workers": knobs["num_workers"],
        "pin_memory": knobs["pin_memory"],
    }


def apply_backend_flags(knobs: dict[str, Any]) -> None:
    """Process-wide flags: cuDNN autotuning and fp32 matmul precision."""
    import torch

    torch.backends.cudnn.benchmark = bool(knobs["cudnn_benchmark"])
    if knobs["precision"] == "tf32":
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    else:
        torch.set_float32_matmul_precision("highest")


def prepare_model(model, knobs: dict[str, Any], device):
    """Move to the device, then memory format, then compile (compile last: it
    traces the model as it will run)."""
    import torch

    model = model.to(device)
    if knobs["channels_last"]:
        model = model.to(memory_format=torch.channels_last)
    if knobs["compile"] != "none":
        mode = None if knobs["compile"] == "default" else knobs["compile"]
        model = torch.compile(model, mode=mode)
    return model


def autocast_dtype(knobs: dict[str, Any]):
    import torch

    return {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(knobs["precision"])


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

    if knobs["precision"] != "16-mixed":
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
