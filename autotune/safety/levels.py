"""Convergence safety: which knob classes a search may change (safety.level),
and what a batch-size change means for the optimizer. Loss parity, measured
against the baseline, is `autotune.safety.parity`."""

from __future__ import annotations

import math
from typing import Any

from autotune.safety.parity import (
    PARITY_KNOBS,
    REFERENCE_FILE,
    STEP_METRICS,
    loss_parity,
    needs_parity,
    trial_parity,
)
from autotune.safety.summary import describe, parity_summary

__all__ = [
    "LEVELS",
    "ADAM_LIKE",
    "batch_advice",
    "PARITY_KNOBS",
    "REFERENCE_FILE",
    "STEP_METRICS",
    "describe",
    "loss_parity",
    "needs_parity",
    "parity_summary",
    "trial_parity",
]

LEVELS = {  # safety.level -> the knob classes it lets the search change
    "strict": {"safe"},
    "numerics": {"safe", "numerics", "reproducibility"},
    "dynamics": {"safe", "numerics", "reproducibility", "dynamics"},
}
ADAM_LIKE = ("adam", "adagrad", "rmsprop", "lamb", "adafactor", "lion")


def batch_advice(
    baseline_batch: int, tuned_batch: int, optimizer: str | None, has_batchnorm: bool, accumulation_steps: int = 1
) -> dict[str, Any] | None:
    """What a batch-size change means for training, or None when there is none.
    `accumulation_steps` > 1: the search kept the effective batch (micro-batches)."""
    per_step = tuned_batch
    effective = tuned_batch * accumulation_steps
    if effective == baseline_batch and accumulation_steps == 1:
        return None
    advice: dict[str, Any] = {"baseline": baseline_batch, "per_step": per_step, "effective": effective}
    if accumulation_steps > 1:
        advice["grad_accumulation_steps"] = accumulation_steps
        advice["note"] = (
            f"the effective batch stays {effective}: accumulate {accumulation_steps} micro-batches per optimizer step"
        )
    elif tuned_batch < baseline_batch:
        steps = -(-baseline_batch // tuned_batch)
        advice["grad_accumulation_steps"] = steps
        advice["note"] = f"accumulate {steps} steps of {tuned_batch} to keep the effective batch {baseline_batch}" + (
            "" if baseline_batch % tuned_batch == 0 else f" (~{steps * tuned_batch})"
        )
    else:
        ratio = tuned_batch / baseline_batch
        adam = bool(optimizer) and any(a in optimizer.lower() for a in ADAM_LIKE)
        rule, factor = ("sqrt", math.sqrt(ratio)) if adam else ("linear", ratio)
        advice["lr_scaling"] = {"rule": rule, "factor": round(factor, 4), "optimizer": optimizer}
        advice["note"] = (
            f"the batch grows {ratio:g}x: consider scaling the learning rate by {factor:.3g} "
            f"({rule} rule for {'Adam-style' if adam else 'SGD-style'} optimizers) with a warm-up"
        )
    if has_batchnorm and per_step < 32:
        advice["batchnorm"] = (
            f"BatchNorm normalizes over {per_step} samples per step: below ~32 its statistics get "
            "noisy; consider GroupNorm/SyncBatchNorm or a larger per-step batch"
        )
    return advice
