"""`autotune confirm RUN_DIR`: a finished search's claim re-measured later, on a quiet host (issue 64): the pairs
alone (autotune.execution.reconfirm), then the claim before and after, and what changed in best_config.yaml."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from autotune.cli import report
from autotune.cli._common import UserError, user_errors
from autotune.records.state import STATE_FILE, SearchState


def command(
    run_dir: Path = typer.Argument(..., help="a finished search's output dir"),
    rounds: Optional[int] = typer.Option(
        None, "--rounds", min=1, help="pairs side by side (default: the search's confirm_rounds, at least 3)"
    ),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
) -> None:
    """Re-measure a finished search's best against its baseline, side by side, and update its claim."""
    from autotune.execution.reconfirm import reconfirm

    try:
        if not SearchState.exists(run_dir):
            raise UserError(f"`{run_dir}` is not a search's output dir (no {STATE_FILE}); give a finished search's")
        done = reconfirm(run_dir, rounds, report.note)
    except user_errors() as e:
        report.fail(e, debug)
    report.console.print()
    for line in changes(done):
        report.console.print(line, markup=False)


def changes(done) -> list[str]:
    """The claim before and after (the answer's first line), and what changed in best_config.yaml: its measured
    speedup, the config it exports, the re-measurement's verdict."""
    from autotune.export import answer as A

    lines = [
        f"re-measured trial #{done.trial} against the baseline, side by side",
        f"before: {A.of(done.before).headline()[0]}",
        f"now:    {A.of(done.after).headline()[0]}",
    ]
    lines += [f"  {t}" for t in A.of(done.after).trust]
    old, new = done.before_config or {}, done.after_config or {}
    said = []
    for what, key in (
        ("measured.speedup_x", ("measured", "speedup_x")),
        ("confirmed.verdict", ("confirmed", "verdict")),
    ):
        a, b = _get(old, key), _get(new, key)
        if a != b:
            said.append(f"{what} {_shown(a)} -> {_shown(b)}")
    trials = _get(old, ("measured", "best_trial")), _get(new, ("measured", "best_trial"))
    if trials[0] != trials[1]:  # a tie hands the export back to the baseline (or a rejected best to the next)
        said.append(f"knobs: trial #{trials[0]}'s -> trial #{trials[1]}'s")
    path = done.after.best_config_path
    lines.append(
        f"{path}: " + ("; ".join(said) if said else "the claim is the same") if path else "no best_config.yaml"
    )
    return lines


def _get(data: dict, key: tuple[str, ...]):
    for k in key:
        data = data.get(k) if isinstance(data, dict) else None
    return data


def _shown(value) -> str:
    return "none" if value is None else str(value)
