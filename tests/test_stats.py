"""The statistics a window and a search decide by (autotune.stats), on known samples: exact figures."""

import math

import pytest

from autotune import stats


def test_a_ten_step_window_is_judged_by_students_t():
    # 10 steps of 10 ms +- 0.2: the normal CI is +-1.31%, Student's t (9 df) +-1.51%
    times = [10.2, 9.8] * 5
    assert stats.rel_ci95(times) == pytest.approx(0.01307, abs=1e-4)
    assert stats.t_rel_ci95(times) == pytest.approx(0.01307 * 2.262 / 1.96, abs=1e-4)
    assert stats.t_rel_ci95([10.0] * 40 + [11.0] * 40) == stats.rel_ci95([10.0] * 40 + [11.0] * 40)  # 30 on: 1.96
    assert stats.t_rel_ci95([10.0, 11.0, 12.0, 10.5]) == pytest.approx(
        stats.rel_ci95([10.0, 11.0, 12.0, 10.5]) * 3.182 / 1.96
    )
    assert stats.t_rel_ci95([10.0, 11.0]) == math.inf  # two steps: no interval
    assert stats.rel_ci95([10.0, 10.0, 10.0]) == 0.0


def test_a_window_sized_by_its_lead_takes_a_quarter_of_it_between_the_floor_and_the_cap():
    assert stats.gap_ci(0.33, 0.04) == pytest.approx(0.0825) and stats.gap_ci(3.0, 0.04) == stats.GAP_CI_CAP
    assert stats.gap_ci(0.05, 0.04) == 0.04


def test_on_a_cpu_the_incumbent_is_known_no_better_than_the_spread_between_processes():
    """Two trials are two fresh processes: on a 2-core CPU host those of one config differ by a CV of 5-18%,
    whatever their windows' CIs (scripts/bench/bench_window.py); on a GPU none is assumed (not measured). The spread
    is compared with 95% CIs, so it is one too: 1.96 x the smallest CV."""
    spread = stats.PROCESS_SPREAD["cpu"]
    assert stats.incumbent_interval(0.02, "cpu") == spread == 0.098 == round(1.96 * stats.PROCESS_CV["cpu"], 3)
    assert stats.incumbent_interval(0.12, "cpu") == 0.12 and stats.incumbent_interval(0.02, "cuda") == 0.02
    # nor need a promoted window (or the anchor) know its mean better than that: the next windows are compared
    # with it to within the spread anyway
    assert stats.promote_floor(0.02, "cpu") == 0.098 and stats.promote_floor(0.06, "cpu") == stats.PROMOTE_FACTOR * 0.06
    assert stats.promote_floor(0.02, "cuda") == stats.PROMOTE_FACTOR * 0.02


def test_a_percentile_is_read_between_the_two_nearest_values():
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert stats.percentile([1.0, 2.0, 3.0, 4.0, 10.0], 0.95) == pytest.approx(8.8)
    assert stats.percentile([7.0], 0.95) == 7.0
