"""`autotune export`: a search's best config (best_config.yaml), or the loader settings an online run ended with
over it, in the form production code takes (autotune.export.best_config.FORMATS)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from autotune.cli._common import UserError, best_config, user_errors
from autotune.cli import report


def command(
    run_dir: Optional[Path] = typer.Argument(None, help="a search's output dir"),
    fmt: str = typer.Option(
        "yaml", "--format", "-f", help="yaml | json | python | lightning | hf | hf-args | torchrun"
    ),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="write here (default: stdout)"),
    from_online: Optional[Path] = typer.Option(
        None,
        "--from-online",
        metavar="LOG",
        help="the loader settings an online run ended with (its log), over RUN_DIR's best config, or alone",
    ),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
) -> None:
    """The best configuration, for production code."""
    try:
        from autotune.export import best_config as E

        if fmt not in E.FORMATS:
            raise UserError(f"--format `{fmt}` is not one of: {', '.join(E.FORMATS)}")
        if run_dir is None and from_online is None:
            raise UserError(
                "give a search's output dir (`autotune export RUN_DIR`) or an online run's log (`--from-online LOG`)"
            )
        data = _searched(run_dir) if run_dir is not None else {"knobs": {}}
        if from_online is not None:
            data = _with_online(data, from_online)
        text = E.render(data, fmt)
    except user_errors() as e:
        report.fail(e, debug)
    if output:
        output.write_text(text)
        report.console.print(f"wrote {output}")
    else:
        print(text, end="")


def _searched(run_dir: Path) -> dict:
    """The best config `run_dir`'s search wrote."""
    from autotune.records.run_dir import run_paths

    best = run_paths(run_dir)["best_config"]
    if not best.exists():
        raise UserError(
            f"`{run_dir}` has no best_config.yaml (no search there, or its baseline never "
            "finished); run `autotune search spec.yaml` first"
        )
    return best_config(best)


def _with_online(data: dict, log: Path) -> dict:
    """`data` with the loader settings the online run that wrote `log` ended with."""
    from autotune.export import best_config as E
    from autotune.online.loader import settings_from_log

    if not log.is_file():
        raise UserError(f"`{log}` is not a file: give the log an OnlineLoader wrote (`log=`)")
    try:
        return E.with_online(data, settings_from_log(log))
    except ValueError as e:
        raise UserError(str(e)) from None
