"""`autotune` on the command line: one module per command (autotune.cli.search, report, export, run, ui; their
shared user errors: autotune.cli._common), wired by autotune.cli.main; and everything the terminal shows (the live
trial table: autotune.cli.live; the console, the final summary and `autotune report`, printed from
autotune.export.analysis's data: autotune.cli.report). Thin: parse, call, print; heavy imports happen inside the
commands, so `autotune --help` stays fast.

May import any part of the package.
"""
