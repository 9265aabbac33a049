"""The live view of a search while it runs: a program's probe first (its one run before the trials: a phase with
its elapsed time), then a table of the trials that grows as they finish, a row for each running trial and the
incumbent under it; where the output is no terminal (`-q`, a CI log), a line as the probe starts and ends, and one
per finished trial, with the incumbent on the line of the trial that made it the incumbent. The search's last
screen is autotune.cli.report's.

It prints through the console the rest of the terminal's output goes through (`autotune.cli.report.console`, read
at each print): Rich's live display keeps what is printed between trials (`report.note`) above it, and whatever
swaps that console (a test capturing the output) captures the live view too."""

from __future__ import annotations

import math
import time

from rich.columns import Columns
from rich.console import Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from autotune import knobs as K
from autotune.cli import report
from autotune.cli.report import short
from autotune.execution.callbacks import SearchCallback
from autotune.records.verdicts import sig


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def _status(record) -> str:
    return {
        "ok": "[green]ok[/]",
        "pruned": "[cyan]pruned[/]",
        "oom": "[yellow]oom[/]",
        "timeout": "[yellow]timeout[/]",
    }.get(record.status, "[red]error[/]")


def _perf(r) -> str:
    """Throughput in its unit (a language model's tokens/s), also a pruned trial's (over its shortened window)."""
    value = r.measured
    return f"{value:.1f}" if value else (r.error_type or "")


def _figure(best, base) -> str:
    """The incumbent's speedup as the search states it (`TrialRecord.figure`), with its 95% interval: from its fresh
    reads once it was read again (what the side by side should reproduce), else its trial's own ratio."""
    if best is base:
        return "1.00x the baseline"
    figure = best.figure
    if not figure:
        return f"{best.throughput / base.throughput:.2f}x the baseline"
    interval = f"{figure['low']:.2f}-{figure['high']:.2f}" if figure.get("low") else ""
    said = "read again" if figure["confirmed"] else "its trial's; not read again yet"
    return f"{figure['x']:.2f}x the baseline ({interval}{', ' if interval else ''}{said})"


class LiveView(SearchCallback):
    """A table of trials that grows as they finish, with a row for each running
    trial (its knobs and how long it has run); a plain line per finished trial
    when quiet or when the output is not a terminal (CI logs): the knobs it changes from
    the baseline, its rate and gain, and the incumbent where it changed with this trial."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.rows = []
        self.running: dict[int, tuple[dict, float]] = {}  # trial number -> knobs, start (monotonic)
        self.live: Live | None = None
        self.searched: list[str] = []
        self.best = None
        self.baseline: dict = {}  # the baseline's knobs: a trial's line names what it changes
        self.user_knobs = K.UserKnobs()  # the search's user knobs (on_start), as declared: the best's safety words
        self.shown: tuple | None = None  # the incumbent the lines last named
        self.n_trials, self.budget_s, self.started = None, None, time.monotonic()
        self.capped = True  # the trial count can end the search (a cap of its own, not the space's size)
        self.probing: tuple[float, float] | None = None  # a program's probe: its start (monotonic), first-step limit

    def on_probe(self, running: bool, first_step_s: float) -> None:
        """A program's probe starts (`running`) or ends: its phase, its elapsed time, before the trials."""
        if running:
            self.probing = time.monotonic(), first_step_s
            if report.console.is_terminal and not self.quiet:
                self.live = Live(
                    get_renderable=self._probe_line, console=report.console, refresh_per_second=2, transient=True
                )
                self.live.start()
            else:
                report.console.print(self._probe_line(elapsed=False))
            return
        self.stop()
        report.console.print(f"probe: ended after {_clock(time.monotonic() - self.probing[0])}")
        self.probing = None

    def _probe_line(self, elapsed: bool = True) -> Text:
        started, limit = self.probing
        return Text(  # within 80 columns (a wider live line is cut)
            "probe: running your program once"
            + (f", {_clock(time.monotonic() - started)}" if elapsed else " at its own settings")
            + f" (a first step due within {_clock(round(limit))})"
        )

    def on_start(self, device, space, run_dir, n_trials=None, time_budget_s=None) -> None:
        self.searched = list(space.search)
        self.baseline = dict(space.baseline)
        self.user_knobs = K.UserKnobs.of(space.user)
        self.n_trials, self.budget_s, self.started = n_trials, time_budget_s, time.monotonic()
        # with a time budget and no cap of its own (n_trials left out: the space's points), the budget ends it
        self.capped = not (time_budget_s and n_trials and n_trials >= math.prod(map(len, space.search.values())))
        report.console.print(
            f"[bold]autotune[/] search on [cyan]{device.type}[/] ({device.name}, {device.cpus} CPUs) -> {run_dir}"
        )
        report.console.print("searching: " + ", ".join(f"{k} {space.search[k]}" for k in self.searched))
        unsearched = [n for n, why in space.fixed.items() if why == K.NOT_SEARCHED]
        if unsearched:
            report.console.print(
                "  [dim]not searched: " + ", ".join(f"{n}={K.shown(space.baseline[n])}" for n in unsearched) + "[/]"
            )
        for name, why in space.fixed.items():
            if name not in unsearched:
                report.console.print(f"  [dim]fixed {name}={K.shown(space.baseline[name])}: {why}[/]")
        for line in space.dropped:  # values of searched knobs left out, and a replaced baseline value
            if line.startswith("baseline ") or line.split("=", 1)[0] in space.search:
                report.console.print(f"  [yellow]not run: {line}[/]")
        if report.console.is_terminal and not self.quiet:
            self.live = Live(get_renderable=self._view, console=report.console, refresh_per_second=2)
            self.live.start()

    def on_trial_start(self, number: int, knobs: dict) -> None:
        self.running[number] = dict(knobs), time.monotonic()
        if self.live:
            self.live.update(self._view())

    def on_trial(self, record) -> None:
        self.running.pop(record.number, None)
        self.rows.append(record)
        # as the search judges (against the reference read near each trial's time: the figures move as it reads)
        self.best = max((r for r in self.rows if r.contends), key=lambda r: r.judged, default=None)
        if self.live:
            self.live.update(self._view())
        else:
            news = self._news(record)
            report.console.print(
                Text(f"{self._progress()} {self._line(record)}{news}" + ("" if self.budget_s else f"  ({self._eta()})"))
            )

    def _news(self, record) -> str:
        """The incumbent, where it changed since the last line named it: on the trial's own line."""
        from autotune.decide.checked import status
        from autotune.export.answer import changes_of, safety_words

        base = next((r for r in self.rows if r.is_baseline and r.throughput), None)
        if self.best is None or base is None:
            return ""
        key = (self.best.number, base.number)
        if key == self.shown:
            return ""
        self.shown = key
        words = safety_words(status(self.best, base), changes_of(self.best.knobs, base.knobs, self.user_knobs))
        if self.best is record:
            return "" if record.is_baseline else f"  best so far, {words}"
        return f"  best so far: trial #{self.best.number}, {sig(self.best.throughput / base.throughput)}x, {words}"

    def _incumbent(self) -> str:
        """The incumbent at this moment: its trial, gain and safety status
        (`autotune.decide.checked.status`: unchecked until its loss parity has run)."""
        from autotune.decide.checked import status

        base = next((r for r in self.rows if r.is_baseline), None)
        if self.best is None or base is None or not base.throughput:
            return "incumbent: none yet"
        return f"incumbent: trial #{self.best.number}, {_figure(self.best, base)}, {status(self.best, base)}"

    def on_match(self, line: str) -> None:
        report.remembered(line)

    def on_wait(self, why: str) -> None:
        report.waiting(why)

    def on_remeasure(self, note: str) -> None:
        report.note(note)

    def stop(self) -> None:
        if self.live:
            self.live.stop()
            self.live = None

    def _count(self) -> str:
        """The trials run, against the trial cap where one can end the search (`9/20`), never the space's size."""
        return f"{len(self.rows)}/{self.n_trials}" if self.capped and self.n_trials else f"{len(self.rows)}"

    def _progress(self) -> str:
        """A trial line's head: the count against what ends the search, `[9/20]` with a trial cap, `[9] 4:17 of
        5:00` with a time budget (both with both: the first reached ends it)."""
        budget = self.budget_s
        return f"[{self._count()}]" + (
            f" {_clock(time.monotonic() - self.started)} of {_clock(budget)}" if budget else ""
        )

    def _eta(self) -> str:
        """Elapsed, and time left: of the time budget, else the trials still to run at the pace so far."""
        elapsed = time.monotonic() - self.started
        left = None
        if self.budget_s:
            left = max(self.budget_s - elapsed, 0)
        elif self.rows and self.n_trials:
            left = elapsed / len(self.rows) * (self.n_trials - len(self.rows))
        return f"{_clock(elapsed)} elapsed" + (f", ~{_clock(left)} left" if left is not None else "")

    def _view(self):
        done, elapsed = len(self.rows), time.monotonic() - self.started
        bar = (
            ProgressBar(total=self.budget_s, completed=min(elapsed, self.budget_s), width=40)
            if self.budget_s
            else ProgressBar(total=self.n_trials or 1, completed=done, width=40)
        )
        running = f", {len(self.running)} running" if self.running else ""
        status = Text(f" {self._count()} trials{running}, {self._eta()}")
        return Group(self._table(), Columns([bar, status]), Text(self._incumbent()))

    def _line(self, r) -> str:
        """A finished trial in one line: what it changes from the baseline, its rate, its gain."""
        changed = [k for k in self.searched if not self.baseline or r.knobs[k] != self.baseline.get(k)]
        knobs = " ".join(f"{short(k)}={K.shown(r.knobs[k])}" for k in changed) or "the baseline's knobs"
        value = r.measured  # in its unit (trial.result.unit_of: a language model's tokens/s)
        perf = f"{sig(value)} {r.unit.label}" if value else f"{r.error_type}: {r.error}"
        speed = f" {sig(r.speedup)}x" if r.speedup and not r.is_baseline else ""
        by = f" (chosen by {r.info['chosen_by']})" if r.info.get("chosen_by") else ""  # the measurement behind it
        return f"trial {r.number:3d} {r.status} " + ("baseline" if r.is_baseline else knobs) + f"{by}  {perf}{speed}"

    def _table(self) -> Table:
        table = Table(title="trials", title_justify="left")
        table.add_column("#", justify="right")
        table.add_column("status")
        for k in self.searched:
            table.add_column(short(k))
        # the search's unit, as its first measured trial says (trial.result.unit_of): a language model's tokens/s
        table.add_column(next((r.unit.label for r in self.rows if r.measured), "samples/s"), justify="right")
        table.add_column("speedup", justify="right")
        table.add_column("best so far", justify="right")
        best = None
        for r in self.rows:
            if r.throughput and (best is None or r.throughput > best):
                best = r.throughput
            table.add_row(
                f"{r.number}" + ("*" if r.is_baseline else ""),
                _status(r),
                *(K.shown(r.knobs[k]) for k in self.searched),
                _perf(r),
                f"{r.speedup:.2f}x" if r.speedup else "",
                f"{best:.1f}" if best else "",
            )
        now = time.monotonic()
        for number, (knobs, started) in sorted(self.running.items()):
            table.add_row(
                f"{number}",
                f"[blue]running {_clock(now - started)}[/]",
                *(K.shown(knobs.get(k, "")) for k in self.searched),
                "",
                "",
                "",
            )
        return table
