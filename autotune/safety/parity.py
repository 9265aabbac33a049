"""Loss parity: a fast configuration must not quietly change what the model
learns. Measured against the baseline, with fp16 overflow caught.

Why parity is not "train both for 20 steps and compare the losses": training can be
chaotic (ResNet-18, SGD lr 0.1: rounding-level differences grow to 20-60% loss
deviations within 20 steps, whatever the knob), and then such a comparison neither
clears a safe knob nor catches a broken one. So parity has two parts:

1. Per step, from identical state (what chaos cannot amplify): at `POINTS` points of
   the baseline's trajectory the candidate is reset to the baseline's weights and
   optimizer state, and both take one step on the same batch. The relative errors
   of the loss, the gradient (and its cosine) and the update must stay inside the
   knob's band: the larger of the dtype's rtol (RTOL) and FACTOR x the noise
   reference, the baseline against itself with its weights perturbed at the
   precision's unit roundoff (ROUNDOFF), over NOISE_SEEDS seeds.
2. A short multi-step run, for what one step cannot show (GradScaler dynamics,
   BatchNorm running statistics, optimizer state): NaN/inf, steps the GradScaler
   skipped, the deviations of the loss, the buffers and the optimizer state against
   a band from NOISE_SEEDS noise runs (judged only where those stay below the
   tolerance: past it, training is chaotic).
3. Does it train at all: from the initial state, OVERFIT_STEPS steps on one fixed
   batch must bring its loss down (`stepping.fall`). A candidate whose loss falls
   less than MIN_SHARE of the baseline's, where the baseline's falls at least
   MIN_FALL, does not train. Why one fixed batch and not the multi-step run: over
   fresh batches a chaotic baseline's loss may rise (ResNet-18 at 224 px on this
   CPU: its first-batch loss rose 233% in 20 steps), and a ratio to how far it
   moved then measures how far the baseline diverged (the rule before RULE 2 called
   bf16 "does not train" there, on every machine). Overfitting one batch is what
   any configuration that can train does, diverging or not over fresh batches, and
   one that cannot (its updates round away, its gradient vanishes) is caught
   whatever the baseline does over many batches. Where the baseline's own loss
   does not fall on the batch at the optimizer's learning rate, both sides
   overfit at a tenth of it, then a hundredth (OVERFIT_LR_SCALES): a small
   enough step along a right gradient lowers the loss (the descent lemma), and
   a learning rate past that on one batch from the initial weights is the
   optimizer's property, not the knob's (ResNet-18 at 224 px, SGD lr 0.1 with
   momentum 0.9: its loss rose 63% in 8 steps at lr 0.1, fell 64.5% at 0.01).
   The same scale for both keeps the comparison like for like; the optimizer's
   own rate first keeps every case that judged at it judged as before. And the
   baseline alone does not choose: a candidate that does not fall at the
   baseline's scale is asked again at each lower one, the baseline measured there
   too, and trains if it falls MIN_SHARE of the baseline's fall at one of them.
   At the edge of stability the rate decides by rounding which side falls in 8
   steps (ResNet-18 at 224 px, seed 1: the baseline's loss fell 46% at lr 0.1,
   bf16's rose 12%; at seed 0 the baseline's rose and both fell at lr 0.01), and
   a knob that moves the edge a little has not stopped the model from learning;
   a candidate that cannot learn (its updates round away, its gradient vanishes)
   falls at no rate.

The baseline's side (its trajectory, checkpoints and noise reference) is computed
once per search and stored in the run dir (`trial_parity`, REFERENCE_FILE); each
part of a noise level is added the first time a verdict depends on it (a band is
never below the dtype's rtol per step, nor the tolerance over many steps, so errors
inside those pass whatever the noise), and each verdict is kept there for the next
trial with the same numerics knobs.

One module, over 600 lines, because the three parts share one stored reference (its checkpoints, batches and noise
levels, each part's noise added when a verdict first depends on it) and one set of measured bands, a third of the
lines being the measurements behind them; how a verdict is shown is `autotune.safety.summary`.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from autotune import knobs as K
from autotune.safety.stepping import (
    build_run,
    fall,
    load_state,
    loss_moved,
    multi_errors,
    overfit,
    perturb_weights,
    rel_error,
    reset_and_step,
    run_trajectory,
    seeded_batches,
    step_errors,
    take_step,
    update_from,
)

# knobs that can change the loss a step computes (the rest only move data around)
PARITY_KNOBS = tuple(n for n, k in K.KNOBS.items() if k.numerics)  # the registry: can change the loss

# Unit roundoff of the arithmetic a precision computes in: bf16 keeps 8 significand
# bits (2^-8), fp16 and tf32 keep 11 (2^-11). The fp32 knobs (compile, channels_last,
# cudnn algorithms) reorder long reductions, ~sqrt(n) x fp32's 2^-24 for sums of n
# terms: 2^-16 (measured: channels_last on tiny_cnn, batch 16, moves the gradient by
# 1.2e-5, 8x what weight noise at 2^-20 does, a false alarm there).
ROUNDOFF = {"32-true": 2.0**-16, "tf32": 2.0**-11, "bf16-mixed": 2.0**-8, "16-mixed": 2.0**-11}
# torch.testing's default rtol per dtype (TransformerEngine's numerics tests use the
# same: bf16 1.6e-2, fp16 1e-3); tf32 has fp16's significand
RTOL = {"32-true": 1.3e-6, "tf32": 1e-3, "bf16-mixed": 1.6e-2, "16-mixed": 1e-3}
POINTS = 3  # per-step comparisons along the baseline's trajectory
NOISE_SEEDS = 3  # noise runs behind every band
# per step: a candidate's error may be this many times the largest noise error. Measured
# ratios of error to noise on the CPU: bf16 0.3-0.9, channels_last/compile <= 0.3, fp16
# (emulated) up to 3.3 (ResNet-18, gradient), so 8 leaves room for GPU kernels that were
# not measured; planted faults sit at 10^2-10^4 x the noise.
FACTOR = 8.0
MULTI_FACTOR = 2.0  # multi-step: this many times the largest deviation over the noise seeds
MAX_SKIPPED = 0.5  # fp16: more than half the steps skipped by the GradScaler is overflow
# "does it train" (module doc, 3). Falls measured over 8 steps on one batch (this CPU, seed 0,
# fp32 / bf16): tiny_cnn 2.4% / 2.4%, tiny_transformer 29.5% / 29.5%, ResNet-18 at 32 px 34% /
# 77% (SGD lr 0.1: it oscillates, the lowest point counts), make_chaotic (lr 0.5) 20% / 20%,
# lr 10 17% / 17%; the planted faults' candidates: make_vanishing 0%, make_stale_cast 0%. So a
# healthy candidate fell 1.0-2.3x what its baseline did, a broken one 0x. ResNet-18 at 224 px,
# batch 16, SGD lr 0.1 momentum 0.9, seed 0: at the optimizer's own lr its baseline's loss ROSE
# 63% on the batch (H200; this CPU: 63.4%, 2.53 -> 21.8 -> 10.5), at lr x0.1 it fell 64.5%, at
# x0.01 37.3% (this CPU, fp32). So OVERFIT_LR_SCALES (module doc, 3).
OVERFIT_STEPS = 8  # optimizer steps on one fixed batch
MIN_FALL = 0.02  # the baseline's loss must fall at least this (relative; above bf16's loss rtol) to judge
MIN_SHARE = 0.25  # a candidate whose loss falls less than this share of the baseline's fall does not train
# the learning rates (times the optimizer's own) tried in turn on the baseline: the first at which
# its loss falls MIN_FALL is the one both sides overfit at (none: the check does not judge)
OVERFIT_LR_SCALES = (1.0, 0.1, 0.01)
# the update's band never goes below this: the optimizer computes in fp32 whatever the precision,
# and a fused kernel reorders its arithmetic (fused AdamW on the H100: 1.32e-6, above fp32's rtol
# 1.3e-6, a false alarm under rule 1): FACTOR x 2^-20, 5.8x that measurement
UPDATE_FLOOR = FACTOR * 2.0**-20
# the version of the rules above: in every key under which a reference, a verdict or a
# search result is stored (reference_key, verdict_key, autotune.records.cache), so a verdict made
# under older rules is never served. 2: "does not train" on one fixed batch (was: moved a
# tenth of the baseline's multi-step movement), compiled candidates with eager randomness,
# the update's band at least UPDATE_FLOOR. 3: the one-batch check at a lower learning rate
# where the baseline's loss does not fall at its own (OVERFIT_LR_SCALES). 4: a user's program's numerics
# checked (safety.program_parity; before, "not measured" kept such a config from being the best).
# 5: a candidate that does not overfit at the baseline's scale is asked again at each lower one, the
# baseline measured there too (`_does_it_train`; before, bf16 on ResNet-18 at 224 px, seed 1, failed).
# 6: a program's first loss, from identical state, judged as a per-step loss error (safety.program_parity;
# before, a padding-free row whose documents attend across each other passed: 2e-4 off, inside the tolerance).
RULE = 6
REFERENCE_FILE = "parity_reference.pt"
STEP_METRICS = ("loss", "grad", "update")
MULTI_METRICS = ("loss_dev", "buffer_dev", "optim_dev")


def needs_parity(knobs: dict[str, Any], baseline: dict[str, Any]) -> bool:
    return any(knobs[k] != baseline[k] for k in PARITY_KNOBS)


def _arithmetic(precision: str, device_type: str) -> str:
    # on CUDA, "32-true" convolutions run in TF32 (torch.backends.cudnn.allow_tf32 is on by
    # default and the precision knob leaves it so): fp32 knobs differ at TF32's level there
    return "tf32" if precision == "32-true" and device_type == "cuda" else precision


def roundoff(baseline: dict[str, Any], candidate: dict[str, Any], device_type: str) -> float:
    """The noise level that compares these two: the coarser arithmetic's roundoff."""
    return max(ROUNDOFF[_arithmetic(k["precision"], device_type)] for k in (baseline, candidate))


def rtol(baseline: dict[str, Any], candidate: dict[str, Any], device_type: str) -> float:
    return max(RTOL[_arithmetic(k["precision"], device_type)] for k in (baseline, candidate))


def device_levels(baseline: dict[str, Any], device: K.Device) -> list[float]:
    """The noise levels against `baseline` of every precision that applies on `device`."""
    return sorted(
        {
            roundoff(baseline, {"precision": p}, device.type)
            for p in K.PRECISIONS
            if not K.KNOBS["precision"].unavailable(p, device)
        }
    )


# --- the baseline's reference, once per search ---------------------------------


def _points(steps: int, points: int) -> tuple:
    return tuple(sorted({round(i * steps / points) for i in range(points)}))


def build_reference(
    workload,
    baseline: dict[str, Any],
    device_type: str,
    *,
    steps: int = 20,
    seed: int = 0,
    levels: list[float] | None = None,
    points: int = POINTS,
    batches=None,
) -> dict[str, Any]:
    """The baseline's side of parity: its trajectory over `steps` batches and
    its state at the per-step points; the noise reference at each of `levels`
    (`add_levels`: none by default, as `check_parity` adds what a verdict needs).
    `batches`: the seeded batches, where the caller has them."""
    started = time.perf_counter()
    base = {**baseline, "num_workers": 0, "pin_memory": False}
    batches = batches or seeded_batches(workload, base["batch_size"], steps, seed)
    run = build_run(workload, base, device_type, seed)
    keep = _points(steps, points)
    end = run_trajectory(run, batches, seed, keep=keep)
    ref = {
        "steps": steps,
        "seed": seed,
        "points": list(keep),
        "baseline": base,
        "losses": end["losses"],
        "buffers": end["buffers"],
        "optim": end["optim"],
        "moved": loss_moved(end, end["losses"][0]),
        "states": end["states"],
        "noise": {},
    }
    ref["overfit"], ref["overfit_lr_scale"] = _baseline_overfit(run, end["states"][0], batches[0], seed)
    # ("overfit": the baseline's losses on one fixed batch by repr(lr scale); a lower scale is added where a
    # candidate is asked there, `_does_it_train`)
    add_levels(workload, ref, device_type, levels or [], run=run, batches=batches)
    ref["build_s"] = time.perf_counter() - started
    return ref


def _baseline_overfit(run, state: dict, batch, seed: int) -> tuple[dict[str, list[float]], float]:
    """The baseline's losses on one fixed batch at each of OVERFIT_LR_SCALES in
    turn (by repr of the scale) up to the first at which they fall at least
    MIN_FALL (else the last), and that scale."""
    losses = {}
    for lr_scale in OVERFIT_LR_SCALES:
        losses[repr(lr_scale)] = overfit(run, state, batch, seed=seed, steps=OVERFIT_STEPS, lr_scale=lr_scale)
        if fall(losses[repr(lr_scale)]) >= MIN_FALL:
            break
    return losses, lr_scale


def _does_it_train(
    run, base_run, reference: dict, stepped_batch, batch, *, seed: int, initial_scale: float | None
) -> dict[str, Any]:
    """Module doc, 3: the candidate overfits one fixed batch at the baseline's
    learning rate scale (`build_reference`); where it falls less than MIN_SHARE
    of the baseline's fall there, it is asked again at each lower scale of
    OVERFIT_LR_SCALES, the baseline measured there too (kept in the reference):
    it trains if at some scale where the baseline falls MIN_FALL it falls
    MIN_SHARE of that (`stepped_batch`: the first batch as the candidate steps on it, `batch` as the
    baseline does). The falls reported are the deciding scale's (the last asked where none trains); `tried`,
    every scale asked."""
    first = OVERFIT_LR_SCALES.index(reference["overfit_lr_scale"])
    tried = []
    for lr_scale in OVERFIT_LR_SCALES[first:]:
        base = reference["overfit"].get(repr(lr_scale))
        if base is None:  # the baseline at a lower scale than it needed: once per reference
            base = overfit(base_run, reference["states"][0], batch, seed=seed, steps=OVERFIT_STEPS, lr_scale=lr_scale)
            reference["overfit"][repr(lr_scale)] = base
        candidate = overfit(
            run,
            reference["states"][0],
            stepped_batch,
            seed=seed,
            steps=OVERFIT_STEPS,
            scale=initial_scale,
            lr_scale=lr_scale,
        )
        step = {"lr_scale": lr_scale, "candidate": fall(candidate), "baseline": fall(base)}
        step["judged"] = step["baseline"] >= MIN_FALL  # a baseline that cannot overfit one batch cannot tell
        step["trains"] = step["candidate"] >= MIN_SHARE * step["baseline"]
        tried.append(step)
        if not step["judged"] or step["trains"]:
            break
    decided = tried[-1]
    if not decided["judged"] and len(tried) > 1:  # the baseline stopped falling: the scales above decide
        decided = tried[-2]
    return {
        **decided,
        "steps": OVERFIT_STEPS,
        "min_fall": MIN_FALL,
        "min_share": MIN_SHARE,
        "tried": tried,
    }


def add_levels(
    workload,
    ref: dict[str, Any],
    device_type: str,
    levels: list[float],
    *,
    run=None,
    batches=None,
    parts: tuple[str, ...] = ("step", "multi"),
) -> float:
    """The noise reference at each of `levels`, its `parts` that `ref` lacks,
    added to it: "step", per point, NOISE_SEEDS steps from perturbed weights
    against the clean step; "multi", from the initial state, NOISE_SEEDS runs
    perturbed before every step. `check_parity` asks for a part only where a
    verdict depends on it (a search that never tries fp16 never pays for fp16's;
    a candidate inside the dtype's rtol and the tolerance needs none). Returns
    the seconds it took."""
    import torch

    started = time.perf_counter()
    todo = [(lv, part) for lv in levels for part in parts if part not in ref["noise"].get(repr(lv), {})]
    if not todo:
        return 0.0
    seed, keep = ref["seed"], ref["points"]
    if run is None:
        run = build_run(workload, ref["baseline"], device_type, seed)
    batches = batches or seeded_batches(workload, ref["baseline"]["batch_size"], ref["steps"], seed)
    clean = (
        {t: reset_and_step(run, ref["states"][t], batches[t], seed + t) for t in keep}
        if any(part == "step" for _, part in todo)
        else {}
    )
    for level, part in todo:
        noise = ref["noise"].setdefault(repr(level), {})
        if part == "step":
            step_errs = {t: [] for t in keep}  # per point: the errors of NOISE_SEEDS perturbed steps
            for t in keep:
                for s in range(NOISE_SEEDS):
                    load_state(run, ref["states"][t], None)
                    perturb_weights(run, level, torch.Generator().manual_seed(1000 + s))
                    step_errs[t].append(step_errors(take_step(run, batches[t], seed + t, capture=True), clean[t]))
            noise["step"] = step_errs
        else:
            multi = []
            for s in range(NOISE_SEEDS):  # from the initial state again, perturbed before every step
                load_state(run, ref["states"][0], None)
                multi.append(multi_errors(run_trajectory(run, batches, seed, level, 1 + s), ref))
            noise["multi"] = multi
    return time.perf_counter() - started


def _band(values: list, factor: float, floor: float) -> float:
    finite = [v for v in values if v is not None]
    return max(floor, factor * max(finite)) if finite else floor


@dataclass(frozen=True)
class Ranks:
    """How a candidate on several ranks runs its side of parity (autotune.safety.rank_parity); the baseline's
    run steps on the whole batches, on one rank."""

    build: Callable[..., Any]
    """builds the candidate's run, as `build_run` does (its parameters), wrapped as the trial's ranks are"""
    shard: Callable[[list], list]
    """the batches this rank steps on: its shard of every one of the seeded batches"""


def loss_parity(
    workload,
    baseline: dict[str, Any],
    candidate: dict[str, Any],
    device: K.Device,
    *,
    steps: int = 20,
    tolerance: float = 0.05,
    seed: int = 0,
    reference: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Parity of `candidate` with `baseline` (module doc): the per-step errors
    against the knob's band, then the multi-step checks; at the baseline's batch
    size, so only numerics differ. `reference`: the baseline's side from
    `build_reference` (computed here when missing, `steps` long).
    `tolerance`: multi-step deviations below it always pass. The check itself is
    `check_parity`'s."""
    if reference is not None:
        return check_parity(workload, reference, candidate, device, tolerance=tolerance, seed=seed)
    parity = {"baseline": baseline, "steps": steps, "tolerance": tolerance}
    return _check_computed(workload, parity, candidate, device, seed=seed)


def _check_computed(workload, parity: dict, candidate: dict, device: K.Device, *, seed: int, ranks=None) -> dict:
    """`check_parity` against a reference computed here (and not kept), as `parity` says ({"baseline": knobs,
    "steps", "tolerance"}): its time is the verdict's."""
    started = time.perf_counter()
    reference = build_reference(workload, parity["baseline"], device.type, steps=parity["steps"], seed=seed)
    tolerance = parity["tolerance"]
    out = check_parity(workload, reference, candidate, device, tolerance=tolerance, seed=seed, ranks=ranks)
    out.update(reference="computed", parity_s=time.perf_counter() - started)
    return out


def check_parity(
    workload,
    reference: dict[str, Any],
    candidate: dict[str, Any],
    device: K.Device,
    *,
    tolerance: float,
    seed: int,
    batches=None,
    ranks: Ranks | None = None,
) -> dict[str, Any]:
    """Parity of `candidate` with the baseline of `reference` (`build_reference`),
    over its steps (module doc). `ranks`: the candidate on several ranks; its
    run is built and fed as `Ranks` says. `batches`: the seeded batches, where the
    caller decoded them already.
    The noise reference at the candidate's level is added to `reference` only
    where the verdict depends on it: the per-step noise where an error exceeds
    the dtype's rtol, the multi-step noise where a deviation exceeds
    `tolerance` (either band is at least those); `noise`
    says which were computed, cached or not needed, `noise_s` what they cost."""
    started = time.perf_counter()
    baseline, steps = reference["baseline"], reference["steps"]
    level, tol = roundoff(baseline, candidate, device.type), rtol(baseline, candidate, device.type)
    batches = batches or seeded_batches(workload, baseline["batch_size"], steps, seed)
    knobs = {**candidate, "batch_size": baseline["batch_size"], "num_workers": 0, "pin_memory": False}
    run = (ranks.build if ranks else build_run)(workload, knobs, device.type, seed)
    stepped = ranks.shard(batches) if ranks else batches  # what the candidate steps on
    initial_scale = _initial_scale(run, reference, stepped[0], seed)
    end = run_trajectory(run, stepped, seed)
    multi = multi_errors(end, reference)
    base_run = build_run(workload, baseline, device.type, seed)
    falls = _does_it_train(run, base_run, reference, stepped[0], batches[0], seed=seed, initial_scale=initial_scale)
    per_point = _per_point(run, base_run, reference, batches, stepped, seed=seed, scale=end["scale"])
    del run
    had = dict(reference["noise"].get(repr(level), {}))
    needed = _noise_needed(per_point, multi, tol, tolerance)
    noise_s = add_levels(workload, reference, device.type, [level], run=base_run, batches=batches, parts=needed)
    del base_run
    noise = reference["noise"].get(repr(level), {})
    runs = noise.get("multi", [])
    moved_ref = statistics.median([reference["moved"]] + [s["moved"] for s in runs])
    nonfinite = not end["finite"] or not all(p["finite"] for p in per_point)
    out = {
        "steps": steps,
        "tolerance": tolerance,
        "max_rel_dev": multi["loss_dev"] if not nonfinite else math.inf,
        "mean_rel_dev": multi["mean_loss_dev"],
        "final_rel_dev": multi["final_loss_dev"],
        "noise_floor": max(s["loss_dev"] for s in runs) if runs else None,  # the noise runs' largest loss deviation
        "noise": {p: "cached" if p in had else "computed" if p in noise else "not needed" for p in ("step", "multi")},
        "noise_s": noise_s,
        "nonfinite": nonfinite,
        "skipped_steps": end["skipped"],
        "per_step": _per_step(per_point, noise, level, tol, reference["points"]),
        "multi_step": _multi_step(multi, runs, tolerance),
        "moved": {"candidate": multi["moved"], "baseline": moved_ref},  # reported: over fresh batches
        "overfit": falls,
        "rule": RULE,
    }
    if end["scale"] is not None:
        out["initial_scale"], out["final_scale"] = initial_scale, end["scale"]
    failures = _failures(out, candidate["precision"], tol)
    out["passed"] = not failures
    out["failed"] = [check for check, _ in failures]
    out["reason"] = "; ".join(reason for _, reason in failures) or None
    out["reference"] = "cached"
    out["parity_s"] = time.perf_counter() - started
    return out


def _initial_scale(run, reference: dict, batch, seed: int) -> float | None:
    """Under a GradScaler: the scale its back-off from 2^16 reaches on the first
    batch, the run left at it (those first skipped steps only delay training,
    and one step behind, the multi-step deviations would measure the delay;
    skips after that are counted). None without a scaler, or where no scale
    gives finite gradients."""
    if run.scaler is None:
        return None
    first = reset_and_step(run, reference["states"][0], batch, seed)
    initial_scale = run.scaler.get_scale() if first["grads_finite"] else None
    load_state(run, reference["states"][0], initial_scale)
    return initial_scale


def _per_point(run, base_run, reference: dict, batches: list, stepped: list, *, seed: int, scale) -> list[dict]:
    """At each of the reference's points, one step of each side from the
    baseline's state there, and the candidate's errors against the baseline's."""
    per_point = []
    for t in reference["points"]:
        b = reset_and_step(base_run, reference["states"][t], batches[t], seed + t)
        c = reset_and_step(run, reference["states"][t], stepped[t], seed + t, scale)
        # the update against the baseline's optimizer stepping on the candidate's own gradient: what
        # the knob does to the step (unscaling, skipping); the gradient's error is the grad row.
        # (Against the baseline's update, Adam turns rounding noise in gradients that should be
        # zero, e.g. attention key biases, into full-size updates: update_total, reported only.)
        update = rel_error(c["update"], update_from(base_run, reference["states"][t], c["grad"]))
        per_point.append(
            {
                "step": t,
                **step_errors(c, b),
                "update": update,
                "finite": c["finite"] and c["grads_finite"],
                "backoffs": c["backoffs"],
            }
        )
    return per_point


def _noise_needed(per_point: list[dict], multi: dict, tol: float, tolerance: float) -> tuple[str, ...]:
    """The parts of the noise reference a verdict depends on: "step" where a
    per-step error exceeds the dtype's rtol, "multi" where a multi-step deviation
    exceeds the tolerance (the bands never go below those)."""
    return (("step",) if any(p[m] > tol for p in per_point for m in ("loss", "grad")) else ()) + (
        ("multi",) if any(v is not None and v > tolerance for v in (multi[m] for m in MULTI_METRICS)) else ()
    )


def _per_step(per_point: list[dict], noise: dict, level: float, tol: float, points: list) -> dict[str, Any]:
    """The per-step errors against their bands: per point its own band (the
    noise there; late points of a chaotic run are ill-conditioned, the first is
    not), and the worst ratio of error to band decides."""
    per_step: dict[str, Any] = {"points": points, "roundoff": level, "rtol": tol, "factor": FACTOR}
    for p in per_point:  # (no step noise: every error is inside rtol, which the band never goes below)
        noise_at = noise["step"][p["step"]] if "step" in noise else [{}]
        for m in STEP_METRICS:  # (the update from the same gradient and state has no noise: rtol alone)
            p[m + "_noise"] = max(e[m] for e in noise_at) if m in noise_at[0] else 0.0
            p[m + "_band"] = _band([p[m + "_noise"]], FACTOR, max(tol, UPDATE_FLOOR) if m == "update" else tol)
    for m in STEP_METRICS:
        worst = max(per_point, key=lambda p: p[m] / p[m + "_band"])
        per_step[m] = {"max": worst[m], "band": worst[m + "_band"], "noise": worst[m + "_noise"], "at": worst["step"]}
    per_step["grad"]["cos_min"] = min(p["grad_cos"] for p in per_point)
    per_step["at"] = per_point
    return per_step


def _multi_step(multi: dict, runs: list[dict], tolerance: float) -> dict[str, Any]:
    """The multi-step deviations against their bands, judged only where rounding
    noise alone stays below the tolerance; where it does not, training is chaotic
    and the deviation says nothing about the knob (measured: ResNet-18 at lr 0.1,
    compile 352% against noise runs' 112%). (No multi-step noise: every deviation
    is inside the tolerance, which the band never goes below.)"""
    multi_step = {}
    for m in MULTI_METRICS:
        if multi[m] is not None:
            noise_m = max(s[m] for s in runs) if runs else None
            multi_step[m] = {
                "value": multi[m],
                "band": _band([noise_m], MULTI_FACTOR, tolerance),
                "noise": noise_m,
                "judged": noise_m is None or noise_m <= tolerance,
            }
    return multi_step


def _failures(out: dict[str, Any], precision: str, tol: float) -> list[tuple[str, str]]:
    """The checks a verdict's numbers (`check_parity`'s) fail, each with its reason."""
    steps, skipped, falls = out["steps"], out["skipped_steps"], out["overfit"]
    failures = []
    if out["nonfinite"]:
        overflow = " (fp16 overflow)" if precision == "16-mixed" else ""
        failures.append(("nonfinite", "NaN/inf in the loss, gradients or weights" + overflow))
    if skipped > MAX_SKIPPED * steps:
        failures.append(("skipped steps", f"the GradScaler skipped {skipped} of {steps} steps (fp16 overflow)"))
    if out["nonfinite"]:
        return failures
    for m in STEP_METRICS:
        e = out["per_step"][m]
        if e["max"] > e["band"]:
            failures.append(
                (
                    f"per-step {m}",
                    f"per-step {m} error {e['max']:.2e} above its band {e['band']:.2e} at step {e['at']} "
                    f"(rtol {tol:g}; rounding noise alone: {e['noise']:.2e})",
                )
            )
    for m, e in out["multi_step"].items():
        if e["judged"] and e["value"] > e["band"]:
            name = m.replace("_dev", "")
            failures.append(
                (
                    f"multi-step {name}",
                    f"{name} deviates {e['value']:.1%} from the baseline over {steps} steps (band {e['band']:.1%})",
                )
            )
    if falls["judged"] and not falls["trains"]:
        failures.append(("does not train", _does_not_train(falls)))
    return failures


def _does_not_train(falls: dict[str, Any]) -> str:
    first, *lower = [t for t in falls["tried"] if t["judged"]]
    return (
        f"does not train: on one fixed batch its loss fell {first['candidate']:.2%} in "
        f"{OVERFIT_STEPS} steps, the baseline's {first['baseline']:.2%}"
        + (f" (at {first['lr_scale']:g} x the learning rate)" if first["lr_scale"] != 1 else "")
        + "".join(
            f"; at {t['lr_scale']:g} x the learning rate {t['candidate']:.2%}, the baseline's {t['baseline']:.2%}"
            for t in lower
        )
    )


def reference_key(workload_ref: dict, baseline: dict[str, Any], steps: int, seed: int, device: K.Device) -> dict:
    """What a stored reference must match to be reused."""
    import torch

    return {
        "rule": RULE,
        "workload": workload_ref,
        "baseline": dict(baseline),
        "steps": steps,
        "seed": seed,
        "points": POINTS,
        "noise_seeds": NOISE_SEEDS,
        "device": [device.type, device.name],
        "torch": str(torch.__version__),
    }


def trial_parity(
    workload,
    workload_ref: dict,
    parity: dict[str, Any],
    candidate: dict[str, Any],
    device: K.Device,
    seed: int = 0,
    *,
    ranks: Ranks | None = None,
) -> dict[str, Any]:
    """A trial's parity. `parity`: {"baseline": knobs, "steps", "tolerance",
    "reference": path}. The reference at `path` is reused when it matches; the
    first trial that needs it computes it (the baseline's trajectory) and stores
    it there, and a trial whose verdict needs noise the reference lacks (its
    level, the per-step or the multi-step part: `check_parity`) adds it and
    stores it again, when `path`'s directory exists (a trial on another node, or
    run alone, computes its own). Each verdict is stored beside it, under its
    `verdict_key`: a later trial with the same numerics knobs (one rank) takes
    it instead of computing it again. `ranks`: the candidate on several ranks
    (`Ranks`)."""
    import torch

    steps, path = parity.get("steps", 20), parity.get("reference")
    key = reference_key(workload_ref, parity["baseline"], steps, seed, device)
    level = roundoff(parity["baseline"], candidate, device.type)
    tolerance = parity.get("tolerance", 0.05)
    reference, verdicts, started, paid = None, {}, time.perf_counter(), None
    if path and os.path.exists(path):
        try:
            saved = torch.load(path, weights_only=True)
            if saved.get("key") == key:
                reference, verdicts = saved["reference"], saved.get("verdicts", {})
        except Exception:  # a partial or foreign file: compute instead
            reference = None
    same = None if ranks else verdict_key(candidate, tolerance)  # several ranks: their own sharding
    if same in verdicts:  # the same numerics knobs were checked in this search: the same computation, not rerun
        return {
            **verdicts[same],
            "reference": "verdict reused (same numerics knobs)",
            "parity_s": time.perf_counter() - started,
        }
    # the first trial that needs parity stores it (a file of another key stays: compute alone)
    writable = path and os.path.isdir(os.path.dirname(os.path.abspath(path)))
    batches = None  # decoded once where this trial builds the reference and checks against it
    if writable and reference is None and not os.path.exists(path):
        batches = seeded_batches(workload, parity["baseline"]["batch_size"], steps, seed)
        reference = build_reference(workload, parity["baseline"], device.type, steps=steps, seed=seed, batches=batches)
        paid = ("computed and stored", reference["build_s"])

    def store() -> None:
        tmp = f"{path}.{os.getpid()}.tmp"  # the rename makes it whole or absent (a lost race only computes again)
        torch.save({"key": key, "reference": reference, "verdicts": verdicts}, tmp)
        os.replace(tmp, path)

    if paid:  # stored before the check too: a check that raises must not cost the next trial the reference
        store()
    if reference is None:
        asked = {"baseline": parity["baseline"], "steps": steps, "tolerance": tolerance}
        out = _check_computed(workload, asked, candidate, device, seed=seed, ranks=ranks)
    else:
        out = check_parity(
            workload, reference, candidate, device, tolerance=tolerance, seed=seed, batches=batches, ranks=ranks
        )
    if writable and reference is not None and (same is not None or out["noise_s"]):  # a verdict, noise added
        verdicts = {**verdicts, same: out} if same is not None else verdicts
        store()
    if writable and reference is not None and out["noise_s"] and not paid:
        paid = (f"noise level {level:.3g} added and stored", 0.0)
    if paid:  # the search's one-time cost, apart (a trial's cost estimate leaves it out: budget.trial_cost)
        out.update(reference=paid[0], parity_s=time.perf_counter() - started, reference_s=paid[1] + out["noise_s"])
    return out


def verdict_key(candidate: dict[str, Any], tolerance: float) -> str:
    """What a parity verdict depends on beyond the reference: the numerics knobs
    (the registry's: the only knobs that change the loss a step computes; parity
    runs at the baseline's batch size, one process) and the tolerance."""
    return repr(sorted((k, candidate[k]) for k in PARITY_KNOBS)) + f" tol={tolerance!r} rule={RULE}"
