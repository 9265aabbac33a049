"""What a search decided, read back from its run dir (autotune.records.verdicts)."""

import subprocess
import sys

import pytest

from autotune.records.verdicts import break_even


def test_break_even_weighs_the_search_against_the_per_step_saving():
    # the winner: 100 samples a step at 1000 samples/s, 0.1 s; the baseline 1.5x that: 50 ms saved a step
    b = break_even(600.0, 1.5, 1000.0, 100)
    assert (b["saved_ms_per_step"], b["steps"], b["hours"]) == (50.0, 12_000, pytest.approx(1 / 3, abs=1e-4))
    assert b["note"] == (
        "the search (10.0 min) pays for itself after 12,000 training steps of batch 100, 20.0 min of "
        "training at the best config's 1,000 samples/s (it saves 50 ms a step, 1.50x)"
    )
    assert break_even(7200.0, 1.02, 500.0, 32)["hours"] == pytest.approx(100.0)  # a 2% gain takes 50x the search
    assert break_even(600.0, 1.5, 1000.0, 100)["steps"] * 0.05 >= 600.0 > (12_000 - 1) * 0.05
    slower = break_even(600.0, 0.97, 1000.0, 100)
    assert slower["steps"] is None and slower["hours"] is None
    assert slower["note"] == (
        "never pays back: the best config is not faster than the baseline (0.97x), so no training step saves anything"
    )
    assert break_even(600.0, 1.0, 1000.0, 100, changed=False)["note"].startswith(
        "never pays back: the best config is the baseline's own"
    )
    assert break_even(600.0, None, None, 100) is None  # no measured baseline: nothing to weigh


def test_reading_a_run_dir_imports_nothing_of_the_search(finished_run):
    """records reads back what the search stored and decided: `read_run`, its best and break-even, and where
    its best_config was exported, in a process that never imports autotune.decide."""
    run_dir, _ = finished_run
    code = (
        "import sys\n"
        "from autotune.records.run_dir import read_run\n"
        f"r = read_run({str(run_dir)!r})\n"
        # no break-even where the speedup is unknown (the pairs ran under outside load) or unsettled (far off twice)
        "assert r.best is not None and (r.break_even is not None or r.speedup_unknown or r.speedup_unsettled)"
        " and r.best_config_path is not None\n"
        "print(sorted(m for m in sys.modules if m.startswith('autotune.decide')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
