"""`autotune` on the command line: the commands, and everything the terminal shows (the live trial table:
autotune.cli.live; the final summary and `autotune report`: autotune.cli.report). Thin: parse, call, print; heavy
imports happen inside the commands, so `autotune --help` stays fast.

May import any part of the package.
"""
