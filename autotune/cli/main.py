"""`autotune`: the command line, wired. Each command is a module of its own (autotune.cli.search, report,
confirm, export, run, ui): it parses its line, calls the package and prints; heavy imports happen inside the commands, so
`autotune --help` stays fast."""

from __future__ import annotations

import os
import sys

import typer

from autotune.cli import confirm, export, report, run, search, ui

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Measured performance tuning for PyTorch training.",
)
app.command("search", cls=search.WithCommand, context_settings={"allow_extra_args": True})(search.command)
app.command("report")(report.command)
app.command("confirm")(confirm.command)
app.command("export")(export.command)
app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run.command)
app.command("ui")(ui.command)


def main() -> None:
    """The `autotune` command: the app, then a prompt exit. Once the command has
    returned and the exit handlers have run (Ray's and MLflow's, logging's), the
    interpreter's teardown of torch, Ray and MLflow has nothing left to write and
    took 2.4 s after the quickstart's last line on 2 cores (1.2 s for a process
    that only imports them): skipped, unless a thread of the user's still runs.
    An exception other than an exit propagates as usual."""
    import atexit
    import threading

    try:
        app()
        code = 0
    except SystemExit as e:
        code = e.code
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
