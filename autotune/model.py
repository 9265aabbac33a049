"""A rate model of a training step (after Plumber, MLSys 2022): the throughput of
a config not yet measured, from the rates the diagnosed trials measured apart
(`autotune.sides`: the compute ceiling on a cached batch, one loader worker's
rate; the 2x-batch probe, the compute side at twice the batch). The climb runs the move it predicts fastest first
(`Strategy.fastest_first`); it skips a config the model predicts clearly below
the incumbent (`skipped: predicted`,
with the prediction), and every prediction is recorded next to its
measurement (`predicted_samples_per_s` in trials.csv), so its error is a number.

The model, from a diagnosed trial R with the same compute-side knobs:
- compute ceiling C at R's batch B; at batch b, the step time scales by the 2x
  probe's ratio r per doubling: C(b) = C * (b / B) / r ** log2(b / B), r at
  most 2 (a step over twice as long at twice the batch is a disturbed probe:
  a larger batch is never predicted slower per sample);
- one loader worker makes L samples/s whatever the batch;
- no workers: loading and compute take turns, 1 / (1/C + 1/L); w workers:
  they overlap, min(C, w * L);
- calibrated on R itself: its measured throughput over what the model says for
  R (a step's overheads the two sides leave out).
It models the batch size and the loader workers alone. It cannot say (None)
for a config that differs from every diagnosed trial in any other knob (a
precision, layout or compile never measured; pinning, prefetch, DDP buckets,
activation checkpointing: none of them is in the model, and none is assumed
free), nor a batch change without the probe (a compiled trial skips it). Where it is wrong: workers and compute share a small
host's cores (2 CPUs: w workers slow the compute side down, not modelled), and
a batch far from B extrapolates the probe's one doubling.

Needs nothing but the standard library.
"""

from __future__ import annotations

import math
from typing import Any

MODELLED = ("batch_size", "num_workers")  # every other knob: a prediction needs a trial that ran it
RATES = ("samples_per_s", "compute_ceiling_samples_per_s", "loader_samples_per_s_per_worker", "batch2x_step_ratio")
SKIP_BELOW = 0.85  # predicted below this share of the incumbent: clearly below, not run


def rates_of(metrics: dict[str, Any]) -> dict[str, float] | None:
    """What a diagnosed trial measured that the model uses; None without the two sides."""
    out = {k: float(metrics[k]) for k in RATES if metrics.get(k) is not None}
    return out if "compute_ceiling_samples_per_s" in out and "loader_samples_per_s_per_worker" in out else None


def _raw(knobs: dict[str, Any], ceiling: float, batch: int, loader: float, ratio: float | None) -> float | None:
    b = knobs.get("batch_size") or batch
    if b != batch:
        if not ratio:
            return None
        ratio = min(ratio, 2.0)  # above 2 (a step more than twice as long at twice the batch) is a disturbed probe
        doublings = math.log2(b / batch)
        ceiling = ceiling * (b / batch) / ratio ** doublings
    workers = knobs.get("num_workers") or 0
    return 1 / (1 / ceiling + 1 / loader) if workers == 0 else min(ceiling, workers * loader)


def predict(knobs: dict[str, Any], measured: list[tuple[dict[str, Any], dict[str, float]]]) -> dict[str, Any] | None:
    """The predicted throughput of `knobs` from the diagnosed trials
    (`measured`: their knobs and `rates_of`): {"samples_per_s", "from": the
    knobs of the trial it came from}, or None when the model cannot say."""
    same = [(k, r) for k, r in measured
            if all(k.get(n) == knobs.get(n) for n in set(k) | set(knobs) if n not in MODELLED)]
    best = None
    for ref, rates in same:
        batch = ref.get("batch_size")
        ratio = rates.get("batch2x_step_ratio")
        args = (rates["compute_ceiling_samples_per_s"], batch, rates["loader_samples_per_s_per_worker"], ratio)
        at_ref = _raw(ref, *args)
        value = _raw(knobs, *args)
        if value is None or not at_ref:
            continue
        value *= rates.get("samples_per_s", at_ref) / at_ref  # calibrated on the trial itself
        distance = sum(ref.get(n) != knobs.get(n) for n in knobs)  # the nearest measured config says most
        if best is None or distance < best[0]:
            best = (distance, value, ref)
    if best is None:
        return None
    return {"samples_per_s": best[1], "from": best[2]}


def error(rows) -> dict[str, Any] | None:
    """The model's error over the trials it predicted (`rows`: trial number,
    predicted and measured samples/s): measured / predicted - 1, its median
    size and the worst trial; None where it predicted none."""
    pairs = [(n, p, m) for n, p, m in rows if p and m]
    if not pairs:
        return None
    errs = sorted(((m / p - 1, n) for n, p, m in pairs), key=lambda e: abs(e[0]))
    return {"trials": len(pairs), "median_abs_error": round(abs(errs[len(errs) // 2][0]), 4),
            "worst_error": round(errs[-1][0], 4), "worst_trial": errs[-1][1],
            "per_trial": [[n, round(p, 1), round(m, 1)] for n, p, m in pairs]}
