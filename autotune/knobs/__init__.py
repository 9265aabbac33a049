"""The knobs: the registry (every knob's domain, constraints, stage, safety class
and label, in one table), the search space it resolves to on a device, and how
each knob is applied. Importable without torch (the CLI and the spec use it).

    from autotune import knobs as K
    K.KNOBS["num_workers"].safety     # the registry
    K.resolve_space(lists, baseline, device)
    K.build_loader(dataset, knobs)    # applying knobs (imports torch on call)
    K.build_optimizer(workload, model, knobs)
    K.wrap(model, knobs, device, world_size)  # checkpointing, compile, DDP/FSDP

May import: nothing else of autotune (everything else derives from it).
"""

from autotune.knobs._apply import (
    apply_backend_flags,
    apply_process_flags,
    autocast,
    autocast_dtype,
    build_loader,
    build_optimizer,
    fuse_optimizer,
    grad_scaler,
    lay_out_state_like_params,
    load_optimizer_state,
    loader_kwargs,
    map_tensors,
    optimizer_of,
    prepare_model,
    prepare_optimizer,
    seeded_loader,
    to_channels_last,
    to_device,
    workload_args,
)
from autotune.knobs._parallel import BlockError, find_blocks, no_sync, wrap
from autotune.knobs._registry import (
    BOTTLENECKS,
    COMPILE_MODES,
    KNOBS,
    PRECISIONS,
    SAFETY_CLASSES,
    SHARDINGS,
    STAGES,
    USER,
    USER_PREFIX,
    Device,
    Knob,
    conflicts,
    declare,
    from_cell,
    fused_unavailable,
    ladder_key,
    lookup,
    pytorch_defaults,
    registry,
    to_cell,
    user_knob,
)
from autotune.knobs._space import NOT_SEARCHED, Space, resolve_space

__all__ = [
    "BlockError",
    "SHARDINGS",
    "find_blocks",
    "no_sync",
    "wrap",
    "BOTTLENECKS",
    "COMPILE_MODES",
    "KNOBS",
    "PRECISIONS",
    "SAFETY_CLASSES",
    "STAGES",
    "USER",
    "USER_PREFIX",
    "NOT_SEARCHED",
    "Device",
    "Knob",
    "Space",
    "apply_backend_flags",
    "apply_process_flags",
    "autocast",
    "autocast_dtype",
    "build_loader",
    "build_optimizer",
    "conflicts",
    "declare",
    "from_cell",
    "fuse_optimizer",
    "fused_unavailable",
    "ladder_key",
    "grad_scaler",
    "lay_out_state_like_params",
    "load_optimizer_state",
    "loader_kwargs",
    "lookup",
    "map_tensors",
    "optimizer_of",
    "prepare_model",
    "prepare_optimizer",
    "pytorch_defaults",
    "registry",
    "resolve_space",
    "seeded_loader",
    "to_cell",
    "to_channels_last",
    "to_device",
    "user_knob",
    "workload_args",
]
