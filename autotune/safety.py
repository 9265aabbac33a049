"""Convergence safety: a fast configuration must not quietly change what the model
learns. Measured loss parity against the baseline, fp16 overflow, and what a
batch-size change means for the optimizer."""

from __future__ import annotations

import math
from typing import Any

from autotune import knobs as K

LEVELS = {  # safety.level -> the knob classes it lets the search change
    "strict": {"safe"},
    "numerics": {"safe", "numerics", "reproducibility"},
    "dynamics": {"safe", "numerics", "reproducibility", "dynamics"},
}
# knobs that can change the loss a step computes (the rest only move data around)
PARITY_KNOBS = ("precision", "compile", "channels_last", "cudnn_benchmark", "set_to_none")
ADAM_LIKE = ("adam", "adagrad", "rmsprop", "lamb", "adafactor", "lion")
MAX_SKIPPED = 0.5  # fp16: more than half the steps skipped by the GradScaler is overflow
# Training can be chaotic (a high learning rate on random data): rounding-level
# differences then grow to large loss differences within 20 steps, whatever the knob
# (measured: ResNet-18, lr 0.1, channels_last 131%). So the baseline is also run
# with weights perturbed by NOISE (a few fp32 ulps); a candidate deviating less than
# FLOOR_FACTOR x that floor behaves like rounding noise and passes.
NOISE = 1e-6
FLOOR_FACTOR = 2.0


def needs_parity(knobs: dict[str, Any], baseline: dict[str, Any]) -> bool:
    return any(knobs[k] != baseline[k] for k in PARITY_KNOBS)


def loss_parity(workload, baseline: dict[str, Any], candidate: dict[str, Any], device: K.Device,
                steps: int = 20, tolerance: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """Train the baseline and the candidate from identical weights on identical
    batches (the baseline's batch size, so only numerics differ) for `steps`
    steps; compare the per-step losses with the tolerance and with the noise
    floor (see NOISE). Flags NaN/inf in a loss, the gradients or the weights, and
    fp16 steps the GradScaler had to skip."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from autotune.trial import prepare

    batch = baseline["batch_size"]
    sampler = RandomSampler(workload.dataset, num_samples=steps * batch, generator=torch.Generator().manual_seed(seed))
    batches = list(DataLoader(workload.dataset, batch_size=batch, sampler=sampler, collate_fn=workload.collate_fn))

    def trajectory(knobs, perturb: bool = False):
        knobs = {**knobs, "batch_size": batch, "num_workers": 0, "pin_memory": False}
        session = prepare(workload, knobs, device, steps, seed)  # seeded: identical initial weights
        session.check_grads = True
        if perturb:  # rounding-level noise on the weights: the baseline's own sensitivity
            g = torch.Generator().manual_seed(seed + 1)
            with torch.no_grad():
                for p in session.model.parameters():
                    p.mul_(1 + NOISE * torch.randn(p.shape, generator=g).to(p.device))
        losses, skipped = [], 0
        for b in batches:
            scale = session.scaler.get_scale() if session.scaler else None
            losses.append(float(session.step(b).detach().float()))
            if session.scaler and session.scaler.get_scale() < scale:
                skipped += 1  # the scaler found inf/NaN gradients and skipped the step
        finite_weights = all(bool(torch.isfinite(p).all()) for p in session.model.parameters())
        finite_weights = finite_weights and session.nonfinite_grads == 0
        return losses, skipped, finite_weights, session.scaler.get_scale() if session.scaler else None

    def deviations(a, b):
        return [abs(y - x) / max(abs(x), 1e-8) for x, y in zip(a, b)]

    base_losses, _, _, _ = trajectory(baseline)
    floor_devs = deviations(base_losses, trajectory(baseline, perturb=True)[0])
    floor = max(floor_devs) if all(math.isfinite(d) for d in floor_devs) else math.inf
    losses, skipped, finite_weights, final_scale = trajectory(candidate)
    devs = deviations(base_losses, losses)
    nonfinite = not finite_weights or not all(math.isfinite(x) for x in losses)
    max_dev = max(devs) if devs and all(math.isfinite(d) for d in devs) else math.inf
    out = {
        "steps": steps, "tolerance": tolerance,
        "max_rel_dev": max_dev, "mean_rel_dev": sum(devs) / len(devs) if math.isfinite(max_dev) else math.inf,
        "final_rel_dev": devs[-1] if devs else None,
        "noise_floor": floor,  # the same deviation for the baseline with rounding-level weight noise
        "nonfinite": nonfinite, "skipped_steps": skipped,
    }
    if final_scale is not None:
        out["final_scale"] = final_scale
    reasons = []
    if nonfinite:
        reasons.append("NaN/inf in the loss, gradients or weights"
                       + (" (fp16 overflow)" if candidate["precision"] == "16-mixed" else ""))
    if skipped > MAX_SKIPPED * steps:
        reasons.append(f"the GradScaler skipped {skipped} of {steps} steps (fp16 overflow)")
    if not nonfinite and max_dev > tolerance and max_dev > FLOOR_FACTOR * floor:
        reasons.append(f"loss deviates {max_dev:.1%} from the baseline (tolerance {tolerance:.1%}; "
                       f"rounding noise alone: {floor:.1%})")
    out["passed"] = not reasons
    out["reason"] = "; ".join(reasons) or None
    return out


def batch_advice(baseline_batch: int, tuned_batch: int, optimizer: str | None, has_batchnorm: bool,
                 accumulation_steps: int = 1) -> dict[str, Any] | None:
    """What a batch-size change means for training, or None when there is none.
    `accumulation_steps` > 1: the search kept the effective batch (micro-batches)."""
    per_step = tuned_batch
    effective = tuned_batch * accumulation_steps
    if effective == baseline_batch and accumulation_steps == 1:
        return None
    advice: dict[str, Any] = {"baseline": baseline_batch, "per_step": per_step, "effective": effective}
    if accumulation_steps > 1:
        advice["grad_accumulation_steps"] = accumulation_steps
        advice["note"] = f"the effective batch stays {effective}: accumulate {accumulation_steps} micro-batches per optimizer step"
    elif tuned_batch < baseline_batch:
        steps = -(-baseline_batch // tuned_batch)
        advice["grad_accumulation_steps"] = steps
        advice["note"] = (f"accumulate {steps} steps of {tuned_batch} to keep the effective batch "
                          f"{baseline_batch}" + ("" if baseline_batch % tuned_batch == 0 else f" (~{steps * tuned_batch})"))
    else:
        ratio = tuned_batch / baseline_batch
        adam = bool(optimizer) and any(a in optimizer.lower() for a in ADAM_LIKE)
        rule, factor = ("sqrt", math.sqrt(ratio)) if adam else ("linear", ratio)
        advice["lr_scaling"] = {"rule": rule, "factor": round(factor, 4), "optimizer": optimizer}
        advice["note"] = (f"the batch grows {ratio:g}x: consider scaling the learning rate by {factor:.3g} "
                          f"({rule} rule for {'Adam-style' if adam else 'SGD-style'} optimizers) with a warm-up")
    if has_batchnorm and per_step < 32:
        advice["batchnorm"] = (f"BatchNorm normalizes over {per_step} samples per step: below ~32 its statistics get "
                               "noisy; consider GroupNorm/SyncBatchNorm or a larger per-step batch")
    return advice
