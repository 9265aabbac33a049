"""Everything the terminal shows: the live trial table and the final summary."""

from __future__ import annotations

import time
from pathlib import Path

from rich.columns import Columns
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from autotune import knobs as K
from autotune.decide import model as M
from autotune.records.verdicts import describe
from autotune.safety import levels as S

console = Console(highlight=False, soft_wrap=True)  # long lines stay whole in logs
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def short(name: str) -> str:
    """A knob's column label, from the registry."""
    return K.lookup(name).label


def error(message: str) -> None:
    """One line for the user, verbatim (square brackets in it are text, not markup)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}")


def waiting(message: str) -> None:
    """Why the search has not started yet (another search holds the device)."""
    err_console.print(f"[yellow]waiting:[/] {escape(message)}")


def note(message: str) -> None:
    """What the search is doing between trials."""
    console.print(f"[dim]{escape(message)}[/]")


def remembered(message: str) -> None:
    """An earlier search that asked the same (autotune.cache), named before the search starts."""
    err_console.print(f"[cyan]note:[/] {escape(message)}")


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "default"
    return str(value)


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


class LiveView:
    """A table of trials that grows as they finish, with a row for each running
    trial (its knobs and how long it has run); a plain line per finished trial
    when quiet or when the output is not a terminal (CI logs)."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.rows = []
        self.running: dict[int, tuple[dict, float]] = {}  # trial number -> knobs, start (monotonic)
        self.live: Live | None = None
        self.searched: list[str] = []
        self.best = None
        self.n_trials, self.budget_s, self.started = None, None, time.monotonic()

    def start(self, device, space, run_dir, n_trials=None, time_budget_s=None) -> None:
        self.searched = list(space.search)
        self.n_trials, self.budget_s, self.started = n_trials, time_budget_s, time.monotonic()
        console.print(
            f"[bold]autotune[/] search on [cyan]{device.type}[/] ({device.name}, {device.cpus} CPUs) -> {run_dir}"
        )
        console.print("searching: " + ", ".join(f"{k} {space.search[k]}" for k in self.searched))
        unsearched = [n for n, why in space.fixed.items() if why == K.NOT_SEARCHED]
        if unsearched:
            console.print(
                "  [dim]not searched: " + ", ".join(f"{n}={_fmt(space.baseline[n])}" for n in unsearched) + "[/]"
            )
        for name, why in space.fixed.items():
            if name not in unsearched:
                console.print(f"  [dim]fixed {name}={_fmt(space.baseline[name])}: {why}[/]")
        for line in space.dropped:  # values of searched knobs left out, and a replaced baseline value
            if line.startswith("baseline ") or line.split("=", 1)[0] in space.search:
                console.print(f"  [yellow]not run: {line}[/]")
        if console.is_terminal and not self.quiet:
            self.live = Live(get_renderable=self._view, console=console, refresh_per_second=2)
            self.live.start()

    def trial_started(self, number: int, knobs: dict) -> None:
        self.running[number] = dict(knobs), time.monotonic()
        if self.live:
            self.live.update(self._view())

    def trial(self, record) -> None:
        if record.contends and (not self.best or record.throughput > self.best.throughput):
            self.best = record
        self.running.pop(record.number, None)
        self.rows.append(record)
        if self.live:
            self.live.update(self._view())
        else:
            console.print(f"[{self._count()}] " + self._line(record) + f"  ({self._eta()})")
            console.print(f"  {self._incumbent()}")

    def _incumbent(self) -> str:
        """The incumbent at this moment: its trial, gain and safety status
        (`autotune.checked.status`: unchecked until its loss parity has run)."""
        from autotune.decide.checked import status

        base = next((r for r in self.rows if r.is_baseline), None)
        if self.best is None or base is None or not base.throughput:
            return "incumbent: none yet"
        gain = self.best.throughput / base.throughput
        return f"incumbent: trial #{self.best.number}, {gain:.2f}x the baseline, {status(self.best, base)}"

    def stop(self) -> None:
        if self.live:
            self.live.stop()
            self.live = None

    def _count(self) -> str:  # the trial count is a limit, with a time budget too (the first reached ends it)
        return f"{len(self.rows)}/{self.n_trials}"

    def _eta(self) -> str:
        """Elapsed, and time left: of the time budget, else the trials still
        to run at the pace so far."""
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
        knobs = " ".join(f"{short(k)}={_fmt(r.knobs[k])}" for k in self.searched)
        perf = f"{_perf(r):>9} {r.unit.label}" if r.status in ("ok", "pruned") else f"{r.error_type}: {r.error}"
        speed = f" x{r.speedup:.2f}" if r.speedup else ""
        return f"trial {r.number:3d} {_status(r):>6} {knobs}  {perf}{speed}" + (" (baseline)" if r.is_baseline else "")

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
                *(_fmt(r.knobs[k]) for k in self.searched),
                _perf(r),
                f"{r.speedup:.2f}x" if r.speedup else "",
                f"{best:.1f}" if best else "",
            )
        now = time.monotonic()
        for number, (knobs, started) in sorted(self.running.items()):
            table.add_row(
                f"{number}",
                f"[blue]running {_clock(now - started)}[/]",
                *(_fmt(knobs.get(k, "")) for k in self.searched),
                "",
                "",
                "",
            )
        return table


ROWS = (
    ("tokens/s", "tokens_per_s", "{:,.0f}"),  # a language model's unit leads (trial.result.unit_of)
    ("samples/s", "samples_per_s", "{:.1f}"),
    ("step time mean (ms)", "step_ms_mean", "{:.2f}"),
    ("step time min (ms)", "step_ms_min", "{:.2f}"),
    ("step time max (ms)", "step_ms_max", "{:.2f}"),
    ("step time p95 (ms)", "step_ms_p95", "{:.2f}"),
    ("step-time mean known to", "step_mean_ci95", "±{:.1%}"),
    ("data loader (% of step)", "dataloader_frac", "{:.1%}"),
    ("GPU busy (% of step)", "gpu_util_frac", "{:.0%}"),
    ("GPU util, NVML (%)", "gpu_util_nvml_pct", "{:.0f}"),
    ("tensor-core kernels (% of kernel time)", "tensor_core_frac", "{:.0%}"),
    ("peak memory (GiB)", "mem_peak_allocated_gib", "{:.2f}"),
    ("achieved TFLOP/s", "achieved_tflops", "{:.3g}"),
    ("MFU", "mfu", "{:.1%}"),
    ("scaling efficiency (vs 1 rank)", "scaling_efficiency", "{:.0%}"),
)


def _trial(r) -> dict | None:
    if r is None:
        return None
    return {"trial": r.number, "status": r.status, "knobs": r.knobs, "metrics": r.metrics, "diagnosis": r.diagnosis}


def as_dict(result, importance: dict | None = None) -> dict:
    """Everything the report says, as plain data (the JSON format; the text and
    markdown formats render this)."""
    from autotune.export.best_config import safety_flags
    from autotune.records.run_dir import pruning_savings, same_device

    base, best, unit = result.baseline, result.best, result.unit
    measured = [r for r in result.records if r.throughput]
    ok = [r for r in measured if same_device(base, r)]  # comparisons never mix device types
    # per-knob effects count pruned trials too, at the throughput of their shortened window
    seen = [r for r in result.records if r.measured and same_device(base, r)]
    effects = {}
    for knob, values in result.space.search.items():
        effects[knob] = []
        for value in values:
            group = [r for r in seen if r.knobs[knob] == value]
            ys = sorted(r.measured for r in group)
            effects[knob].append(
                {
                    "value": value,
                    "trials": len(ys),
                    "pruned": sum(r.status == "pruned" for r in group),
                    unit.key("median"): ys[len(ys) // 2] if ys else None,
                }
            )
    compared = base is not None and base.throughput and best is not None
    eager_first = base.metrics.get("first_step_s") if base else None
    compiled = [
        {
            "trial": r.number,
            "compile": r.knobs["compile"],
            "first_step_s": r.metrics.get("first_step_s"),
            "eager_first_step_s": eager_first,
            unit.metric: r.throughput,
        }
        for r in ok
        if r.knobs["compile"] != "none"
    ]
    return {
        "run_dir": str(result.run_dir),
        "unit": unit.name,  # what the throughputs below count (trial.result.unit_of): tokens, samples
        "device": {"type": result.device.type, "name": result.device.name, "cpus": result.device.cpus},
        "trials": len(result.records),
        "trials_ok": len(ok),
        "wall_s": result.wall_s,
        "stopped_reason": result.stopped_reason,
        "ended": result.ended,
        "pruning": pruning_savings(result.records),
        "compile": compiled,
        "baseline": _trial(base),
        "best": _trial(best),
        "tie": best.tie if best else None,
        "speedup_x": result.speedup if compared else None,  # re-measured side by side where it was
        "speedup_unknown": result.speedup_unknown if compared else None,  # why a re-measurement could not say
        "search_speedup_x": best.throughput / base.throughput if compared else None,  # the two trials' ratio
        "confirm": result.confirm,
        "break_even": result.break_even if compared else None,
        "knob_effects": effects,
        "importance": importance,
        "safety": safety_flags(best.knobs, base.knobs, best.parity) if compared else [],
        "unsafe": [
            {"trial": r.number, unit.metric: r.throughput, "reason": r.parity.get("reason")}
            for r in result.records
            if r.throughput and not r.safe
        ],
        "fixed": result.space.fixed,
        "other_devices": [
            {
                "trial": r.number,
                "device_name": r.info.get("device_name"),
                "host": r.info.get("host"),
                unit.metric: r.throughput,
            }
            for r in measured
            if not same_device(base, r)
        ],
        "failed": [
            {"trial": r.number, "status": r.status, "error_type": r.error_type, "error": r.error}
            for r in result.records
            if r.status not in ("ok", "pruned")
        ],
        "disturbed": [
            {"trial": r.number, "why": r.info["disturbed"]} for r in result.records if r.info.get("disturbed")
        ],
        "rate_model": M.error((r.number, r.metrics.get(unit.key("predicted")), r.measured) for r in result.records),
        "skipped_predicted": result.skipped,
        "replaced": [line.removeprefix("baseline ") for line in result.space.dropped if line.startswith("baseline ")],
    }


def _cells(d: dict, key: str, fmt: str) -> list[str] | None:
    trials = (d["baseline"], d["best"])
    if not any(key in t["metrics"] for t in trials):
        return None
    return [fmt.format(t["metrics"][key]) if key in t["metrics"] else "-" for t in trials]


def summary(result, importance: dict | None = None, show_paths: bool = True) -> None:
    """The terminal report: baseline vs best, speedup, per-knob effect, safety
    flags, diagnosis, failures, and what was written."""
    d = as_dict(result, importance)
    unit = result.unit
    console.print()
    if d["stopped_reason"]:
        error(f"search stopped: {d['stopped_reason']}")
    if d["speedup_x"] is None and not d["speedup_unknown"]:
        console.print("[yellow]no measured baseline: no speedup to report[/]")
    else:
        base, best = d["baseline"], d["best"]
        table = Table(title=f"baseline vs best ({d['trials']} trials, {d['wall_s']:.0f} s)", title_justify="left")
        table.add_column("")
        table.add_column(f"baseline (#{base['trial']})", justify="right")
        table.add_column(f"best (#{best['trial']})", justify="right")
        for label, key, fmt in ROWS:
            cells = _cells(d, key, fmt)
            if cells:
                table.add_row(label, *cells)
        for flag in d["safety"]:
            table.add_row(
                f"{flag['knob']} [dim]({flag['safety']})[/]", _fmt(flag["baseline"]), f"[bold]{_fmt(flag['tuned'])}[/]"
            )
        table.add_row("bottleneck", *((t["diagnosis"] or {}).get("bottleneck", "-") for t in (base, best)))
        table.add_row(
            "[bold]speedup[/]",
            "1.00x",
            "[bold yellow]unknown[/]" if d["speedup_unknown"] else f"[bold green]{d['speedup_x']:.2f}x[/]",
        )
        console.print(table)
        effects = Table(
            title=f"per-knob effect (median {unit.label} over the trials with that value, pruned ones included "
            "at their measured throughput)",
            title_justify="left",
        )
        effects.add_column("knob")
        effects.add_column("values")
        if importance:
            effects.add_column("importance", justify="right")
        for knob, rows in d["knob_effects"].items():
            cells = ", ".join(
                f"{_fmt(e['value'])}: {e[unit.key('median')]:.0f} ({_count(e)})"
                if e["trials"]
                else f"{_fmt(e['value'])}: -"
                for e in rows
            )
            effects.add_row(knob, cells, *([f"{importance.get(knob, 0):.2f}"] if importance else []))
        console.print(effects)
        if d["tie"]:
            console.print(f"[yellow]tie[/]: {d['tie']['note']}")
        for flag in d["safety"]:
            if flag["safety"] != "safe":
                parity = flag.get("parity")
                measured = f" ({S.describe(parity)})" if parity else ""
                console.print(
                    f"[yellow]{flag['safety']}[/]: {flag['knob']} {_fmt(flag['baseline'])} -> "
                    f"{_fmt(flag['tuned'])}: {flag['note']}{measured}"
                )
        for u in d["unsafe"]:
            console.print(
                f"[red]not exported[/]: trial #{u['trial']} ({u[unit.metric]:.1f} {unit.label}): {u['reason']}"
            )
        for label, t in (("baseline", base), ("best", best)):
            if t["diagnosis"]:
                diag = t["diagnosis"]
                console.print(f"{label}: {diag['bottleneck']}-bound ({'; '.join(diag['evidence'])})")
                for rec in diag.get("recommendations", []):
                    console.print(f"  try: {rec}")
    for line in _search_notes(d):
        console.print(line)
    if d["disturbed"]:
        console.print(
            f"[yellow]disturbed[/]: {len(d['disturbed'])} trial(s) measured while other work loaded the "
            "machine, their figures are suspect: "
            + "; ".join(f"#{t['trial']} ({escape(t['why'])})" for t in d["disturbed"])
        )
    if d["failed"]:
        console.print(
            f"{len(d['failed'])} trial(s) failed: "
            + "; ".join(f"#{f['trial']} {f['status']} ({f['error_type']}: {f['error']})" for f in d["failed"])
        )
    if show_paths:
        console.print("wrote:")
        for label, path in result.paths.items():
            if label != "run_dir" and (not str(path).startswith("/") or Path(path).exists()):
                console.print(f"  {label:15} {path}")
        if "mlflow_uri" in result.paths:  # none where MLflow is not installed (the local backend on a GPU host)
            console.print(f"compare trials: [bold]autotune ui {result.run_dir}[/]")


def _count(effect: dict) -> str:
    """Trials with a knob value: "3", or "3, 1 pruned"."""
    return f"{effect['trials']}" + (f", {effect['pruned']} pruned" if effect.get("pruned") else "")


def _search_notes(d: dict) -> list[str]:
    """Compile trials (time to first step vs steady state), pruning, why the search ended."""
    notes = [f"baseline replaced: {line}" for line in d["replaced"]]  # the user's reference, not run as given
    for c in d["compile"]:
        if c["first_step_s"] is not None:
            eager = f" (baseline, eager: {c['eager_first_step_s']:.1f} s)" if c["eager_first_step_s"] else ""
            notes.append(
                f"compile={c['compile']} (trial #{c['trial']}): first step after {c['first_step_s']:.1f} s"
                f"{eager}, then {c[d['unit'] + '_per_s']:.1f} {d['unit']}/s"
            )
    if d["other_devices"]:
        names = sorted({str(o["device_name"]) for o in d["other_devices"]})
        notes.append(
            f"{len(d['other_devices'])} trial(s) ran on other device types ({', '.join(names)}): "
            "not compared with the baseline, never the best"
        )
    if d["speedup_unknown"]:
        notes.append(f"the trials' ratio was {d['search_speedup_x']:.2f}x; " + describe(d["confirm"]))
    elif d["confirm"] and d["speedup_x"] is not None:
        notes.append(
            f"speedup {d['speedup_x']:.2f}x: the trials' ratio was {d['search_speedup_x']:.2f}x; "
            + describe(d["confirm"])
        )
    if d["break_even"]:
        notes.append(f"break-even: {d['break_even']['note']}")
    p = d["pruning"]
    if p.get("trials_pruned"):
        saved = f", saving about {p['pruning_saved_s']:.0f} s" if "pruning_saved_s" in p else ""
        notes.append(f"{p['trials_pruned']} trial(s) pruned: stopped early, clearly below the best{saved}")
    if d.get("rate_model"):
        m = d["rate_model"]
        notes.append(
            f"rate model: {m['trials']} trial(s) predicted, median error {m['median_abs_error']:.0%} "
            f"(worst: trial #{m['worst_trial']}, measured {m['worst_error']:+.0%} off its prediction)"
        )
    base = (d["baseline"] or {}).get("knobs", {})  # a config the rate model kept from running, by its changes
    notes += [
        " ".join(["not run:"] + [f"{short(k)}={_fmt(v)}" for k, v in s["config"].items() if base.get(k) != v])
        + f", {s['error']}"
        for s in d["skipped_predicted"]
    ]
    if d["ended"]:
        notes.append(f"search ended: {d['ended']}")
    return notes


def as_markdown(result, importance: dict | None = None) -> str:
    """The report for a pull request or a wiki page."""
    d = as_dict(result, importance)
    lines = [f"## autotune: {d['trials']} trials on {d['device']['type']} ({d['device']['name']})", ""]
    if d["stopped_reason"]:
        lines += [f"**Stopped:** {d['stopped_reason']}", ""]
    if d["speedup_x"] is not None or d["speedup_unknown"]:
        base, best = d["baseline"], d["best"]
        speedup = "unknown" if d["speedup_unknown"] else f"{d['speedup_x']:.2f}x"
        lines += [
            f"**Speedup: {speedup}** (trial #{best['trial']} over the baseline, trial #{base['trial']}, "
            + ("re-measured side by side)" if d["confirm"] else "measured in the same search)"),
            "",
            "| | baseline | best |",
            "|---|---:|---:|",
        ]
        for label, key, fmt in ROWS:
            cells = _cells(d, key, fmt)
            if cells:
                lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
        for flag in d["safety"]:
            lines.append(
                f"| `{flag['knob']}` ({flag['safety']}) | {_fmt(flag['baseline'])} | **{_fmt(flag['tuned'])}** |"
            )
        lines.append(
            f"| bottleneck | {(base['diagnosis'] or {}).get('bottleneck', '-')} | "
            f"{(best['diagnosis'] or {}).get('bottleneck', '-')} |"
        )
        if d["tie"]:
            lines += ["", f"**Tie:** {d['tie']['note']}"]
        notes = [f"- **{f['safety']}**: `{f['knob']}`: {f['note']}" for f in d["safety"] if f["safety"] != "safe"]
        if notes:
            lines += ["", "Convergence safety:", *notes]
    notes = _search_notes(d)
    if notes:
        lines += ["", *(f"- {n}" for n in notes)]
    if d["disturbed"]:
        lines += [
            "",
            "Disturbed trials (measured while other work loaded the machine; figures suspect):",
            *(f"- #{t['trial']}: {t['why']}" for t in d["disturbed"]),
        ]
    if d["failed"]:
        lines += [
            "",
            "Failed trials:",
            *(f"- #{f['trial']} {f['status']}: {f['error_type']}: {f['error']}" for f in d["failed"]),
        ]
    return "\n".join(lines) + "\n"
