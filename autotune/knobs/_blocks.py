"""A model's repeated blocks (transformer layers, ResNet blocks), found as FSDP wrap policies find them: what
activation checkpointing wraps (autotune.knobs._lm) and FSDP shards (autotune.knobs._parallel)."""

from __future__ import annotations

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
