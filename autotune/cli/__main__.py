"""`python -m autotune.cli ...`, the same as `autotune ...`."""

from autotune.cli.main import main

main()
