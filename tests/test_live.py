"""The live view of a search (autotune.cli.live): the table's row for a running trial, the incumbent under the
table at each moment, and the count of trials and the time left against a budget. Its lines over a real search's
trials (`-q`, a log) are test_last_screen's."""

import dataclasses

from rich.console import Console

from autotune.cli.live import LiveView
from tests.test_report import _records


def test_the_live_table_shows_the_running_trial():
    view = LiveView(quiet=True)
    view.searched = ["batch_size", "channels_last"]
    records = _records()
    view.on_trial(records[0])
    view.on_trial_start(1, records[1].knobs)
    render = Console(width=200, record=True)
    render.print(view._table())
    lines = render.export_text().splitlines()
    assert "│  1 │ running 0:00 │ 32    │ on      │           │" in lines[-2], lines
    assert view._incumbent() == "incumbent: trial #0, 1.00x the baseline, baseline"
    view.on_trial(records[1])  # finished: its row is the result, no longer a running row
    render.print(view._table())
    assert "running" not in render.export_text()
    # the incumbent at every moment: its gain, and its safety status (channels_last: no parity verdict yet)
    assert view._incumbent() == "incumbent: trial #1, 1.50x the baseline, unchecked"
    records[1].parity = {"passed": True}
    assert view._incumbent() == "incumbent: trial #1, 1.50x the baseline, parity passed"
    # a faster window that tied with it, of a riskier config, left it the incumbent (Strategy._best): so says the view
    tied = dataclasses.replace(
        records[1],
        number=2,
        metrics={**records[1].metrics, "samples_per_s": 2.0 * records[1].throughput, "tie_kept": 1.0},
    )
    view.on_trial(tied)
    assert view._incumbent() == "incumbent: trial #1, 1.50x the baseline, parity passed"


def test_with_a_time_budget_the_live_view_counts_down_the_budget_and_the_trials():
    view = LiveView(quiet=True)
    view.searched = ["batch_size", "channels_last"]
    view.n_trials, view.budget_s = 384, 300.0  # a budget and a trial count: the first reached ends the search
    view.started -= 60.5  # a minute into the search
    view.on_trial(_records()[0])
    assert view._count() == "1/384" and view._eta() == "1:00 elapsed, ~3:59 left"
    render = Console(width=200, record=True)
    render.print(view._view())
    assert "1/384 trials, 1:00 elapsed, ~3:59 left" in render.export_text()
    assert view._progress() == "[1/384] 1:00 of 5:00"  # a trial's line: the count against what ends the search
    view.budget_s = None  # no budget: the trials left at the pace so far (383 more at a minute each)
    assert view._count() == "1/384" and view._eta().startswith("1:00 elapsed, ~38")
    assert view._progress() == "[1/384]"


def test_a_budget_without_a_cap_of_its_own_counts_the_trials_against_the_clock_not_the_spaces_size():
    """`autotune search --budget 5m -- python clm.py`: n_trials left out, the space's 41472 points cap nothing
    the budget does not (it read `[9/41472]`: issue 62)."""
    from autotune import knobs as K

    view = LiveView(quiet=True)
    space = K.Space(baseline={}, search={"a": list(range(96)), "b": list(range(432))}, fixed={}, dropped=[])
    view.on_start(K.Device("cpu", 2), space, "runs/x", n_trials=41472, time_budget_s=300.0)
    view.started -= 257.2
    for r in _records()[:1] * 9:
        view.rows.append(r)
    assert view._progress() == "[9] 4:17 of 5:00" and view._count() == "9"


def test_a_programs_probe_is_a_phase_with_its_elapsed_time_before_the_trials(monkeypatch):
    import io

    from autotune.cli import report

    out = io.StringIO()
    monkeypatch.setattr(report, "console", Console(file=out, width=200, color_system=None))
    view = LiveView(quiet=True)  # -q, a log: a line as it starts and as it ends
    view.on_probe(True, 120.0)
    view.probing = (view.probing[0] - 65.2, 120.0)  # a minute into it
    # a terminal's live line instead, counting up (within 80 columns)
    assert view._probe_line().plain == "probe: running your program once, 1:05 (a first step due within 2:00)"
    view.on_probe(False, 120.0)
    assert out.getvalue().splitlines() == [
        "probe: running your program once at its own settings (a first step due within 2:00)",
        "probe: ended after 1:05",
    ]
    assert view.probing is None and view.live is None
