"""Rates with their uncertainty: confidence intervals, Student's t, the spread between fresh processes, and the
intervals a search compares a window with the incumbent to (the incumbent's, a promoted window's, a window sized by
the lead it must show).

The standard library only (no torch): the trial's windows (`autotune.trial.measure`), the online loader tuner, the
decisions (`autotune.decide.confirm`) and the benchmarks read them from here.
"""

import math


def percentile(sorted_values: list[float], q: float) -> float:
    i = (len(sorted_values) - 1) * q
    lo, hi = math.floor(i), math.ceil(i)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (i - lo)


Z95 = 1.96  # the normal distribution's two-sided 95% quantile


def rel_ci95(xs: list[float]) -> float:
    """Half-width of the 95% confidence interval of the mean, relative to the mean."""
    n = len(xs)
    if n < 3:
        return math.inf
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return Z95 * std / math.sqrt(n) / mean


# Student's t, two-sided 95%, by degrees of freedom (a short window's CI; Z95 from 30 on)
T95 = {
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    21: 2.080,
    22: 2.074,
    23: 2.069,
    24: 2.064,
    25: 2.060,
    26: 2.056,
    27: 2.052,
    28: 2.048,
    29: 2.045,
}


def t_rel_ci95(xs: list[float]) -> float:
    """rel_ci95 with Student's t for a short window (10 steps: 2.26, not 1.96)."""
    df = len(xs) - 1
    return rel_ci95(xs) * T95.get(df, Z95) / Z95  # rel_ci95: inf below 3 values


PROMOTE_FACTOR = 2.0  # a window that clearly beats the incumbent stops at +-2x target_ci (WindowRule.promote_ci) ...
GAP_CI_CAP = 0.10  # ... or looser where its lead is large, never looser than this (2 cores: 5-10% per process)
# How far one fresh process's read of a config may be from the next's, beyond any window's own CI: on a 2-core
# CPU host the CV (one standard deviation) over fresh processes was 4.6-8.5% (jpeg_pipeline) and 5.2-17.6%
# (tiny_cnn) (scripts/bench/bench_window.py), and a baseline re-measured 16-18% off its trial's read. The smallest CV
# measured, on a GPU none (not measured yet).
PROCESS_CV = {"cpu": 0.05}
# ... as a 95% half-width, the unit of every window's CI (step_mean_ci95): 1.96 x the CV. Two trials are two
# processes, so the search compares a window with the incumbent to within at least this
# (`incumbent_interval`): a window need not be known better than that, nor can a lead inside it promote.
# (Until session 34 the CV itself stood here, compared with 95% CIs: windows ran ~4x the steps that matched
# the spread; jpeg_pipeline's anchor ran its 30-s cap for +-5.2%, then read 17% off in the confirm.)
PROCESS_SPREAD = {d: round(Z95 * cv, 3) for d, cv in PROCESS_CV.items()}


def incumbent_interval(ci: float, device_type: str) -> float:
    """The incumbent's throughput as a window is compared with it: its own
    relative 95% CI, and at least the spread between fresh processes
    measured on such a device (PROCESS_SPREAD)."""
    return max(ci, PROCESS_SPREAD.get(device_type, 0.0))


def promote_floor(target_ci: float, device_type: str) -> float:
    """How well a window that beats the incumbent must know its own mean (WindowRule.promote_ci), and the
    anchor its own: PROMOTE_FACTOR x target_ci, and never tighter than PROCESS_SPREAD on such a device, to
    within which every later window is compared with it anyway (`incumbent_interval`). On jpeg_pipeline
    (2 CPUs, bf16 steps varying 15%) promoted windows ran 40-50 steps (20-22 s) to reach +-4%."""
    return max(PROMOTE_FACTOR * target_ci, PROCESS_SPREAD.get(device_type, 0.0))


def gap_ci(gap: float, floor: float) -> float:
    """A window sized by its decision: its mean to within a quarter of `gap` (the relative lead: 1.2x, +-5%),
    between `floor` and GAP_CI_CAP. Two such means are off by at most half the gap together (95% each), so
    the lead is not the windows' noise (the promoted window's, and confirm.window_ci)."""
    return max(floor, min(GAP_CI_CAP, gap / 4))
