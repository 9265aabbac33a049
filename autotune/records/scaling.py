"""Scaling efficiency of a multi-rank search: global samples/s of N ranks over
N x the samples/s of the same config on one rank.

Where the one-rank number comes from: the baseline trial of an N-rank search
measures its own knobs once more on one rank, right after its N-rank window, on
the same reservation (the trial's node; rank 0's node when spread): the
search's *scaling reference*, recorded with the baseline (its metric
`scaling_reference_samples_per_s`, its files under the baseline's trial dir in
scaling-reference/), never a candidate. Every N-rank trial whose knobs match the
baseline's, all but the ones that only act across ranks (DDP and FSDP
arguments, which a single rank does not use), gets `scaling_efficiency`; a trial
that changes anything else (batch size, precision, ...) gets none, since its
one-rank rate was not measured.

Needs neither torch nor Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from autotune.knobs._registry import ACROSS_RANKS, KNOBS  # ACROSS_RANKS: the DDP/FSDP knobs, unused by one rank
from autotune.trial.result import ScalingReference, TrialResult

REFERENCE = "scaling_reference_samples_per_s"
EFFICIENCY = "scaling_efficiency"
REFERENCE_DIR = "scaling-reference"


def one_rank(request: dict[str, Any], rank_threads: int | None) -> dict[str, Any]:
    """The same trial on one rank with one rank's threads (`rank_threads`: what
    each rank ran when the ranks shared a node, autotune.trial.ranks; None: torch's
    default), the window alone (no profile, diagnosis, parity or pruning)."""
    # the knobs that act across ranks at their defaults: one rank has no all-reduce to tune
    knobs = {**request["knobs"], **{k: KNOBS[k].pytorch_default for k in ACROSS_RANKS if k in request["knobs"]}}
    if rank_threads and knobs.get("num_threads") is None:
        knobs["num_threads"] = rank_threads
    return {
        **request,
        "knobs": knobs,
        "ranks": 1,
        "profile_steps": 0,
        "trace_path": None,
        "diagnose": False,
        "parity": None,
        "prune_below": None,
        "incumbent_above": None,
    }


def with_reference(
    result: TrialResult,
    request: dict[str, Any],
    run: Callable[[dict, Path], TrialResult],
    trial_dir: Path,
    rank_threads: int | None = None,
) -> TrialResult:
    """An N-rank trial's result with the scaling reference measured after it
    (`run(config, dir)` runs one trial there): the reference's rate and status
    in `scaling_reference`, and, when both ran, the metrics REFERENCE and EFFICIENCY."""
    ranks = result.metric("ranks") or 1
    if ranks < 2 or result.status != "ok":
        return result
    ref = run(one_rank(request, rank_threads), Path(trial_dir) / REFERENCE_DIR)
    rate = ref.metric("samples_per_s")
    result.scaling_reference = ScalingReference(ref.status, rate, ref.knobs, ref.trial_wall_s, ref.error)
    if ref.ok and rate:
        result.add_derived(**{REFERENCE: rate, EFFICIENCY: result.metrics["samples_per_s"] / (ranks * rate)})
    return result


def add_efficiency(record, baseline) -> None:
    """A trial record's scaling efficiency against the baseline record's scaling
    reference, where its knobs match the baseline's but for ACROSS_RANKS."""
    reference = (baseline.metrics if baseline else {}).get(REFERENCE)
    ranks, rate = record.metrics.get("ranks", 1), record.metrics.get("samples_per_s")
    if not reference or ranks < 2 or not rate or EFFICIENCY in record.metrics:
        return
    knobs, base = record.knobs, baseline.knobs
    if all(knobs.get(k) == base.get(k) for k in set(knobs) | set(base) if k not in ACROSS_RANKS):
        record.add_derived(**{EFFICIENCY: rate / (ranks * reference)})
