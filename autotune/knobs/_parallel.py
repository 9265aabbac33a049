"""The multi-rank knobs applied to a model: its repeated blocks found as FSDP wrap
policies find them, activation checkpointing per block, then DDP or FSDP2
`fully_shard` per block (torch imported on call). One function, `wrap`, for the
trial's ranks and for `TunedConfig.wrap`, so what is exported is what was measured.
"""

from __future__ import annotations

import functools
from typing import Any

CONTAINERS = ("Sequential", "ModuleList", "ModuleDict")


class BlockError(ValueError):
    """No repeated block where one is needed (FSDP per block, checkpointing); says why."""


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_blocks(model, names: list[str] | None = None) -> list:
    """The model's repeated blocks: the instances of the module class named in
    `names` (class names, e.g. ["TransformerEncoderLayer"]), or else of the class
    with two or more instances that holds the most parameters (a transformer
    layer, a ResNet block), as a ModuleWrapPolicy would be given it; containers
    (Sequential, ModuleList) and leaf modules are never found, only named. [] when none."""
    if names:
        return [m for m in model.modules() if m is not model and type(m).__name__ in names]
    by_class: dict[type, list] = {}
    for module in model.modules():
        if module is model or type(module).__name__ in CONTAINERS or not any(True for _ in module.children()):
            continue
        by_class.setdefault(type(module), []).append(module)
    repeated = {cls: ms for cls, ms in by_class.items() if len(ms) >= 2 and _params(ms[0])}
    if not repeated:
        return []
    return max(repeated.values(), key=lambda ms: (sum(_params(m) for m in ms), -len(ms)))


def checkpoint_blocks(blocks: list) -> None:
    """Activation checkpointing per block: its forward runs under
    torch.utils.checkpoint (non-reentrant), so its activations are recomputed in
    backward instead of kept. The module and its state dict are unchanged."""
    from torch.utils.checkpoint import checkpoint

    for block in blocks:
        forward = block.forward
        block.forward = functools.partial(checkpoint, forward, use_reentrant=False)


def wrap(model, knobs: dict[str, Any], device, world_size: int = 1, block_names: list[str] | None = None):
    """The tuned model, in torchtitan's order (parallelize_llama):
    1. activation checkpointing per repeated block (inside everything else, so a
       compiled or sharded block recomputes its own forward);
    2. the knobs' device, memory format and compile (`prepare_model`);
    3. with two or more ranks, DDP(bucket_cap_mb, gradient_as_bucket_view,
       static_graph) or FSDP2 `fully_shard` per block, then the root (last: it
       wraps the model as it will run).
    Build the optimizer after `wrap`: FSDP replaces the parameters by shards."""
    import torch

    from autotune.knobs._apply import prepare_model

    blocks = find_blocks(model, block_names)
    if knobs.get("activation_checkpointing"):
        if not blocks:
            raise BlockError(
                "activation_checkpointing needs a repeated block (a module class with two or more "
                "instances holding parameters); name one in the spec's resources.blocks"
            )
        checkpoint_blocks(blocks)
    device = torch.device(device)
    model = prepare_model(model, knobs, device)
    if world_size < 2:
        return model
    if knobs.get("sharding", "ddp") == "fsdp":
        from torch.distributed.fsdp import fully_shard

        if not blocks:
            raise BlockError(
                "sharding=fsdp shards per repeated block and this model has none (no module class "
                "with two or more instances holding parameters); name one in resources.blocks, or use ddp"
            )
        reshard = knobs.get("fsdp_reshard_after_forward", True)
        for block in blocks:
            fully_shard(block, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=knobs.get("ddp_bucket_cap_mb", 25),
        gradient_as_bucket_view=knobs.get("ddp_gradient_as_bucket_view", False),
        static_graph=knobs.get("ddp_static_graph", False),
    )


def no_sync(model, skip: bool):
    """A context in which backward does not synchronize gradients (a gradient
    accumulation micro-step): DDP's `no_sync`, FSDP2's `set_requires_gradient_sync`."""
    import contextlib

    if not skip:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):
        return model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):

        @contextlib.contextmanager
        def unsynced():
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return unsynced()
    return contextlib.nullcontext()
