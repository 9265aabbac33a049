"""`autotune run`: a training program started with a best config applied as its trials applied it (the config
named in its environment, its searched environment variables set, the instrumentation on its path)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import typer

from autotune.cli._common import UserError, best_config, user_errors
from autotune.cli import report


def command(
    ctx: typer.Context,
    config: Path = typer.Argument(..., help="a best_config.yaml (autotune export RUN -o best_config.yaml)"),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
) -> None:
    """Run a training program with a best config applied as its trials applied it:
    `autotune run best_config.yaml -- python train.py ...` (a Trainer script with no line changed; a loop
    that calls `autotune.config()` loads the same file). Without a command: the program the search ran,
    with its best flags, from its directory. Its searched environment variables are set too."""
    import shutil

    try:
        if not config.is_file():
            raise UserError(
                f"`{config}` is not a file; give a best_config.yaml (`autotune export RUN -o "
                "best_config.yaml` writes one)"
            )
        data = best_config(config)
        workload = data.get("workload") or {}
        command, cwd = (list(ctx.args), None) if ctx.args else (workload.get("command"), workload.get("dir"))
        if not command:
            raise UserError(
                "no program to run: give its command after `--`, e.g. "
                "`autotune run best_config.yaml -- python train.py`"
            )
        from autotune.execution.launcher import program_command

        given = command  # as the user gave it: what its line says it runs
        command = program_command(command)  # `python`: the interpreter autotune runs in, as in the trials
        program = shutil.which(command[0])
        if program is None:
            raise UserError(f"`{command[0]}` is not a command on PATH")
    except user_errors() as e:
        report.fail(e, debug)
    from autotune import instrument

    from autotune.config import _set_knobs
    from autotune.knobs import environment

    env = {
        **os.environ,
        **{k: str(v) for k, v in (workload.get("env") or {}).items()},
        **environment(_set_knobs(data), dict(os.environ)),  # the allocator's, as its trials started
        "AUTOTUNE_CONFIG": str(config.resolve()),
    }
    sys.stderr.write(f"autotune run: {changes(data)} ({config}): {shlex.join(given)}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    if cwd:
        os.chdir(cwd)
    os.execve(program, command, instrument.with_env({k: v for k, v in env.items() if v != ""}))  # '': unset


def changes(data: dict) -> str:
    """What a best config changes from the search's baseline, in a few words (its `safety` rows: one a knob)."""
    from autotune import knobs as K

    changed = [f"{f['knob']}={K.shown(f['tuned'])}" for f in data.get("safety") or [] if "tuned" in f]
    return f"applies {', '.join(changed)}" if changed else "your program's own settings (the baseline won)"
