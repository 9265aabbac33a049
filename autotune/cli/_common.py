"""What the commands share: the user's mistakes (`UserError`, and the errors of the spec, the workload and a
trial's config: `user_errors`), which each command hands to its one exit (autotune.cli.report.fail: one line, exit
code 2; raised whole with `--debug`); and a best_config.yaml read for `export` and `run`."""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit code 2."""


def user_errors() -> tuple[type[Exception], ...]:
    """The exceptions that are the user's to fix, each printed as one line."""
    from autotune.spec import SpecError
    from autotune.trial.runner import TrialConfigError
    from autotune.workload import WorkloadError

    return (UserError, SpecError, WorkloadError, TrialConfigError)


def best_config(path: Path) -> dict:
    """`path`'s best_config.yaml content; one that is not one is the user's error."""
    from autotune.export import load

    try:
        return load.read(path)
    except ValueError as e:
        raise UserError(str(e)) from None
