"""`autotune`: the command line. Thin: parse, call, print. Heavy imports happen
inside the commands, so `autotune --help` stays fast."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Measured performance tuning for PyTorch training.")


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit code 2."""


def _fail(e: Exception, debug: bool) -> None:
    from autotune.report import error

    if debug:
        raise e
    error(str(e))
    raise typer.Exit(2)


def _user_errors():
    from autotune.spec import SpecError
    from autotune.trial import TrialConfigError
    from autotune.workload import WorkloadError

    return (UserError, SpecError, WorkloadError, TrialConfigError)


@app.command()
def search(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="the search spec (YAML)"),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", "-o", help="override the spec's output_dir"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no live table: one plain line per trial (for logs)"),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
) -> None:
    """Run a search: trials through Ray, Optuna choosing, MLflow recording."""
    try:
        from autotune import spec as S

        spec = S.load(spec_path)
        if output_dir is not None:
            spec.output_dir = output_dir
        from autotune import report, search as searching

        view = report.LiveView(quiet=quiet)
        try:
            result = searching.run(spec, on_start=view.start, on_trial=view.trial)
        finally:
            view.stop()
        report.summary(result)
    except _user_errors() as e:
        _fail(e, debug)
    if result.stopped_reason:
        raise typer.Exit(1)


@app.command()
def ui(
    run_dir: Optional[Path] = typer.Argument(None, help="a search's output dir (default: the newest under runs/)"),
    port: int = typer.Option(5000, help="port on 127.0.0.1"),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
) -> None:
    """Serve the MLflow UI for a search's store on 127.0.0.1."""
    try:
        run_dir = run_dir or _newest_run()
        db = run_dir / "mlflow.db"
        if not db.exists():
            raise UserError(f"`{run_dir}` has no mlflow.db; run `autotune search spec.yaml` first, or pass its output dir")
    except _user_errors() as e:
        _fail(e, debug)
    from autotune.report import console

    console.print(f"MLflow UI for {run_dir}: [bold]http://127.0.0.1:{port}[/] (Ctrl-C to stop)")
    sys.stdout.flush()
    args = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db.resolve()}",
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    os.execv(sys.executable, args)


def _newest_run() -> Path:
    runs = sorted((p for p in Path("runs").glob("*") if (p / "mlflow.db").exists()), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise UserError("no search found under `runs/`; run `autotune search spec.yaml` first, or pass a run dir")
    return runs[-1]


if __name__ == "__main__":
    app()
