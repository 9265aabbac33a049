"""Everything the terminal shows: the live trial table and the final summary."""

from __future__ import annotations

from rich.console import Console
from rich.live import Live
from rich.table import Table

from autotune.knobs import KNOBS

console = Console(highlight=False, soft_wrap=True)  # long lines stay whole in logs
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

SHORT = {"num_workers": "workers", "pin_memory": "pin", "batch_size": "batch", "precision": "precision",
         "compile": "compile", "set_to_none": "none-grad", "channels_last": "ch-last", "cudnn_benchmark": "cudnn-bm"}


def error(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}")


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _status(record) -> str:
    return {"ok": "[green]ok[/]", "oom": "[yellow]oom[/]", "timeout": "[yellow]timeout[/]"}.get(record.status, "[red]error[/]")


class LiveView:
    """A table of trials that grows as they finish; a plain line per trial when
    quiet or when the output is not a terminal (CI logs)."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.rows = []
        self.live: Live | None = None
        self.searched: list[str] = []
        self.best = None

    def start(self, device, space, run_dir) -> None:
        self.searched = list(space.search)
        console.print(f"[bold]autotune[/] search on [cyan]{device.type}[/] ({device.name}, {device.cpus} CPUs) -> {run_dir}")
        console.print("searching: " + ", ".join(f"{k} {space.search[k]}" for k in self.searched))
        for name, why in space.fixed.items():
            console.print(f"  [dim]fixed {name}={_fmt(space.baseline[name])}: {why}[/]")
        if console.is_terminal and not self.quiet:
            self.live = Live(self._table(), console=console, refresh_per_second=4)
            self.live.start()

    def trial(self, record) -> None:
        if record.throughput and (self.best is None or record.throughput > self.best.throughput):
            self.best = record
        self.rows.append(record)
        if self.live:
            self.live.update(self._table())
        else:
            console.print(self._line(record))

    def stop(self) -> None:
        if self.live:
            self.live.stop()
            self.live = None

    def _line(self, r) -> str:
        knobs = " ".join(f"{SHORT[k]}={_fmt(r.knobs[k])}" for k in self.searched)
        perf = f"{r.throughput:9.1f} samples/s" if r.throughput else f"{r.error_type}: {r.error}"
        speed = f" x{r.speedup:.2f}" if r.speedup else ""
        return f"trial {r.number:3d} {_status(r):>6} {knobs}  {perf}{speed}" + (" (baseline)" if r.is_baseline else "")

    def _table(self) -> Table:
        table = Table(title="trials", title_justify="left")
        table.add_column("#", justify="right")
        table.add_column("status")
        for k in self.searched:
            table.add_column(SHORT[k])
        table.add_column("samples/s", justify="right")
        table.add_column("speedup", justify="right")
        table.add_column("best so far", justify="right")
        best = None
        for r in self.rows:
            if r.throughput and (best is None or r.throughput > best):
                best = r.throughput
            table.add_row(
                f"{r.number}" + ("*" if r.is_baseline else ""), _status(r), *(_fmt(r.knobs[k]) for k in self.searched),
                f"{r.throughput:.1f}" if r.throughput else (r.error_type or ""),
                f"{r.speedup:.2f}x" if r.speedup else "", f"{best:.1f}" if best else "",
            )
        return table


def summary(result) -> None:
    """The final table: baseline vs best, the speedup, and what was written."""
    base, best = result.baseline, result.best
    console.print()
    if result.stopped_reason:
        error(f"search stopped: {result.stopped_reason}")
    if base is None or not base.throughput or best is None:
        console.print("[yellow]no measured baseline: no speedup to report[/]")
    else:
        table = Table(title=f"baseline vs best ({len(result.records)} trials, {result.wall_s:.0f} s)", title_justify="left")
        table.add_column("")
        table.add_column(f"baseline (#{base.number})", justify="right")
        table.add_column(f"best (#{best.number})", justify="right")
        rows = [("samples/s", "samples_per_s", "{:.1f}"), ("step time mean (ms)", "step_ms_mean", "{:.2f}"),
                ("step time p95 (ms)", "step_ms_p95", "{:.2f}"), ("step-time mean known to", "step_mean_ci95", "±{:.1%}"),
                ("data loader (% of step)", "dataloader_frac", "{:.1%}"), ("GPU busy (% of step)", "gpu_util_frac", "{:.0%}"),
                ("GPU util, NVML (%)", "gpu_util_nvml_pct", "{:.0f}"), ("tensor-core kernels (% of kernel time)", "tensor_core_frac", "{:.0%}"),
                ("peak memory (GiB)", "mem_peak_allocated_gib", "{:.2f}"), ("achieved TFLOP/s", "achieved_tflops", "{:.3g}"),
                ("MFU", "mfu", "{:.1%}")]
        for label, key, fmt in rows:
            if key in base.metrics or key in best.metrics:
                cell = lambda r: fmt.format(r.metrics[key]) if key in r.metrics else "-"  # noqa: E731
                table.add_row(label, cell(base), cell(best))
        for name in KNOBS:
            if base.knobs[name] != best.knobs[name]:
                flag = KNOBS[name].safety
                table.add_row(f"{name} [dim]({flag})[/]", _fmt(base.knobs[name]), f"[bold]{_fmt(best.knobs[name])}[/]")
        table.add_row("bottleneck", *((r.diagnosis or {}).get("bottleneck", "-") for r in (base, best)))
        table.add_row("[bold]speedup[/]", "1.00x", f"[bold green]{best.throughput / base.throughput:.2f}x[/]")
        console.print(table)
        for label, r in (("baseline", base), ("best", best)):
            if r.diagnosis:
                d = r.diagnosis
                console.print(f"{label}: {d['bottleneck']}-bound ({'; '.join(d['evidence'])})")
                for rec in d["recommendations"]:
                    console.print(f"  try: {rec}")
    failed = [r for r in result.records if r.status != "ok"]
    if failed:
        console.print(f"{len(failed)} trial(s) failed: " + "; ".join(f"#{r.number} {r.status} ({r.error_type})" for r in failed))
    console.print("wrote:")
    for label, path in result.paths.items():
        if label == "run_dir" or (str(path).startswith("/") and not _exists(path)):
            continue
        console.print(f"  {label:15} {path}")
    console.print(f"compare trials: [bold]autotune ui {result.run_dir}[/]")


def _exists(path) -> bool:
    from pathlib import Path

    return Path(path).exists()
