"""`autotune report`, and what the terminal shows of a search but its live view (autotune.cli.live): the
search's last screen (the answer, its command, the baseline-vs-best table, what limits the trust in it) and the
report (that screen, then everything else the search found), in text, markdown and JSON, each printed from the
report's data (autotune.export.analysis); the lines before and between trials (an error, a wait, a note); and the
console all of it prints through, the live view's too."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from autotune import knobs as K
from autotune.cli._common import UserError, user_errors
from autotune.export import analysis
from autotune.records.verdicts import confirmed_unit, describe, sig
from autotune.trial.diagnose import bound

console = Console(highlight=False, soft_wrap=True)  # long lines stay whole in logs
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def short(name: str) -> str:
    """A knob's column label, from the registry."""
    return K.lookup(name).label


def error(message: str) -> None:
    """One line for the user, verbatim (square brackets in it are text, not markup)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}")


def fail(e: Exception, debug: bool) -> None:
    """The one exit for a user's mistake: its line (`error`), exit code 2; with `--debug`, raised whole."""
    if debug:
        raise e
    error(str(e))
    raise typer.Exit(2)


def waiting(message: str) -> None:
    """Why the search has not started yet (another search holds the device)."""
    err_console.print(f"[yellow]waiting:[/] {escape(message)}")


def note(message: str) -> None:
    """What the search is doing between trials."""
    console.print(f"[dim]{escape(message)}[/]")


def remembered(message: str) -> None:
    """An earlier search that asked the same (autotune.records.cache), named before the search starts."""
    err_console.print(f"[cyan]note:[/] {escape(message)}")


def reads_line(reads: dict | None, note: dict | None = None) -> str:
    """The reference reads' cost, one line (`SearchResult.reads_share`), and whether they were taken and why
    (`SearchResult.reads_note`: issue 64, by default only once the host drifts)."""
    why = f"; taken because {note['why']}" if note and note.get("mode") == "drifting" else ""
    if not reads:
        return f"reference reads: none taken: {note['why']}"
    confirms = f" and {reads['confirm_reads']} fresh read(s) of an incumbent" if reads["confirm_reads"] else ""
    share = f", {reads['share']:.0%} of the search" if reads.get("share") is not None else ""
    return (
        f"reference reads: the baseline read again {reads['reference_reads']} time(s){confirms}, "
        f"{reads['reads_s']:.0f} s{share} (each trial's speedup is against the baseline read near its time)" + why
    )


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


def _cells(d: dict, key: str, fmt: str, sides: tuple[str, str] = ("baseline", "best")) -> list[str] | None:
    trials = tuple(d[s] for s in sides)
    if not any(key in t["metrics"] for t in trials):
        return None
    return [fmt.format(t["metrics"][key]) if key in t["metrics"] else "-" for t in trials]


def _sides(d: dict) -> tuple[str, str]:
    """The table's two columns: the baseline, and the best, or where the baseline kept its place in a tie,
    the faster config it tied with."""
    return ("baseline", "tied") if d["tied"] else ("baseline", "best")


def _speedup_cell(d: dict) -> str:
    if d["speedup_unknown"]:
        return "[bold yellow]unknown[/]"
    if d["speedup_unsettled"]:
        return "[bold yellow]unsettled[/]"
    if d["tied"]:
        return f"[yellow]{analysis.tied_speedup(d):.2f}x, a tie[/]"
    return f"[bold green]{d['speedup_x']:.2f}x[/]"


SCREEN_ROWS = tuple(row for row in ROWS if row[1] not in ("step_ms_min", "step_ms_max"))  # the report has them


def _evidence(d: dict, rows=ROWS, user_knobs=None) -> list[tuple[str, str, str]]:
    """The baseline-vs-best table's rows, (label, baseline, best or tied) in rich markup: each measured figure
    (`rows`), the pairs' figures beside the trials', the knobs changed with their safety, the bottleneck, the
    speedup. The screen and the markdown report draw the same rows."""
    sides = _sides(d)
    base, other = (d[s] for s in sides)
    out = [(label, *cells) for label, key, fmt in rows if (cells := _cells(d, key, fmt, sides))]
    c = d["confirm"] or {}
    unit = confirmed_unit(c)
    if c.get("best_trial") == other["trial"] and c.get(unit.key("best")):  # the pairs' figures, beside the trials'
        out.append((f"{unit.label}, side by side", f"{c[unit.key('baseline')]:.1f}", f"{c[unit.key('best')]:.1f}"))
    for flag in analysis.table_flags(d, user_knobs):
        out.append(
            (
                f"{flag['knob']} [dim]({flag['safety']})[/]",
                K.shown(flag["baseline"]),
                f"[bold]{K.shown(flag['tuned'])}[/]",
            )
        )
    out.append(("bottleneck", *((t["diagnosis"] or {}).get("bottleneck") or "-" for t in (base, other))))
    out.append(("[bold]speedup[/]", "1.00x", _speedup_cell(d)))
    return out


def _table(d: dict, rows=ROWS, user_knobs=None) -> Table:
    """The evidence: the baseline against the best, side by side, each measured figure a row (`_evidence`)."""
    sides = _sides(d)
    base, other = (d[s] for s in sides)
    table = Table(title=f"baseline vs best ({d['trials']} trials, {d['wall_s']:.0f} s)", title_justify="left")
    table.add_column("")
    table.add_column(f"baseline (#{base['trial']})", justify="right")
    table.add_column(f"{'tied' if d['tied'] else 'best'} (#{other['trial']})", justify="right")
    for row in _evidence(d, rows, user_knobs):
        table.add_row(*row)
    return table


def _markdown_cell(cell: str) -> str:
    """A rich cell as markdown: bold stays bold, colours and dimming go."""
    cell = re.sub(r"\[bold[a-z ]*\](.*?)\[/\]", r"**\1**", cell)
    return re.sub(r"\[/?[a-z ]*\]", "", cell)


def _print(*items) -> None:
    """Lines that wrap at the terminal's width (a word that fits is never cut), unlike the trials' log lines; a
    line a user copies (a command, a path: a Text with `no_wrap`) is printed whole, never cut at the width, so that
    what the terminal shows over two rows still copies as one line."""
    for item in items:
        item = Text(item) if isinstance(item, str) else item
        whole = isinstance(item, Text) and bool(item.no_wrap)
        console.print(item, soft_wrap=whole, overflow=None if whole else "fold")


def _stopped(d: dict) -> None:
    """Why the search stopped, where it did: an error line, wrapped at the terminal's width."""
    if d["stopped_reason"]:
        line = Text.assemble(("error:", "bold red"), f" search stopped: {d['stopped_reason']}")
        err_console.print(line, soft_wrap=False, overflow="fold")


def screen(result, d: dict | None = None, rows=SCREEN_ROWS) -> list:
    """The last screen of a search, as renderables: the answer (autotune.export.answer: what changed, how
    much faster, is it safe), the command that runs it, the baseline-vs-best table (`rows`: the step time's
    min and max are the report's), and a line for each fact that changes how far to trust the answer."""
    from autotune.export import answer as A

    d = d or analysis.as_dict(result)
    answer = A.of(result)
    head = answer.headline()
    out: list = [Text(head[0], style="bold"), Text(head[1])]
    if answer.command:
        first, *more = command_lines(answer.command, console.width - len("run it: "))
        out.append(Text.assemble(("run it: ", "bold"), (first, "bold cyan"), no_wrap=True))
        out += [Text(line, style="bold cyan", no_wrap=True) for line in more]
        if answer.adds:
            out.append(Text(f"  it adds: {answer.adds}"))
    if d["baseline"] and d["best"]:
        out.append(_table(d, rows, result.user_knobs))
    # a hung trial's line names its log: printed whole, as a path is (`_print`)
    out += [Text(line, style="yellow", no_wrap=i < answer.stuck) for i, line in enumerate(answer.trust)]
    return out


def command_lines(command: str, width: int) -> list[str]:
    """A shell command wider than `width` as lines a shell reads as one command (each but the last ends in ` \\`),
    broken only between its words, quoted ones kept whole: what a user copies from a narrow terminal still runs.
    A Python line (the `load_config` one) and a command that fits stay one line."""
    if len(command) <= width or command.startswith("cfg = "):
        return [command]
    words = shlex.shlex(command, posix=False)  # quotes kept: each word is pasted as it was quoted
    words.whitespace_split, words.commenters = True, ""
    lines = [""]
    for word in words:
        if lines[-1] and len(lines[-1]) + 1 + len(word) + 2 > width:
            lines[-1] += " \\"
            lines.append("  " + word)  # a continuation line, indented
        else:
            lines[-1] = f"{lines[-1]} {word}" if lines[-1] else word
    return lines


def summary(result, importance: dict | None = None) -> None:
    """The search's last screen (`screen`), then where the rest is: `autotune report RUN` (diagnoses,
    per-knob effects, the rate model, pruned, disturbed and failed trials, compile times, the break-even) and
    the MLflow view of the trials."""
    from autotune.export.answer import shown

    d = analysis.as_dict(result, importance)
    console.print()
    _stopped(d)
    _print(*screen(result, d))
    run = shown(result.run_dir, Path.cwd())
    more = f"details: autotune report {run}"
    if "mlflow_uri" in result.paths:  # none where MLflow is not installed (the local backend on a GPU host)
        more += f"  ·  trials: autotune ui {run}"
    _print(Text(more, style="dim", no_wrap=True))


def report(result, importance: dict | None = None, plots=()) -> None:
    """`autotune report RUN`: the last screen, then everything else the search found."""
    d = analysis.as_dict(result, importance)
    _stopped(d)
    _print(*screen(result, d, ROWS))
    for item in details(d):
        _print(item)
    for path in plots:
        _print(Text(f"plot: {path}", no_wrap=True))


def _search_figure(d: dict) -> str:
    interval = d.get("search_speedup_interval")
    within = f" (95%: {interval[0]:.2f}-{interval[1]:.2f}x)" if interval else ""
    # a search with reads whose share could not afford the best's fresh read: its figure is its trial's, selected
    again = (
        ", its trial's: not read again within the reads' share" if d.get("search_speedup_read_again") is False else ""
    )
    return f"the search's figure was {d['search_speedup_x']:.2f}x{within}{again}"


def details(d: dict) -> list:
    """What the last screen leaves to `autotune report`, as renderables."""
    from autotune.safety import levels as S

    out: list = []
    c, unit = d["confirm"], analysis.data_unit(d)
    if d["speedup_unknown"] or d["speedup_unsettled"] or (c and d["speedup_x"] is not None):
        out.append(f"re-measurement: {_search_figure(d)}; " + describe(c))
    if d["tie"]:
        out.append(Text.assemble(("tie", "yellow"), f": {d['tie']['note']}"))
    for flag in d["safety"]:
        if flag["safety"] != "safe":
            parity = flag.get("parity")
            measured = f" ({S.describe(parity)})" if parity else ""
            out.append(
                Text.assemble(
                    (flag["safety"], "yellow"),
                    f": {flag['knob']} {K.shown(flag['baseline'])} -> {K.shown(flag['tuned'])}: {flag['note']}{measured}",
                )
            )
    if d["batch"] and d["batch"].get("note"):
        out.append(f"batch: {d['batch']['note']}")
    for u in d["unsafe"]:
        out.append(
            Text.assemble(
                ("not exported", "red"),
                f": trial #{u['trial']} ({sig(u[unit.metric])} {unit.label}): {u['reason']}",
            )
        )
    for label, diag in _diagnosed(d):
        out.append(f"{label}: {bound(diag)}")
        out += [f"  {e}" for e in diag["evidence"]]
        out += [f"  try: {rec}" for rec in diag.get("recommendations", [])]
    if d["knob_effects"] and d["baseline"]:
        out.append(_effects(d))
    out += _search_notes(d)
    if d["disturbed"]:
        out.append(
            Text.assemble(
                ("disturbed", "yellow"),
                f": {len(d['disturbed'])} trial(s) measured while other work loaded the machine, "
                "their figures are suspect:",
            )
        )
        out += [f"  #{t['trial']}: {t['why']}" for t in d["disturbed"]]
    if d["hung"]:
        out.append(Text.assemble(("hung", "red"), f": {len(d['hung'])} trial(s) took no optimizer step in time:"))
        out += [Text(f"  {hung_line(h)}", no_wrap=True) for h in d["hung"]]  # its log's path: copied whole
    if d["failed"]:
        out.append(f"{len(d['failed'])} trial(s) failed:")
        out += [f"  #{f['trial']} {f['status']} ({f['error_type']}: {f['error']})" for f in d["failed"]]
    if d["files"]:
        out.append("files:")
        wide = max(map(len, d["files"]))
        out += [Text(f"  {label:{wide}} {path}", no_wrap=True) for label, path in d["files"].items()]  # copied whole
    return out


def _diagnosed(d: dict) -> list[tuple[str, dict]]:
    """The baseline's and the best's diagnoses, labelled; the best's left out where it is the baseline (a tie the
    baseline won: the same trial, said once)."""
    base, best = d["baseline"], d["best"]
    same = base and best and base.get("trial") == best.get("trial")
    sides = [("baseline", base)] + ([] if same else [("best", best)])
    return [(label, t["diagnosis"]) for label, t in sides if t and t["diagnosis"]]


def hung_line(h: dict) -> str:
    """A hung trial (`SearchResult.hangs`) in one line: "#2 num_workers=1: loader worker 0 in Corpus.__getitem__;
    num_workers > 0 ruled out, not tried: num_workers=2, 4; its log: runs/x/trials/0002/trial.log"."""
    knobs = ", ".join(f"{k}={K.shown(v)}" for k, v in h["knobs"].items()) or "the baseline"
    line = f"#{h['trial']} {knobs}: {h['where'] or 'no step in time'}"
    if h["ruled_out"]:
        line += f"; {h['ruled_out']} ruled out"
        tried = "; ".join(f"{k}={', '.join(K.shown(v) for v in vs)}" for k, vs in h["not_tried"].items())
        line += f", not tried: {tried}" if tried else ""
    return line + f"; its log: {h['log']}"


def _effects(d: dict) -> Table:
    importance, unit = d["importance"], analysis.data_unit(d)
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
        effects.add_row(knob, _effect_cells(rows, unit), *([f"{importance.get(knob, 0):.2f}"] if importance else []))
    return effects


def _effect_cells(rows: list[dict], unit) -> str:
    """A knob's values with the median rate of their trials: "32: 4447 (3), 64: 2726 (6, 5 pruned), 256: -"."""
    return ", ".join(
        f"{K.shown(e['value'])}: {e[unit.key('median')]:.0f} ({_count(e)})"
        if e["trials"]
        else f"{K.shown(e['value'])}: -"
        for e in rows
    )


def _count(effect: dict) -> str:
    """Trials with a knob value: "3", or "3, 1 pruned"."""
    return f"{effect['trials']}" + (f", {effect['pruned']} pruned" if effect.get("pruned") else "")


def _search_notes(d: dict) -> list[str]:
    """Compile trials (time to first step vs steady state), pruning, the rate model, why the search ended."""
    unit = analysis.data_unit(d)
    notes = []  # (a baseline replaced is on the screen: autotune.export.answer.trust)
    for c in d["compile"]:
        if c["first_step_s"] is not None:
            eager = f" (baseline, eager: {sig(c['eager_first_step_s'])} s)" if c["eager_first_step_s"] else ""
            took = f"{sig(c['compile_s'])} s compiling, " if c.get("compile_s") else ""
            notes.append(
                f"compile={c['compile']} (trial #{c['trial']}): {took}first step after {sig(c['first_step_s'])} s"
                f"{eager}, then {sig(c[unit.metric])} {unit.label}"
            )
    spent = [c["compile_s"] for c in d["compile"] if c.get("compile_s")]
    if len(spent) > 1:  # one cache for the search's trials: a graph compiled once
        notes.append(f"compile: {sig(sum(spent))} s in all over {len(spent)} trials (one compile cache for them)")
    notes += [
        f"trial #{c['trial']} "
        + " ".join(f"{short(k)}={K.shown(v)}" for k, v in c["knobs"].items() if k in K.KNOBS or k.startswith("args."))
        + f": chosen by {c['by']}"
        for c in d.get("chosen") or []
    ]
    if d["other_devices"]:
        names = sorted({str(o["device_name"]) for o in d["other_devices"]})
        notes.append(
            f"{len(d['other_devices'])} trial(s) ran on other device types ({', '.join(names)}): "
            "not compared with the baseline, never the best"
        )
    if d["break_even"]:
        notes.append(f"break-even: {d['break_even']['note']}")
    if d.get("reads") or d.get("reads_note"):
        notes.append(reads_line(d.get("reads"), d.get("reads_note")))
    p = d["pruning"]
    if p.get("trials_pruned"):
        saved = f", saving about {sig(p['pruning_saved_s'])} s" if "pruning_saved_s" in p else ""
        notes.append(f"{p['trials_pruned']} trial(s) pruned: stopped early, clearly below the best{saved}")
    if d.get("rate_model"):
        m = d["rate_model"]
        notes.append(
            f"rate model: {m['trials']} trial(s) predicted, median error {m['median_abs_error']:.0%} "
            f"(worst: trial #{m['worst_trial']}, measured {m['worst_error']:+.0%} off its prediction)"
        )
    base = (d["baseline"] or {}).get("knobs", {})  # a config the rate model kept from running, by its changes
    notes += [
        " ".join(["not run:"] + [f"{short(k)}={K.shown(v)}" for k, v in s["config"].items() if base.get(k) != v])
        + f", {s['error']}"
        for s in d["skipped_predicted"]
    ]
    if d["ended"]:
        notes.append(f"search ended: {d['ended']}")
    return notes


def as_markdown(result, importance: dict | None = None) -> str:
    """The report for a pull request or a wiki page: the answer and its command, the table, then the rest."""
    d = analysis.as_dict(result, importance)
    lines = _markdown_answer(d)
    if d["baseline"] and d["best"]:
        lines += _markdown_table(d, result.user_knobs)
    return "\n".join(lines + _markdown_findings(d)) + "\n"


def _markdown_answer(d: dict) -> list[str]:
    """The heading, why the search stopped, the answer's two lines, its command and what limits the trust in it."""
    a = d["answer"]
    lines = [f"## autotune: {d['trials']} trials on {d['device']['type']} ({d['device']['name']})", ""]
    if d["stopped_reason"]:
        lines += [f"**Stopped:** {d['stopped_reason']}", ""]
    lines += [f"**{a['headline'][0]}**", "", a["headline"][1]]
    if a["command"]:
        lines += ["", "```", a["command"], "```"]
    if a["trust"]:
        lines += ["", *(f"- {t}" for t in a["trust"])]
    return lines


def _markdown_table(d: dict, user_knobs=None) -> list[str]:
    """The baseline against the best (or the config it tied with), as a markdown table: the screen's rows."""
    sides = _sides(d)
    base, other = (d[s] for s in sides)
    lines = ["", f"| | baseline (#{base['trial']}) | {sides[1]} (#{other['trial']}) |", "|---|---:|---:|"]
    return lines + [f"| {' | '.join(_markdown_cell(c) for c in row)} |" for row in _evidence(d, ROWS, user_knobs)]


def _markdown_findings(d: dict) -> list[str]:
    """What the table leaves out: the tie, convergence safety, the re-measurement, the trials not exported, the
    diagnoses, the per-knob effects, the search's notes, disturbed and failed trials, the files."""
    from autotune.safety import levels as S

    unit, lines = analysis.data_unit(d), []
    if d["tie"]:
        lines += ["", f"**Tie:** {d['tie']['note']}"]
    notes = [
        f"- **{f['safety']}**: `{f['knob']}` {K.shown(f['baseline'])} -> {K.shown(f['tuned'])}: {f['note']}"
        + (f" ({S.describe(f['parity'])})" if f.get("parity") else "")
        for f in d["safety"]
        if f["safety"] != "safe"
    ]
    if d["batch"] and d["batch"].get("note"):
        notes.append(f"- **batch**: {d['batch']['note']}")
    if notes:
        lines += ["", "Convergence safety:", *notes]
    if d["confirm"] and (d["speedup_x"] is not None or d["speedup_unknown"] or d["speedup_unsettled"]):
        lines += ["", f"Re-measured: {_search_figure(d)}; {describe(d['confirm'])}"]
    for u in d["unsafe"]:
        lines += ["", f"**Not exported:** trial #{u['trial']} ({sig(u[unit.metric])} {unit.label}): {u['reason']}"]
    for label, diag in _diagnosed(d):
        lines += ["", f"{label}: {bound(diag)}", "", *(f"- {e}" for e in diag["evidence"])]
        lines += [f"- try: {rec}" for rec in diag.get("recommendations", [])]
    if d["knob_effects"] and d["baseline"]:
        lines += _markdown_effects(d)
    notes = _search_notes(d)
    if notes:
        lines += ["", *(f"- {n}" for n in notes)]
    if d["disturbed"]:
        lines += [
            "",
            "Disturbed trials (measured while other work loaded the machine; figures suspect):",
            *(f"- #{t['trial']}: {t['why']}" for t in d["disturbed"]),
        ]
    if d["hung"]:
        lines += ["", "Hung trials (no optimizer step in time):", *(f"- {hung_line(h)}" for h in d["hung"])]
    if d["failed"]:
        lines += [
            "",
            "Failed trials:",
            *(f"- #{f['trial']} {f['status']}: {f['error_type']}: {f['error']}" for f in d["failed"]),
        ]
    if d["files"]:
        lines += ["", "Files:", *(f"- {label}: `{path}`" for label, path in d["files"].items())]
    return lines


def _markdown_effects(d: dict) -> list[str]:
    """The per-knob effects (and the knobs' importance, where computed), as a markdown table."""
    unit, imp = analysis.data_unit(d), d["importance"]
    lines = [
        "",
        f"Per-knob effect (median {unit.label} over the trials with that value, pruned ones included):",
        "",
        "| knob | values |" + (" importance |" if imp else ""),
        "|---|---|" + ("---:|" if imp else ""),
    ]
    for knob, rows in d["knob_effects"].items():
        cells = _effect_cells(rows, unit)
        lines.append(f"| `{knob}` | {cells} |" + (f" {imp.get(knob, 0):.2f} |" if imp else ""))
    return lines


# --- the command ---

FORMATS = ("text", "json", "markdown")


def command(
    run_dir: Path = typer.Argument(..., help="a search's output dir"),
    fmt: str = typer.Option("text", "--format", "-f", help="text | json | markdown"),
    plots: bool = typer.Option(True, help="(re)draw the plots into RUN_DIR/plots"),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
) -> None:
    """Summarize a finished or interrupted search (and draw its plots)."""
    try:
        if fmt not in FORMATS:
            raise UserError(f"--format `{fmt}` is not one of: {', '.join(FORMATS)}")
        result = _read_run(run_dir)
    except user_errors() as e:
        fail(e, debug)
    import json

    drawn, importance = _plots(run_dir, result, plots)
    if fmt == "json":
        data = {**analysis.as_dict(result, importance), "plots": [str(p) for p in drawn]}
        print(json.dumps(data, indent=2, default=str))
    elif fmt == "markdown":
        print(as_markdown(result, importance), end="")
    else:
        report(result, importance, drawn)


def _read_run(run_dir: Path):
    from autotune.records.run_dir import read_run

    try:
        return read_run(run_dir)
    except FileNotFoundError as e:
        raise UserError(f"{e}; run `autotune search spec.yaml` first, or pass its output dir") from None


def _plots(run_dir: Path, result, plots: bool) -> tuple[list, dict | None]:
    """The plots drawn into the run dir (`plots`: where there is a best) and the knobs' importance: the plots',
    else computed from the study. A run dir copied without its databases (*.db) has neither."""
    from autotune.records import plots as P

    if not (run_dir / "optuna.db").exists():
        return [], None
    storage, study = _study(run_dir)
    drawn = P.write_all(result, storage, study) if plots and result.best else []
    return drawn, result.importance if drawn else P.knob_importance(storage, study)


def _study(run_dir: Path) -> tuple[str, str]:
    """The search's Optuna storage and its study."""
    from autotune.records.state import SearchState

    study = SearchState.read(run_dir).optuna_study
    return f"sqlite:///{(run_dir / 'optuna.db').resolve()}", study
