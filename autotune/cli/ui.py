"""`autotune ui`: MLflow's UI served on 127.0.0.1 for a search's store, opened on its trials."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from autotune.cli._common import UserError, user_errors
from autotune.cli import report


def command(
    run_dir: Optional[Path] = typer.Argument(None, help="a search's output dir (default: the newest under runs/)"),
    port: int = typer.Option(5000, help="port on 127.0.0.1"),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
) -> None:
    """Serve the MLflow UI for a search's store on 127.0.0.1."""
    try:
        run_dir = run_dir or _newest_run()
        db = run_dir / "mlflow.db"
        if not db.exists():
            raise UserError(
                f"`{run_dir}` has no mlflow.db; run `autotune search spec.yaml` first, or pass its output dir"
            )
    except user_errors() as e:
        report.fail(e, debug)
    url = _trials_url(run_dir, db, f"http://127.0.0.1:{port}")
    report.console.print(f"MLflow UI for {run_dir}: [bold]{url}[/] (its trials, fastest first; Ctrl-C to stop)")
    sys.stdout.flush()
    args = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{db.resolve()}",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    os.execv(sys.executable, args)


def _trials_url(run_dir: Path, db: Path, base: str) -> str:
    """The runs page on the search's trials (tracking.trials_view); a store
    written before autotune saved that view gets it now. Without search.json:
    the experiment's runs page (MLflow 3's start page is a GenAI overview)."""
    from mlflow.tracking import MlflowClient

    from autotune.integrations import tracking
    from autotune.records.state import SearchState

    state = SearchState.read(run_dir) if SearchState.exists(run_dir) else SearchState()
    client = MlflowClient(f"sqlite:///{db.resolve()}")
    exp = client.get_experiment_by_name(state.mlflow_experiment)
    parent = state.mlflow_parent_run_id
    if exp is None or parent is None:
        return f"{base}/#/experiments/{exp.experiment_id if exp else '0'}/runs?workflowType=machine_learning"
    if tracking.VIEW_TAG + tracking.view_key(parent) not in exp.tags:
        tracking.share_trials_view(client, exp.experiment_id, parent, client.get_run(parent).data.params)
    return tracking.trials_url(base, exp.experiment_id, parent)


def _newest_run() -> Path:
    runs = sorted((p for p in Path("runs").glob("*") if (p / "mlflow.db").exists()), key=lambda p: p.stat().st_mtime)
    if not runs:
        raise UserError("no search found under `runs/`; run `autotune search spec.yaml` first, or pass a run dir")
    return runs[-1]
