"""The trial request: what the driver (Ray, or `scripts/search_no_ray.py`) hands
the torch-only runner for one proposal. Built in one place from the search's
settings and the proposal's knobs, so every launcher runs the same trial. Needs
neither torch nor Ray.

    settings = TrialSettings.of(spec_dict, device_type, baseline)
    config = settings.config(knobs, prune_below)   # -> python -m autotune.trial's JSON
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from autotune import knobs as K

TRIAL_KEYS = ("warmup_steps", "measure_steps", "min_window_s", "target_ci", "max_window_s", "profile_steps", "diagnose")


@dataclass(frozen=True)
class TrialSettings:
    """What every trial of a search shares."""

    workload: dict[str, Any]  # {"name" | "factory", "args"}
    trial: dict[str, Any]  # the spec's trial settings the runner takes (TRIAL_KEYS)
    device: str  # auto | cpu | cuda
    seed: int
    base_batch: int
    keep_effective_batch: bool
    parity: dict[str, Any]  # {"baseline": knobs, "steps", "tolerance", ...}
    ranks: int = 1  # processes per trial (resources.ranks_per_trial)
    blocks: list[str] | None = None  # the model's repeated block classes (resources.blocks)
    memory_limit_gib: float | None = None  # a forced memory limit per trial process (resources.memory_limit_gib)

    @classmethod
    def of(cls, spec: dict[str, Any], device: str, baseline: dict[str, Any], parity: dict | None = None):
        """From the spec as plain data (`Spec.model_dump(mode="json")`, or the plain reader's)."""
        safety = spec["safety"]
        return cls(
            workload={k: v for k, v in spec["workload"].items() if v is not None},
            trial={k: spec["trial"][k] for k in TRIAL_KEYS}, device=device, seed=spec["search"]["seed"],
            base_batch=baseline["batch_size"], keep_effective_batch=safety["keep_effective_batch"],
            parity=parity or {"baseline": {k: v for k, v in baseline.items() if k in K.KNOBS},
                              "steps": safety["parity_steps"], "tolerance": safety["tolerance"]},
            ranks=spec["resources"].get("ranks_per_trial", 1), blocks=spec["resources"].get("blocks"),
            memory_limit_gib=spec["resources"].get("memory_limit_gib"),
        )

    def timed_only(self) -> "TrialSettings":
        """The same trials with the window only: no profiled window, diagnosis or
        loss parity (a re-measurement, autotune.confirm)."""
        return replace(self, trial={**self.trial, "profile_steps": 0, "diagnose": False}, parity=None)

    def config(self, knobs: dict[str, Any], prune_below: float | None = None) -> dict[str, Any]:
        """The runner's config for these knobs (built-in knobs and `args.NAME` user knobs)."""
        return {
            "workload": {**self.workload, "args": {**self.workload.get("args", {}), **K.workload_args(knobs)}},
            "knobs": {k: knobs[k] for k in K.KNOBS},
            **self.trial,
            "trace_path": "trace.json" if self.trial["profile_steps"] else None,
            "device": self.device,
            # keep_effective_batch: micro-batches per optimizer step
            "accum_steps": self.base_batch // knobs["batch_size"] if self.keep_effective_batch else 1,
            "parity": self.parity,
            "seed": self.seed,
            "prune_below": prune_below,
            # several ranks: a fixed window on every rank, no pruning (autotune.ranks)
            **({"ranks": self.ranks, "prune_below": None} if self.ranks > 1 else {}),
            **({"blocks": self.blocks} if self.blocks else {}),
            **({"memory_limit_gib": self.memory_limit_gib} if self.memory_limit_gib else {}),
        }
