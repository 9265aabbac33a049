"""Loss parity of a user's own program (`workload.command`): the program's loss
trajectory under a candidate's numerics knobs against the baseline's, each run
of the program from the same seed at the baseline's batch size and loader
settings, reading the losses it reports through `cfg.step(loss=...)` (the
Trainers' callbacks report theirs).

A program is a process autotune cannot step by hand, so the per-step checks
at points along the trajectory and the one-batch check of `parity` do not apply
(its batches cannot be replayed). Two checks are left, each against a band from
noise runs: the baseline again with its weights perturbed at the comparison's
rounding level before every step (the rounding a lower precision would add),
NOISE_SEEDS times.

1. The first step (RULE 6), from identical state: every parity run starts from
   the same seed, so the first loss is the same weights on the same batch, and
   its relative error is judged as `parity`'s per-step loss error is, inside
   max(the arithmetic's rtol, FACTOR x the noise runs' first-loss error). This is
   what sees a fault that changes the loss a little where training has not yet
   moved it (a random-init model at a fine-tuning learning rate: its loss stays
   near log(vocab) for many steps): a padding-free row whose documents attend
   across each other (the position ids dropped, or a KV cache beside them) moves a
   tiny Llama's first loss 2e-4, 150 x fp32's rtol, inside any multi-step
   tolerance. Not judged where the model draws random numbers in training
   (dropout: `draws_random`): an attention kernel or a flattened row draws other
   masks, and the first losses differ by the draw.
2. The multi-step comparison, judged as `parity` judges it (torchtitan's
   loss_compare does the same): the largest relative deviation of the
   candidate's losses from the baseline's over `steps` steps, inside
   max(tolerance, MULTI_FACTOR x noise). Where the noise runs alone deviate past
   the tolerance, training is chaotic and the deviation says nothing about the
   knob: not judged.

So:

- passed: every loss finite, both checks judged and inside their bands (the
  first step may be not judged where the model draws random numbers);
- failed: a loss NaN/inf, or a judged check past its band;
- not judged: the multi-step check not judged, chaotic (above), or the noise
  could not be made (the program never handed autotune its model: `cfg.prepare`,
  `cfg.wrap` or a Trainer);
- not measured: the program reports no loss.

Only "passed" counts as checked (`passed: True`); the rest keep the config from
being exported as checked. The baseline's runs are made once per search and
kept in the run dir (REFERENCE_FILE, under a key with parity.RULE), as each
verdict is (keyed by the candidate's numerics knobs).

Runs with torch alone (the perturbation); the verdict is plain arithmetic.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable

from autotune.safety.parity import FACTOR, MULTI_FACTOR, NOISE_SEEDS, PARITY_KNOBS, RULE, roundoff
from autotune.safety.parity import rtol as arithmetic_rtol
from autotune.safety.stepping import perturb_params

REFERENCE_FILE = "program_parity.json"
NOISE_SEED_BASE = 1  # noise run s perturbs with torch.Generator().manual_seed(NOISE_SEED_BASE + s)


def run_knobs(candidate: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """What a parity run of `candidate` sets: the baseline's knobs (its batch size, loader and threads, its
    flags), with the candidate's numerics knobs."""
    return {**baseline, **{k: candidate[k] for k in PARITY_KNOBS if k in candidate}}


def perturb(model, level: float, generator) -> None:
    """Rounding-level noise on `model`'s floating-point parameters: relative, `level` standard deviation."""
    perturb_params([p for p in model.parameters() if p.is_floating_point()], level, generator)


def draws_random(model) -> bool:
    """Whether `model` draws random numbers in a training step: a dropout module with p > 0, or a transformers
    config's dropout probability above 0 (`attention_dropout`, `attn_pdrop`, ...: transformers' attention
    kernels drop out with a functional call, no module)."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
            return True
        config = getattr(module, "config", None)
        if hasattr(config, "to_dict"):
            for key, value in config.to_dict().items():
                if ("dropout" in key or "pdrop" in key) and type(value) in (int, float) and value > 0:
                    return True
    return False


def _dev(losses: list[float], ref: list[float]) -> float:
    devs = [abs(x - y) / max(abs(y), 1e-8) if math.isfinite(x) else math.inf for x, y in zip(losses, ref)]
    return max(devs) if devs else math.inf


def verdict(
    reference: list[float],
    noise: list[list[float]] | None,
    candidate: list[float],
    steps: int,
    tolerance: float,
    level: float,
    *,
    rtol: float,
    random: bool = False,
) -> dict[str, Any]:
    """The verdict on `candidate`'s first `steps` losses against the baseline's (`reference`), with the
    baseline's noise runs (`noise`; None: they could not be made); `rtol`, the first step's floor (the
    arithmetic's, parity.rtol); `random`: the model draws random numbers in training (its first step is not
    judged). See the module doc."""
    out: dict[str, Any] = {"steps": steps, "tolerance": tolerance, "rule": RULE, "program": True, "skipped_steps": 0}
    if len(reference) < steps or len(candidate) < steps:
        short = min(len(reference), len(candidate))
        return {
            **out,
            "passed": False,
            "verdict": "not measured",
            "max_rel_dev": math.nan,
            "reason": f"not measured: the program reported {short} of {steps} losses (autotune reads the scalar "
            "each backward() runs on; a loop without one reports it: cfg.step(loss=loss))",
        }
    cand, ref = candidate[:steps], reference[:steps]
    dev = _dev(cand, ref)
    noise_dev = max((_dev(n[:steps], ref) for n in noise), default=0.0) if noise is not None else None
    band = max(tolerance, MULTI_FACTOR * noise_dev) if noise_dev is not None else tolerance
    judged = noise_dev is not None and noise_dev <= tolerance
    first = _dev(cand[:1], ref[:1])
    first_noise = max((_dev(n[:1], ref[:1]) for n in noise), default=0.0) if noise is not None else None
    first_step = {
        "value": first,
        "band": max(rtol, FACTOR * first_noise) if first_noise is not None else rtol,
        "noise": first_noise,
        "rtol": rtol,
        "judged": first_noise is not None and not random,
    }
    if random:
        first_step["why_not"] = "the model draws random numbers in training (dropout)"
    nonfinite = not all(math.isfinite(x) for x in cand)
    out.update(
        max_rel_dev=dev,
        final_rel_dev=_dev(cand[-1:], ref[-1:]),
        noise_floor=noise_dev,
        roundoff=level,
        nonfinite=nonfinite,
        first_step=first_step,
        multi_step={"loss_dev": {"value": dev, "band": band, "noise": noise_dev, "judged": judged}},
    )
    if nonfinite:
        return {**out, "passed": False, "verdict": "failed", "failed": ["nonfinite"], "reason": "NaN/inf in the loss"}
    failed, reasons = [], []
    if first_step["judged"] and first > first_step["band"]:
        failed.append("first-step loss")
        reasons.append(
            f"its first loss, from the baseline's weights on the same batch, deviates {first:.1e} "
            f"(band {first_step['band']:.1e}: rtol {rtol:g}, rounding noise alone {first_noise:.1e})"
        )
    if judged and dev > band:
        failed.append("multi-step loss")
        reasons.append(f"loss deviates {dev:.1%} from the baseline over {steps} steps (band {band:.1%})")
    if failed:
        return {**out, "passed": False, "verdict": "failed", "failed": failed, "reason": "; ".join(reasons)}
    if not judged:
        why = (
            f"not judged: autotune found no model in the program (no module with trainable parameters ran forward "
            f"in grad mode; cfg.watch(model) hands one over), so the noise of its trajectory could not be measured; "
            f"the loss deviates {dev:.1%} over {steps} steps"
            if noise_dev is None
            else f"not judged: chaotic (rounding noise alone moves the loss {noise_dev:.1%} over {steps} steps, past "
            f"the tolerance {tolerance:.1%}); the candidate deviates {dev:.1%}"
        )
        return {**out, "passed": False, "verdict": "not judged", "reason": why}
    return {**out, "passed": True, "verdict": "passed", "failed": [], "reason": None}


class Reference:
    """The baseline's side, once per search: its losses and its noise runs per rounding level, and the
    verdicts made, in the run dir's REFERENCE_FILE under a key (the rule, the baseline, the steps, the seed)."""

    def __init__(self, path: Path, key: dict[str, Any]):
        self.path, self.key = Path(path), key
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        fresh = {"key": key, "losses": None, "random": False, "noise": {}, "verdicts": {}}
        self.data = data if data.get("key") == key else fresh

    def save(self) -> None:
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)


Run = Callable[..., Any]  # run(knobs, label, noise=None) -> TrialResult (its status, metrics, losses)


def check(
    run: Run,
    candidate: dict[str, Any],
    baseline: dict[str, Any],
    parity: dict[str, Any],
    *,
    device_type: str,
    path: Path,
    label: str,
    seed: int = 0,
) -> tuple[dict[str, Any] | None, Any]:
    """The late parity check of a program's `candidate`: (its verdict, None), or (None, the run that did not
    finish, for `decide.checked.late_failure`). `run` runs the program as a parity request (`noise`: {"seed",
    "level"} for a noise run): the baseline once per search, its noise runs once per rounding level, the
    candidate unless a verdict on the same numerics knobs is kept."""
    started = time.perf_counter()
    steps, tolerance = parity["steps"], parity["tolerance"]
    level = roundoff(baseline, candidate, device_type)
    ref = Reference(path, {"rule": RULE, "baseline": baseline, "steps": steps, "seed": seed, "noise": NOISE_SEEDS})
    vkey = repr(sorted((k, candidate.get(k)) for k in PARITY_KNOBS)) + f" tol={tolerance!r}"
    if vkey in ref.data["verdicts"]:
        return {**ref.data["verdicts"][vkey], "reference": "cached"}, None
    if ref.data["losses"] is None:
        base = run(baseline, f"{label}-baseline")
        if base.status != "ok":
            return None, base
        ref.data["losses"] = list(base.losses or [])
        ref.data["random"] = bool(base.metric("parity_random"))
        ref.save()
    judge = {"rtol": arithmetic_rtol(baseline, candidate, device_type), "random": ref.data["random"]}
    if len(ref.data["losses"]) < steps:  # a program that reports no loss: nothing to compare, nothing more to run
        return verdict(ref.data["losses"], None, [], steps, tolerance, level, **judge), None
    noise = ref.data["noise"].get(repr(level), False)
    if noise is False:
        runs = []
        for s in range(NOISE_SEEDS):
            r = run(baseline, f"{label}-noise{s}", noise={"seed": NOISE_SEED_BASE + s, "level": level})
            if r.status != "ok":
                return None, r
            runs.append(list(r.losses or []) if r.metric("parity_perturbed") else None)
        noise = None if any(n is None for n in runs) else runs
        ref.data["noise"][repr(level)] = noise
        ref.save()
    result = run(run_knobs(candidate, baseline), label)
    if result.status != "ok":
        return None, result
    out = verdict(ref.data["losses"], noise, list(result.losses or []), steps, tolerance, level, **judge)
    out["parity_s"] = time.perf_counter() - started
    ref.data["verdicts"][vkey] = out
    ref.save()
    return out, None
