"""Training runs stepped by hand, for loss parity: the workload with the knobs
applied as a trial applies them, one optimizer step at a time (what happens
inside a step: loss, gradients, update), state saved and loaded, weights
perturbed at a given level; and the errors between two runs. Under FSDP
(several ranks), what is compared is gathered whole from the shards, and a
state from one rank is sharded to be loaded."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autotune import knobs as K

MAX_BACKOFF = 24  # fp16, per step: halve the loss scale up to this many times for finite gradients


# --- one training run, stepped by hand (parity needs what happens inside a step) ---


@dataclass
class _Run:
    workload: Any
    knobs: dict[str, Any]
    device: Any  # torch.device
    model: Any
    optimizer: Any
    scaler: Any


def build_run(
    workload, knobs: dict[str, Any], device_type: str, seed: int, world: int = 1, blocks: list[str] | None = None
) -> _Run:
    """The workload with the knobs applied, in the order a trial applies them;
    seeded, so every run starts from identical weights. With `world` ranks (in
    the process group), wrapped as the trial's ranks are (`K.wrap`: DDP)."""
    import torch

    torch.manual_seed(seed)
    K.apply_backend_flags(knobs)
    dev = torch.device(device_type)
    model = (
        K.wrap(workload.model(), knobs, dev, world, blocks)
        if world > 1
        else K.prepare_model(workload.model(), knobs, dev)
    )
    return _Run(
        workload, knobs, dev, model, K.build_optimizer(workload, model, knobs), K.grad_scaler(knobs, device_type)
    )


def seeded_batches(workload, batch_size: int, steps: int, seed: int) -> list:
    """`steps` full batches in a seeded random order, loaded in this process (the
    loader knobs do not change what a batch holds)."""
    return list(K.seeded_loader(workload, {"batch_size": batch_size}, steps, seed))


def _device_batch(run: _Run, batch):
    """A batch as the model sees it in a trial: on the device, preprocessed, channels_last."""
    batch = K.to_device(batch, run.device, non_blocking=False)
    if run.workload.preprocess is not None:
        batch = run.workload.preprocess(batch)
    return K.to_channels_last(batch) if run.knobs["channels_last"] else batch


def _params(run: _Run) -> list:
    return [p for p in run.model.parameters() if p.requires_grad]


def _full(t):
    """A tensor whole: an FSDP shard (a DTensor) gathered from every rank (a
    collective: every rank calls it in the same order), anything else as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _shard_like(value, like):
    """`value` (a whole tensor, as a state dict on one rank holds it) laid out as
    `like` is: sharded as an FSDP parameter is, or as it is where `like` is whole."""
    if not hasattr(like, "device_mesh"):
        return value
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(value.to(like.device, like.dtype), like.device_mesh, like.placements)


def _eager_random(run: _Run):
    """A compiled run draws its random numbers as eager code does (inductor's
    fallback_random), while it compiles and steps here. Why: parity asks whether
    compile changes the arithmetic; inductor's own RNG draws other dropout masks
    from the same seed, another sample of the same distribution, which compile
    is free to draw. Compared mask against other mask, every step of a model with
    dropout differs by the dropout itself (a false alarm on randomness alone).
    Only inside parity's steps: a trial times the compiled model with inductor's
    own (faster) RNG, as production runs it."""
    import contextlib

    if run.knobs["compile"] == "none":
        return contextlib.nullcontext()
    from torch._inductor import config

    return config.patch(fallback_random=True)


def _loss(run: _Run, batch):
    """The workload's loss on `batch`, as a trial computes it (autocast), random ops as eager's."""
    with _eager_random(run), K.autocast(run.knobs, run.device.type):
        return run.workload.loss(run.model, _device_batch(run, batch))


def probe(run: _Run, batch, seed: int) -> float:
    """The loss on `batch`, forward alone, random ops drawn from `seed`."""
    import torch

    torch.manual_seed(seed)
    return float(_loss(run, batch).detach().float())


def take_step(run: _Run, batch, seed: int, capture: bool = False) -> dict[str, Any]:
    """One optimizer step as a trial takes it; with `capture`, the (unscaled)
    gradient and the update it made."""
    import torch

    K.apply_backend_flags(run.knobs)  # process-wide: the baseline and the candidate take turns
    torch.manual_seed(seed)  # dropout and other random ops draw the same for every run
    loss = _loss(run, batch)
    with _eager_random(run):
        (run.scaler.scale(loss) if run.scaler is not None else loss).backward()
    params = _params(run)  # after backward: FSDP's module holds its gathered parameters between the two
    if run.scaler is not None:
        run.scaler.unscale_(run.optimizer)
    grads = [p.grad for p in params if p.grad is not None]
    out = {"loss": float(loss.detach().float()), "skipped": False}
    out["grads_finite"] = all(bool(torch.isfinite(_full(g)).all()) for g in grads)
    # under a GradScaler, inf/NaN gradients are its business (a skipped step, counted apart)
    out["finite"] = math.isfinite(out["loss"]) and (out["grads_finite"] or run.scaler is not None)
    if capture:
        out["grad"] = [
            _full(p.grad).detach().float().clone()
            if p.grad is not None
            else torch.zeros_like(_full(p.detach()), dtype=torch.float)
            for p in params
        ]
        before = [_full(p.detach()).float().clone() for p in params]
    if run.workload.clip is not None:  # the program's clipping is part of its step
        run.workload.clip(run.model, run.optimizer, run.knobs["precision"])
    if run.scaler is not None:
        scale = run.scaler.get_scale()
        run.scaler.step(run.optimizer)
        run.scaler.update()
        out["skipped"] = run.scaler.get_scale() < scale  # inf/NaN gradients: the step was skipped
    else:
        run.optimizer.step()
    if capture:
        out["update"] = [_full(p.detach()).float() - b for p, b in zip(params, before)]
    run.optimizer.zero_grad(set_to_none=run.knobs["set_to_none"])
    return out


def _cpu(obj):
    return K.map_tensors(lambda t: _full(t).detach().to("cpu", copy=True), obj)


def _module(run: _Run):
    model = getattr(run.model, "_orig_mod", run.model)  # under torch.compile: the module it wraps
    if type(model).__name__ == "DistributedDataParallel":  # several ranks: the module DDP wraps (compiled, maybe)
        model = getattr(model.module, "_orig_mod", model.module)
    return model


def _state(run: _Run) -> dict[str, Any]:
    return {
        "model": _cpu(_module(run).state_dict()),
        "optim": _cpu(run.optimizer.state_dict()),
        "scale": run.scaler.get_scale() if run.scaler is not None else None,
    }


def load_state(run: _Run, state: dict[str, Any], scale: float | None) -> None:
    import torch

    module = _module(run)
    own = module.state_dict()
    module.load_state_dict({k: _shard_like(v, own[k]) for k, v in state["model"].items()})
    K.load_optimizer_state(run.optimizer, _cpu(state["optim"]))  # a copy: the step updates the state in place
    for p, st in run.optimizer.state.items():  # FSDP: each parameter's state sharded as the parameter is
        for key, t in st.items():
            if isinstance(t, torch.Tensor) and t.shape == p.shape and not hasattr(t, "device_mesh"):
                st[key] = _shard_like(t, p)
    if run.scaler is not None:
        run.scaler = torch.amp.GradScaler(run.device.type, init_scale=scale or state["scale"] or 2.0**16)


def _buffers(run: _Run) -> list:
    return [_full(b).detach().float().cpu().clone() for b in _module(run).buffers() if b.is_floating_point()]


def _optim_tensors(run: _Run) -> list:
    state = run.optimizer.state_dict()["state"]
    return [
        _full(v).detach().float().cpu().clone().reshape(-1)
        for i in sorted(state)
        for _, v in sorted(state[i].items())
        if hasattr(v, "is_floating_point") and v.is_floating_point() and v.dim() > 0
    ]


def perturb_weights(run: _Run, level: float, g) -> None:
    """Rounding-level noise on the weights: relative, `level` standard deviation."""
    perturb_params(_params(run), level, g)


def perturb_params(params, level: float, g) -> None:
    """Rounding-level noise on `params`: relative, `level` standard deviation (a program's model too,
    safety.program_parity)."""
    import torch

    with torch.no_grad():
        for p in params:
            p.mul_(1 + level * torch.randn(p.shape, generator=g).to(p.device, p.dtype))


def run_trajectory(
    run: _Run, batches: list, seed: int, level: float = 0.0, noise_seed: int = 0, keep: tuple = ()
) -> dict[str, Any]:
    """Train on `batches`; with `level`, weights perturbed before every step (the
    rounding a lower precision would add). States at the steps in `keep`."""
    import torch

    g = torch.Generator().manual_seed(noise_seed)
    out: dict[str, Any] = {"losses": [], "skipped": 0, "finite": True, "states": {}}
    for t, batch in enumerate(batches):
        if t in keep:
            out["states"][t] = _state(run)
        if level:
            perturb_weights(run, level, g)
        s = take_step(run, batch, seed + t)
        out["losses"].append(s["loss"])
        out["skipped"] += s["skipped"]
        out["finite"] = out["finite"] and s["finite"]
    out["finite"] = out["finite"] and all(bool(torch.isfinite(_full(p)).all()) for p in _params(run))
    out["buffers"], out["optim"] = _buffers(run), _optim_tensors(run)
    out["scale"] = run.scaler.get_scale() if run.scaler is not None else None
    out["probe"] = probe(run, batches[0], seed)  # the first batch again: did the loss move at all?
    return out


# --- errors ----------------------------------------------------------------------


def rel_error(a: list, b: list) -> float:
    """|a - b| / |b| over all tensors together (inf where anything is not finite)."""
    num = sum(float(((x.double() - y.double()) ** 2).sum()) for x, y in zip(a, b))
    den = sum(float((y.double() ** 2).sum()) for y in b)
    if not (math.isfinite(num) and math.isfinite(den)):
        return math.inf
    return math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)


def _cos(a: list, b: list) -> float:
    dot = sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b))
    na = math.sqrt(sum(float((x.double() ** 2).sum()) for x in a))
    nb = math.sqrt(sum(float((y.double() ** 2).sum()) for y in b))
    return dot / (na * nb) if na * nb > 0 and math.isfinite(dot) else (1.0 if na == nb == 0 else 0.0)


def _rel_scalar(x: float, ref: float) -> float:
    return abs(x - ref) / max(abs(ref), 1e-8) if math.isfinite(x) else math.inf


def step_errors(c: dict, b: dict) -> dict[str, float]:
    return {
        "loss": _rel_scalar(c["loss"], b["loss"]),
        "grad": rel_error(c["grad"], b["grad"]),
        "grad_cos": _cos(c["grad"], b["grad"]),
        "update_total": rel_error(c["update"], b["update"]),
    }


def update_from(run: _Run, state: dict, grads: list) -> list:
    """The update `run`'s optimizer makes from `state` given these gradients."""
    load_state(run, state, None)
    params = _params(run)
    before = [p.detach().float().clone() for p in params]
    for p, g in zip(params, grads):
        p.grad = g.to(p.device, p.dtype)
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return [p.detach().float() - b for p, b in zip(params, before)]


def overfit(
    run: _Run, state: dict, batch, *, seed: int, steps: int, scale: float | None = None, lr_scale: float = 1.0
) -> list[float]:
    """From `state`, `steps` optimizer steps on the same `batch` (the standard
    "can it overfit one batch" check), then the loss on it once more: the
    `steps` + 1 losses. Each step draws the same random numbers (dropout masks).
    `lr_scale`: every parameter group's learning rate times this."""
    load_state(run, state, scale)
    for group in run.optimizer.param_groups:
        group["lr"] = group["lr"] * lr_scale
    losses = [take_step(run, batch, seed)["loss"] for _ in range(steps)]
    return losses + [probe(run, batch, seed)]


def fall(losses: list[float]) -> float:
    """How far the loss fell below its first value, relative to it: the lowest
    finite loss after the first (a loss that oscillates while it falls is judged
    by its best point; one that never falls, or is never finite again, gives <= 0)."""
    after = [x for x in losses[1:] if math.isfinite(x)]
    if not after or not math.isfinite(losses[0]):
        return -math.inf
    return (losses[0] - min(after)) / max(abs(losses[0]), 1e-8)


def loss_moved(end: dict, scale: float) -> float:
    """How far the loss on the first batch moved over the run, relative to `scale`."""
    return abs(end["probe"] - end["losses"][0]) / max(abs(scale), 1e-8) if math.isfinite(end["probe"]) else math.inf


def multi_errors(end: dict, ref: dict) -> dict[str, Any]:
    devs = [_rel_scalar(x, y) for x, y in zip(end["losses"], ref["losses"])]
    return {
        "loss_dev": max(devs),
        "mean_loss_dev": sum(devs) / len(devs),
        "final_loss_dev": devs[-1],
        "buffer_dev": rel_error(end["buffers"], ref["buffers"]) if ref["buffers"] else None,
        "optim_dev": rel_error(end["optim"], ref["optim"]) if ref["optim"] else None,
        "moved": loss_moved(end, ref["losses"][0]),
    }


def reset_and_step(run: _Run, state: dict, batch, seed: int, scale: float | None = None) -> dict[str, Any]:
    """One step from `state`. Under a GradScaler: from `scale`, halved while the
    gradients overflow (the scaler's own back-off), so an fp16 step that can be
    taken is compared, and one that overflows at every scale is reported."""
    for backoffs in range(MAX_BACKOFF if run.scaler is not None else 1):
        load_state(run, state, scale)
        out = take_step(run, batch, seed, capture=True)
        if out["grads_finite"] or run.scaler is None:
            break
        scale = run.scaler.get_scale()  # already halved by the skipped step
    out["backoffs"] = backoffs
    return out
