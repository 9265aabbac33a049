"""The multi-rank knobs applied to a model: its repeated blocks (autotune.knobs._blocks),
the language-model knobs (activation checkpointing per block among
them: autotune.knobs._lm), then DDP or FSDP2 `fully_shard` per block (torch imported on
call). One function, `wrap`, for the trial's ranks and for `Config.wrap` (autotune.config), so what is
exported is what was measured.
"""

from __future__ import annotations

from typing import Any

from autotune.knobs._blocks import BlockError, find_blocks


def wrap(model, knobs: dict[str, Any], device, world_size: int = 1, block_names: list[str] | None = None):
    """The tuned model, in torchtitan's order (parallelize_llama):
    1. the language-model knobs `knobs` holds (float8, Liger, the attention kernel, then
       activation checkpointing per repeated block: `_lm.prepare_lm`), inside everything
       else, so a compiled or sharded block recomputes its own forward;
    2. the knobs' device, memory format and compile (`prepare_model`);
    3. with two or more ranks, DDP(bucket_cap_mb, gradient_as_bucket_view,
       static_graph) or FSDP2 `fully_shard` per block, then the root (last: it
       wraps the model as it will run).
    Build the optimizer after `wrap`: FSDP replaces the parameters by shards."""
    import torch

    from autotune.knobs._apply import prepare_model
    from autotune.knobs._lm import prepare_lm

    prepare_lm(model, knobs, block_names)
    blocks = find_blocks(model, block_names)
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
