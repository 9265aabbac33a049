"""Loss parity of a multi-rank config, checked against the single-rank baseline's
math: DDP's averaged gradient equals one batch of the global size, and so does
FSDP's reduce-scattered one. So the reference is the baseline on one rank at the
global batch (its per-rank batch times the ranks), and the candidate runs on
every rank, wrapped as the trial's ranks are (`K.wrap`: DDP with its tuned
arguments or FSDP2 per block, checkpointing, compile), each rank stepping on its
shard of every global batch; the per-step and multi-step checks and their bands
are autotune.safety.parity's. A step's loss is the mean of the ranks' losses
(all-reduced; for a loss that is a mean over the batch, the global batch's
loss), its gradient what DDP leaves on every rank, or FSDP's shards gathered
whole (`stepping`: parameters, gradients and optimizer state are gathered to be
compared, and the baseline's state is sharded to be loaded).

What makes N ranks differ from one batch of the global size fails here as it
should: a loss summed over the batch (DDP and FSDP average the ranks' gradients,
so each is 1/N of the global one), BatchNorm (its statistics are the rank's shard's).

Runs inside the trial's ranks, every rank the same steps (the loss is a
collective). Needs torch (imported on call).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from autotune import knobs as K
from autotune.safety.parity import Ranks, trial_parity
from autotune.safety.stepping import build_run


def _global_mean(loss_fn, world: int):
    """The workload's loss, its value the mean over the ranks (all-reduced), its
    gradient the rank's own loss's (DDP averages the gradients)."""
    import torch.distributed as dist

    def loss(model, batch):
        local = loss_fn(model, batch).float()
        total = local.detach().clone()
        dist.all_reduce(total)
        return local + (total / world - local.detach())

    return loss


def _build(workload, knobs: dict[str, Any], device_type: str, seed: int, world: int, blocks):
    candidate = dataclasses.replace(workload, loss=_global_mean(workload.loss, world))
    return build_run(candidate, knobs, device_type, seed, world, blocks)


def _shard(batches: list, rank: int, world: int) -> list:
    return [K.map_tensors(lambda t: t.chunk(world)[rank], batch) for batch in batches]


def rank_parity(
    workload,
    workload_ref: dict,
    parity: dict[str, Any],
    candidate: dict[str, Any],
    device: K.Device,
    *,
    seed: int = 0,
    blocks: list[str] | None = None,
) -> dict[str, Any]:
    """This rank's part of a multi-rank config's loss parity (module doc): the
    result is the same on every rank. The reference (the baseline at the global
    batch) is stored next to the single-rank one, named for the ranks."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    baseline = parity["baseline"]
    path = parity.get("reference")
    if path:
        root, ext = os.path.splitext(path)
        path = f"{root}.ranks{world}{ext}"
    parity = {**parity, "baseline": {**baseline, "batch_size": baseline["batch_size"] * world}, "reference": path}
    out = trial_parity(
        workload,
        workload_ref,
        parity,
        candidate,
        device,
        seed,
        ranks=Ranks(
            build=functools.partial(_build, world=world, blocks=blocks),
            shard=functools.partial(_shard, rank=rank, world=world),
        ),
    )
    out["ranks"], out["global_batch"] = world, parity["baseline"]["batch_size"]
    return out
