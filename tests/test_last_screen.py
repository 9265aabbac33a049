"""The end of a search as a person reads it (autotune.export.answer, autotune.cli.report): the last screen of
finished run dirs (real searches on this 2-core CPU, kept in tests/fixtures/runs: the quickstart's, its re-run
whose pairs all ran under load, a program's, a tie, a failed baseline), rendered at 80 and 120 columns and
compared with the text stored in tests/snapshots; the issue's bars on it at 100 columns; `autotune report`
holding everything that left the screen; the live view's lines (autotune.cli.live, printing through the last
screen's console).

A change to the wording is a change to a snapshot: `AUTOTUNE_SNAPSHOTS=update pytest tests/test_last_screen.py`
writes them again, for review."""

import io
import itertools
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from autotune.cli import live as L
from autotune.cli import report as R
from autotune.export import analysis
from autotune.records.run_dir import read_run
from tests.conftest import fixture_run

SNAPSHOTS = Path(__file__).parent / "snapshots"
RUNS = ("quickstart", "quickstart_unknown", "program", "tie", "failed_baseline")
BOX = set("┏┃┡│└━┳╇┻┴┬─")  # a table's rows and borders (its lines may be as wide as the table needs)


def rendered(monkeypatch, width: int, show) -> str:
    """What `show()` prints to a terminal `width` columns wide, stdout and stderr in the order printed."""
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, highlight=False, soft_wrap=True)
    monkeypatch.setattr(R, "console", console)
    monkeypatch.setattr(R, "err_console", console)
    show()
    return out.getvalue()


def last_screen(run: Path, width: int, monkeypatch) -> str:
    result = read_run(run)
    return rendered(monkeypatch, width, lambda: R.summary(result))


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("name", RUNS)
def test_the_last_screen_reads_as_stored(name, width, tmp_path, monkeypatch):
    text = last_screen(fixture_run(name, tmp_path, monkeypatch), width, monkeypatch)
    stored = SNAPSHOTS / f"last_screen-{name}-{width}.txt"
    if os.environ.get("AUTOTUNE_SNAPSHOTS") == "update":
        stored.parent.mkdir(exist_ok=True)
        stored.write_text(text)
    assert text == stored.read_text()


@pytest.mark.parametrize("name", RUNS)
def test_the_last_screen_at_100_columns_meets_the_bars(name, tmp_path, monkeypatch):
    """Bar `last-screen` (issue 54; before: the quickstart's 48 lines, 6 over 100 characters, no command): at
    most 30 lines after the last trial's (the search's "re-measuring ..." line counted where it re-measured), the
    answer and the command that runs it in the screen's first 5 lines, no line over 100 characters outside the
    table."""
    run = fixture_run(name, tmp_path, monkeypatch)
    screen = last_screen(run, 100, monkeypatch).splitlines()
    after_the_trials = (["re-measuring the best against the baseline: ..."] if read_run(run).confirm else []) + screen
    assert len(after_the_trials) <= 30, screen
    assert [line for line in screen if len(line) > 100 and line[:1] not in BOX] == []
    first = "\n".join(screen[:5])
    if name == "failed_baseline":  # no answer: why, and the log that says more
        assert "no answer: the baseline was not measured" in first and "its log: run/trials/0000/trial.log" in first
    else:
        assert screen[0] == "" and screen[1].startswith(("speedup", "a tie", "no config")), screen[:2]
        assert "best config: " in first and "run it: " in first, screen[:6]


def test_the_answer_names_the_changes_the_range_the_safety_and_the_command(tmp_path, monkeypatch):
    from autotune.export import answer as A

    answer = A.of(read_run(fixture_run("quickstart", tmp_path, monkeypatch)))
    assert answer.headline() == [
        "speedup: 1.44x samples/s (1.34-1.53x, 2 pairs side by side); loss parity passed",
        "best config: batch_size=64 (dynamics: learning rate x2), precision=bf16-mixed (numerics)",
    ]
    assert answer.command == 'cfg = autotune.load_config("run/best_config.yaml")'
    assert answer.trust == (
        "3 pairs ran under outside load (other processes took 43-49% of the CPU): not counted",
        "the baseline re-measured +18% off the 4,450 samples/s every trial was compared with",
    )


def test_a_programs_command_runs_it_under_autotune_run_with_the_best_flags(tmp_path, monkeypatch):
    from autotune.export import answer as A

    run = fixture_run("program", tmp_path, monkeypatch)
    command = (
        "autotune run run/best_config.yaml -- python memmap_loop.py --data data.bin --max_iters 400 --batch_size 16"
    )
    assert A.of(read_run(run)).command == command
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # started from another dir: the program's own, by name
    assert A.of(read_run(run)).command == f"cd {tmp_path} && {command}"  # the config's path from there
    assert A.of(read_run(run), absolute=True).command == A.of(read_run(run)).command  # MLflow's: the same


def test_numbers_outside_the_tables_have_3_significant_figures():
    from autotune.records.verdicts import sig

    assert [sig(v) for v in (8187.6, 4447.15, 1.436, 1.0, 0.0394, 99.96, 245123.0)] == [
        "8,190",
        "4,450",
        "1.44",
        "1.00",
        "0.0394",
        "100",
        "245,000",
    ]


def with_compile(result):
    """The quickstart's search as though its best had been compiled (no compile knob was searched there): the
    compile times' line."""
    result.best.knobs["compile"] = "default"
    result.best.metrics["first_step_s"] = 27.7
    result.baseline.metrics["first_step_s"] = 0.8
    return result


# what left the last screen, each item with a text `autotune report` shows (text and markdown) and its JSON key
LEFT_THE_SCREEN = {
    "the baseline's diagnosis": ("baseline: input-bound", "baseline"),
    "the best's diagnosis": ("best: input-bound", "best"),
    "the diagnoses' evidence": ("two sides apart: compute ceiling 4714 samples/s", "baseline"),
    "the diagnoses' advice": ("try: more DataLoader workers (num_workers=0 now, about 1 needed)", "baseline"),
    "per-knob effects": ("32: 4447 (3), 64: 2726 (6, 5 pruned)", "knob_effects"),
    "the rate model's error": ("rate model: 4 trial(s) predicted, median error 46%", "rate_model"),
    "pruned trials": ("6 trial(s) pruned: stopped early, clearly below the best, saving about 17.0 s", "pruning"),
    "disturbed trials": ("#7: other processes used 70% of the host's CPU time during the window", "disturbed"),
    "the break-even arithmetic": (
        "break-even: the search (70 s) pays for itself after 19,040 training steps of batch 64",
        "break_even",
    ),
    "the re-measurement in full": ("2 interleaved rounds in fresh processes: 1.44x (pairs 1.34-1.53x)", "confirm"),
    "the safety classes' notes": ("dynamics: batch_size 32 -> 64: changes optimization", "safety"),
    "the batch advice": ("the batch grows 2x: consider scaling the learning rate by 2", "batch"),
    "configs not run": (
        "not run: workers=1 batch=64 precision=bf16-mixed, skipped: predicted 6521.3",
        "skipped_predicted",
    ),
    "why the search ended": ("search ended: 10 trials", "ended"),
    "the files": ("trials_csv", "files"),
}


def reported(result, monkeypatch) -> tuple[str, str, dict]:
    """`autotune report`'s three forms (text at 100 columns, whitespace folded; markdown; JSON)."""
    text = " ".join(rendered(monkeypatch, 100, lambda: R.report(result)).split())
    markdown = " ".join(re.sub(r"\*\*|`", "", R.as_markdown(result)).split())  # as read, not as marked up
    return text, markdown, json.loads(json.dumps(analysis.as_dict(result), default=str))


def test_autotune_report_shows_everything_that_left_the_screen(tmp_path, monkeypatch):
    run = fixture_run("quickstart", tmp_path, monkeypatch)
    screen = " ".join(last_screen(run, 100, monkeypatch).split())
    text, markdown, data = reported(read_run(run), monkeypatch)
    for item, (says, key) in LEFT_THE_SCREEN.items():
        assert says not in screen, item  # it left the screen ...
        assert says in text, item  # ... and `autotune report` shows it
        assert says in markdown, item
        assert data[key], item  # ... and its JSON holds it
    assert text.startswith(screen.split(" baseline vs best ")[0])  # the report: the screen, then the rest
    text, markdown, data = reported(with_compile(read_run(run)), monkeypatch)
    says = "compile=default (trial #4): first step after 27.7 s (baseline, eager: 0.800 s), then 8,190 samples/s"
    assert says in text and says in markdown and data["compile"][0]["first_step_s"] == 27.7
    assert "compile=" not in screen


def test_failed_trials_are_in_the_report(tmp_path, monkeypatch):
    run = fixture_run("failed_baseline", tmp_path, monkeypatch)
    result = read_run(run)
    text = " ".join(rendered(monkeypatch, 100, lambda: R.report(result)).split())
    says = "#0 error (ValueError: Expected input batch_size (2) to match target batch_size (8).)"
    assert f"1 trial(s) failed: {says}" in text
    assert says.replace(" (", ": ", 1).rstrip(")") in R.as_markdown(result).replace("\n", " ")


def test_a_ten_trial_live_view_is_ten_lines_and_the_incumbents_changes(tmp_path, monkeypatch):
    """-q (and a log): one line per trial; the incumbent on the line of the trial that made it the incumbent."""
    result = read_run(fixture_run("quickstart", tmp_path, monkeypatch))
    view = L.LiveView(quiet=True)

    def search():
        view.on_start(result.device, result.space, result.run_dir, n_trials=10)
        for record in sorted(result.records, key=lambda r: r.number):
            view.on_trial(record)

    lines = rendered(monkeypatch, 100, search).splitlines()
    trials = [line for line in lines if re.match(r"\[\d+/10\] trial ", line)]
    assert len(trials) == 10 and lines[-10:] == trials  # nothing between them
    assert [i for i, line in enumerate(trials) if "best so far" in line] == [3, 4]  # the two changes
    assert re.match(r"\[1/10\] trial   0 ok baseline  4,450 samples/s  \(0:0\d elapsed, ~\d:\d\d left\)$", trials[0])
    assert re.match(
        r"\[5/10\] trial   4 ok batch=64 precision=bf16-mixed  8,190 samples/s 1\.84x  best so far, loss parity passed  \(",
        trials[4],
    )


def test_an_unsettled_claim_gives_both_figures_why_and_the_command_never_one_number(tmp_path, monkeypatch):
    """Issue 64: the quickstart's run dir, its re-measurement made unsettled as `decide.confirm` leaves one whose
    pairs disagreed with the search's reads twice (its own pairs, taken again); the last screen, the report (text,
    markdown, JSON) and best_config.yaml say both figures, why, and `autotune confirm RUN_DIR`; no single speedup."""
    from autotune.decide import confirm as C
    from autotune.export import answer as A
    from autotune.export import best_config as E

    run = fixture_run("quickstart", tmp_path, monkeypatch)
    state = json.loads((run / "search.json").read_text())
    first = state["confirm"]
    why = "the baseline read 3,500 samples/s side by side, -21% off the 4,450-4,460 it read in the search"
    state["confirm"] = {
        "baseline_trial": 0,
        "best_trial": first["best_trial"],
        **C.unsettled(first, first, f"{why}; taken again 10 s apart: {why}", C.SAMPLES),
    }
    (run / "search.json").write_text(json.dumps(state))
    result = read_run(run)
    assert result.speedup is None and result.best.number == first["best_trial"]
    from autotune.spec import load
    from autotune.plan import SearchPlan

    plan = SearchPlan.of(load(Path(__file__).parents[1] / "search_spaces" / "examples" / "quickstart.yaml"))
    E.write_best_config(result, run / "best_config.yaml", E.ExportSettings.of(plan))
    answer = A.of(result)
    head = answer.headline()[0]
    x = A._x(result.search_speedup)  # (a run dir from before the figures' intervals: its trials' ratio, no interval)
    assert result.search_interval is None and head.startswith(f"speedup unsettled: {x} in the search, 1.34-1.53x in 4")
    assert answer.trust[:2] == (
        f"unsettled: {why}; taken again 10 s apart: {why}",
        "re-measure it on a quiet host: autotune confirm run",
    )
    screen = last_screen(run, 100, monkeypatch)
    assert "autotune confirm run" in screen and "speedup: " not in screen and "1.44x" not in screen
    text, markdown, data = reported(result, monkeypatch)
    assert data["speedup_x"] is None and data["speedup_unsettled"].startswith(why)
    assert "unsettled: side by side in fresh processes, 1.34-1.53x over 4 pairs" in markdown
    best = yaml.safe_load((run / "best_config.yaml").read_text())
    assert best["measured"]["speedup_x"] is None and best["measured"]["unsettled"]["pairs"] == 4
    assert best["measured"]["unsettled"]["command"] == f"autotune confirm {run}"
    python = E.render(best, "python")
    assert python.startswith(
        f"# autotune: speedup unsettled ({best['measured']['trials_speedup_x']}x in the search, 1.34-"
    )


@pytest.mark.parametrize("name", ("quickstart", "program", "tie"))
def test_the_markdown_report_draws_the_screens_table(name, tmp_path, monkeypatch):
    """A README walk: where the baseline kept its place in a tie, the markdown report's table had no knob rows (the
    screen's has the tied config's changes); both tables draw the same rows now (`report._evidence`)."""
    result = read_run(fixture_run(name, tmp_path, monkeypatch))
    d = analysis.as_dict(result)
    lines = R.as_markdown(result).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| | baseline (#"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2 :]))  # to the table's end
    assert len(rows) == len(R._evidence(d, R.ROWS, result.user_knobs))
    flags = analysis.table_flags(d, result.user_knobs)
    assert flags or name != "tie"
    for flag in flags:
        assert any(row.startswith(f"| {flag['knob']} ({flag['safety']}) | ") for row in rows), rows
    assert rows[-1].startswith("| **speedup** | 1.00x | ")
