"""A rate model of a training step (after Plumber, MLSys 2022): the throughput of
a config not yet measured, from the rates the diagnosed trials measured apart
(`autotune.trial.sides`: the compute ceiling on a cached batch, one loader worker's
rate; the 2x-batch probe, the compute side at twice the batch). The climb runs the move it predicts fastest first
(`Strategy.fastest_first`); it skips a config the model predicts clearly below
the incumbent (`skipped: predicted`,
with the prediction), and every prediction is recorded next to its
measurement (`predicted_samples_per_s` in trials.csv), so its error is a number.

The model, from a diagnosed trial R with the same compute-side knobs:
- R is the nearest: fewest knobs apart, then the closest batch;
- compute ceiling C at R's batch B; at batch b, the step time scales by the 2x
  probe's ratio r per doubling: C(b) = C * (b / B) / r ** log2(b / B), r at
  most 2 (a step over twice as long at twice the batch is a disturbed probe:
  a larger batch is never predicted slower per sample);
- one loader worker makes L samples/s whatever the batch;
- no workers: loading and compute take turns, 1 / (1/C + 1/L); w workers:
  they overlap, min(C, w * L);
- on a CPU device (`shared`) the workers and the compute share the host's P
  cores: compute at t threads (num_threads, else P) costs t/C core-seconds a
  sample and loading 1/L, so w workers reach at most P / (t/C + 1/L) too;
- calibrated on R itself: its measured throughput over what the model says for
  R (a step's overheads the two sides leave out);
- and on the trials measured since (`measured` holds every measured trial, the
  undiagnosed ones with their throughput alone): a config with loader workers
  predicted from a trial without them, or the other way round, is corrected by
  the median of what such predictions missed on the measured trials (`_workers_miss`:
  the cost of handing batches across processes, and threads that oversubscribe
  the cores, which neither side measures: on 2 CPUs one worker slowed tiny_cnn
  by 25-35% where the shares predicted 1% faster).
It models the batch size and the loader workers alone. It cannot say (None)
for a config that differs from every diagnosed trial in any other knob (a
precision, layout or compile never measured; pinning, prefetch, DDP buckets,
activation checkpointing: none of them is in the model, and none is assumed
free), nor a batch change without the probe (a compiled trial skips it). Where
it is wrong: the first config with workers, before any was measured, and a
batch far from B, which extrapolates the probe's one doubling.
`scripts/bench/bench_model.py` replays it over recorded searches.

Needs nothing but the standard library.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from autotune.trial.result import unit_of

MODELLED = ("batch_size", "num_workers")  # every other knob: a prediction needs a trial that ran it
RATES = (
    "samples_per_s",
    "compute_ceiling_samples_per_s",
    "loader_samples_per_s_per_worker",
    "batch2x_step_ratio",
    "host_cpus_per_gpu",
)
SKIP_BELOW = 0.85  # predicted below this share of the incumbent: clearly below, not run


def rates_of(metrics: dict[str, Any]) -> dict[str, float] | None:
    """What a diagnosed trial measured that the model uses; None without the two sides. Its `samples_per_s` is
    the trial's throughput in the search's unit (trial.result.unit_of: a language model's tokens/s), as the
    study's values are: a prediction is calibrated on it (`_base`), so it comes out in that unit too."""
    out = {k: float(metrics[k]) for k in RATES if metrics.get(k) is not None}
    if metrics.get(unit_of(metrics).metric) is not None:
        out["samples_per_s"] = float(metrics[unit_of(metrics).metric])
    return out if "compute_ceiling_samples_per_s" in out and "loader_samples_per_s_per_worker" in out else None


def _raw(knobs: dict[str, Any], rates: dict[str, float], batch: int, shared: bool) -> float | None:
    ceiling, loader = rates["compute_ceiling_samples_per_s"], rates["loader_samples_per_s_per_worker"]
    b = knobs.get("batch_size") or batch
    if b != batch:
        ratio = rates.get("batch2x_step_ratio")
        if not ratio:
            return None
        ratio = min(ratio, 2.0)  # above 2 (a step more than twice as long at twice the batch) is a disturbed probe
        ceiling = ceiling * (b / batch) / ratio ** math.log2(b / batch)
    workers = knobs.get("num_workers") or 0
    if workers == 0:
        return 1 / (1 / ceiling + 1 / loader)
    rate = min(ceiling, workers * loader)
    cores = rates.get("host_cpus_per_gpu")
    if shared and cores:  # the compute's threads and the workers share the host's cores
        threads = min(knobs.get("num_threads") or cores, cores)
        rate = min(rate, cores / (threads / ceiling + 1 / loader))
    return rate


def _same_compute(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(n) == b.get(n) for n in set(a) | set(b) if n not in MODELLED)


def _base(knobs: dict[str, Any], diagnosed: list, shared: bool) -> tuple[float, dict[str, Any]] | None:
    """(throughput, the trial it came from): from the nearest diagnosed trial with the same compute knobs,
    calibrated on that trial itself."""
    best = None
    for ref, rates in diagnosed:
        if not _same_compute(ref, knobs):
            continue
        at_ref, value = (
            _raw(ref, rates, ref.get("batch_size"), shared),
            _raw(knobs, rates, ref.get("batch_size"), shared),
        )
        if value is None or not at_ref:
            continue
        value *= rates.get("samples_per_s", at_ref) / at_ref  # calibrated on the trial itself
        # the nearest measured config says most: fewest knobs apart, then the closest batch (the probe's one
        # doubling compounded from a far batch overshot 86% on an H200: fp32 saturates)
        distance = (
            sum(ref.get(n) != knobs.get(n) for n in knobs),
            abs(math.log2((knobs.get("batch_size") or 1) / (ref.get("batch_size") or 1))),
        )
        if best is None or distance < best[0]:
            best = (distance, value, ref)
    return best and (best[1], best[2])


def _loads(knobs: dict[str, Any]) -> bool:
    return bool(knobs.get("num_workers"))


def _workers_miss(knobs: dict[str, Any], measured: list, diagnosed: list, shared: bool) -> float:
    """The median of measured / predicted over the measured trials predicted across the workers line (with
    loader workers from a trial without, or the reverse), oriented as a config with workers; 1 where none."""
    misses = []
    for other, rates in measured:
        if other == knobs or "samples_per_s" not in rates:
            continue
        base = _base(other, [(r, x) for r, x in diagnosed if _loads(r) != _loads(other)], shared)
        if base:
            miss = rates["samples_per_s"] / base[0]
            misses.append(miss if _loads(other) else 1 / miss)
    return statistics.median(misses) if misses else 1.0


def predict(
    knobs: dict[str, Any],
    measured: list[tuple[dict[str, Any], dict[str, float]]],
    shared: bool = False,
    learn: bool = True,
) -> dict[str, Any] | None:
    """The predicted throughput of `knobs` from the measured trials (`measured`:
    their knobs and `rates_of`, or {"samples_per_s"} for a trial not diagnosed):
    {"samples_per_s", "from": the knobs of the diagnosed trial it came from}, or
    None when the model cannot say. `shared`: a CPU device, whose cores the
    loader workers share with the compute. `learn`: the workers' correction
    (without it and `shared`: the model before both, scripts/bench/bench_model.py)."""
    diagnosed = [(k, r) for k, r in measured if "compute_ceiling_samples_per_s" in r]
    base = _base(knobs, diagnosed, shared)
    if base is None:
        return None
    value, ref = base
    if learn and _loads(knobs) != _loads(ref):
        miss = _workers_miss(knobs, measured, diagnosed, shared)
        value *= miss if _loads(knobs) else 1 / miss
    return {"samples_per_s": value, "from": ref}


def error(rows) -> dict[str, Any] | None:
    """The model's error over the trials it predicted (`rows`: trial number,
    predicted and measured samples/s): measured / predicted - 1, its median
    size and the worst trial; None where it predicted none."""
    pairs = [(n, p, m) for n, p, m in rows if p and m]
    if not pairs:
        return None
    errs = sorted(((m / p - 1, n) for n, p, m in pairs), key=lambda e: abs(e[0]))
    return {
        "trials": len(pairs),
        "median_abs_error": round(abs(errs[len(errs) // 2][0]), 4),
        "worst_error": round(errs[-1][0], 4),
        "worst_trial": errs[-1][1],
        "per_trial": [[n, round(p, 1), round(m, 1)] for n, p, m in pairs],
    }
