"""The trial request: what the driver (Ray, or `scripts/search_no_ray.py`) hands
the torch-only runner for one proposal. Built in one place from the search's
settings and the proposal's knobs, so every launcher runs the same trial. Needs
neither torch nor Ray.

    settings = TrialSettings.of(spec_dict, device_type, baseline)
    config = settings.config(knobs, prune_below, incumbent_above)   # -> python -m autotune.trial's JSON
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
        )

    def timed_only(self) -> "TrialSettings":
        """The same trials with the window only: no profiled window, diagnosis or
        loss parity (a re-measurement, autotune.confirm)."""
        return replace(self, trial={**self.trial, "profile_steps": 0, "diagnose": False}, parity=None)

    def parity_check(self) -> "TrialSettings":
        """Loss parity alone, no window (the late check of a config about to be
        exported whose trial did not run it)."""
        return replace(self, trial={**self.trial, "profile_steps": 0, "diagnose": False, "parity_only": True})

    def config(self, knobs: dict[str, Any], prune_below: float | None = None,
               incumbent_above: float | None = None, predicted: float | None = None) -> dict[str, Any]:
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
            "incumbent_above": incumbent_above,  # below it: the window alone (strategy v2)
            "predicted": predicted,  # the rate model's samples/s (autotune.model), recorded next to the measurement
        }
