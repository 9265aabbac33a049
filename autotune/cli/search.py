"""`autotune search`: the spec its line stands for (a spec file, a training command after `--`, or a stopped
search to continue), the line's options over it (`Overrides`), the search run with the live view, and its last
screen."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperCommand

from autotune.cli._common import UserError, user_errors
from autotune.cli import report

COMMAND = "program_command"  # ctx.meta: what follows `--` on `autotune search`'s line (None: no `--`)


class WithCommand(TyperCommand):
    """A command whose line may end with `-- PROGRAM ARGS`: that tail is kept whole in `ctx.meta[COMMAND]`
    (the program's own options are never read as autotune's), the rest parsed as usual."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        ctx.meta[COMMAND] = args[args.index("--") + 1 :] if "--" in args else None
        return super().parse_args(ctx, args[: args.index("--")] if "--" in args else args)


def command(
    ctx: typer.Context,
    spec_path: Optional[Path] = typer.Argument(None, metavar="SPEC", help="the search spec (YAML)"),
    *,
    resume: Optional[Path] = typer.Option(
        None, "--resume", metavar="RUN_DIR", help="continue a stopped search (its spec is in RUN_DIR)"
    ),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", "-o", help="override the spec's output_dir"),
    address: Optional[str] = typer.Option(
        None, "--address", metavar="HOST:PORT", help="an existing Ray cluster (overrides resources.ray_address)"
    ),
    tracking_uri: Optional[str] = typer.Option(
        None, "--tracking-uri", metavar="URI", help="an MLflow server, http://host:port (overrides tracking.uri)"
    ),
    budget: Optional[str] = typer.Option(
        None,
        "--budget",
        metavar="DURATION",
        help="stop starting trials after this long: 300, 90s, 5m, 1h (overrides search.time_budget_s; "
        "with a command and no spec: 10m)",
    ),
    n_trials: Optional[int] = typer.Option(
        None, "--n-trials", metavar="N", help="trials in all, the baseline included (overrides search.n_trials)"
    ),
    first_step_limit: Optional[str] = typer.Option(
        None,
        "--first-step-limit",
        metavar="DURATION",
        help="end a trial of your program (its probe first) that finishes no optimizer step within this long: "
        "90s, 5m (overrides trial.first_step_s, 2m; the probe's never past --budget)",
    ),
    seed: Optional[int] = typer.Option(None, "--seed", help="the sampler's seed (overrides search.seed)"),
    keep_compile_cache: bool = typer.Option(
        False, "--keep-compile-cache", help="keep the trials' compile cache in the run dir (search.keep_compile_cache)"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no live table: one plain line per trial (for logs)"),
    reuse: bool = typer.Option(
        False,
        "--reuse",
        help="an earlier finished search of the same question on this machine "
        "(same runs dir) is the result: no trial runs",
    ),
    refresh: bool = typer.Option(False, "--refresh", help="search even when an earlier search matches"),
    backend: str = typer.Option(
        "auto",
        "--backend",
        metavar="auto|local|ray",
        help="where trials run: local (one at a time on this host, no Ray needed), ray "
        "(this host or a cluster); auto: ray where it is installed",
    ),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
) -> None:
    """Run a search: trials through Ray (or one at a time on this host), Optuna
    choosing, MLflow recording. Ctrl-C or SIGTERM stops it with every finished
    trial saved. With no spec, `autotune search [OPTIONS] -- python train.py ARGS`:
    the command is the workload, its own settings the baseline, the space what it
    can take, 10 minutes the budget."""
    try:
        spec = _spec(ctx.meta.get(COMMAND), ctx.args, spec_path, resume=resume, reuse=reuse, refresh=refresh)
        overrides = Overrides(
            output_dir=output_dir,
            address=address,
            tracking_uri=tracking_uri,
            budget=budget,
            n_trials=n_trials,
            first_step_limit=first_step_limit,
            seed=seed,
            keep_compile_cache=keep_compile_cache or None,
        )
        overrides.apply(spec, resumed=resume is not None)
        result = _run(spec, quiet=quiet, reuse=reuse, refresh=refresh, resume=resume is not None, backend=backend)
    except user_errors() as e:
        report.fail(e, debug)
    if result.stopped_reason:
        raise typer.Exit(1)


# a unit typed apart from its number (`--budget 2 minutes`): the word would be read as the spec
TIME_WORDS = {"s", "sec", "secs", "second", "seconds", "m", "min", "mins", "minute", "minutes", "h", "hour", "hours"}


def _spec(
    command: list[str] | None,
    extra: list[str],
    spec_path: Path | None,
    *,
    resume: Path | None,
    reuse: bool,
    refresh: bool,
):
    """The spec the line stands for: a spec file's, a training command's (after `--`) or a stopped search's
    (`--resume`), after the checks of what the line gives together."""
    from autotune import spec as S

    if spec_path is not None and str(spec_path) in TIME_WORDS and not spec_path.exists():  # `--budget 2 minutes`
        raise UserError(
            f"`{spec_path}` is no spec file: a duration is one word, its unit joined to it (`--budget 2m`, 90s, 1h)"
        )
    command_spec = _command_spec(command, extra, spec_path, resume)
    if reuse and refresh:
        raise UserError("give `--reuse` or `--refresh`, not both")
    if resume is not None and (reuse or refresh):
        raise UserError("`--resume` continues that search; `--reuse` and `--refresh` are for a new one")
    if resume is not None and spec_path is not None:
        raise UserError(
            f"give a spec or `--resume RUN_DIR`, not both: a resumed search runs the spec it was "
            f"started with (`{resume / 'spec.yaml'}`)"
        )
    if resume is not None:
        if not (resume / "spec.yaml").exists():
            raise UserError(f"`{resume}` has no spec.yaml: not a search's output dir, nothing to resume")
        spec = S.load(resume / "spec.yaml")
        spec.output_dir = resume
        return spec
    if command_spec is not None:
        return command_spec
    if spec_path is None:
        raise UserError(
            "give a spec (`autotune search spec.yaml`), a training command after `--` (`autotune search -- "
            "python train.py`) or a search to continue (`--resume RUN_DIR`)"
        )
    return S.load(spec_path)


def _command_spec(command: list[str], extra: list[str], spec_path: Optional[Path], resume: Optional[Path]):
    """The spec `autotune search -- CMD` stands for (None: the line gives a spec or `--resume` instead), after
    the checks of what the line gives: a command alone, and one that can start here."""
    from autotune import spec as S

    if extra:
        raise UserError(
            f"`{' '.join([str(spec_path), *extra])}`: a training command goes after `--`: "
            f"`autotune search [OPTIONS] -- {' '.join([str(spec_path), *extra])}`"
        )
    if command is None:
        if spec_path is not None and spec_path.suffix == ".py":
            raise UserError(
                f"`{spec_path}` is a program, not a spec: run it after `--`, `autotune search -- python {spec_path}`"
            )
        return None
    if not command:
        raise UserError(
            "nothing after `--`: give your training command there, e.g. `autotune search -- python train.py`"
        )
    if spec_path is not None:
        raise UserError(
            f"give a spec or a command after `--`, not both: `{spec_path}` names its own program (workload.command)"
        )
    if resume is not None:
        raise UserError(
            f"give `--resume RUN_DIR` or a command after `--`, not both: a resumed search runs the command it "
            f"was started with (`{resume / 'spec.yaml'}`)"
        )
    from autotune.execution.program import not_found

    spec = S.for_command(command, os.getcwd())  # a launcher's line read first: what each rank runs must start
    why = not_found(spec.workload.command, os.getcwd())
    if why:
        raise UserError(f"{why}: give the command that runs your training, e.g. `autotune search -- python train.py`")
    return spec


@dataclass(frozen=True, kw_only=True)
class Overrides:
    """What the line's options set over the spec (None: the spec's own). A resumed search keeps its output dir
    and its MLflow store: `--output-dir` and `--tracking-uri` leave it as it was."""

    output_dir: Optional[Path] = None
    address: Optional[str] = None
    tracking_uri: Optional[str] = None
    budget: Optional[str] = None  # a duration as typed: 300, 90s, 5m, 1h
    n_trials: Optional[int] = None
    first_step_limit: Optional[str] = None  # a duration as typed
    seed: Optional[int] = None
    keep_compile_cache: Optional[bool] = None

    def apply(self, spec, *, resumed: bool) -> None:
        """Set them on `spec`; a duration that is not one, or fewer than one trial, is the user's error."""
        from autotune.decide.budget import parse_duration

        if self.output_dir is not None and not resumed:
            spec.output_dir = self.output_dir
        if self.address is not None:
            spec.resources.ray_address = self.address
        try:
            if self.budget is not None:
                spec.search.time_budget_s = parse_duration(self.budget)
            if self.first_step_limit is not None:
                spec.trial.first_step_s = parse_duration(self.first_step_limit, "--first-step-limit")
        except ValueError as e:
            raise UserError(str(e)) from None
        if self.n_trials is not None:
            if self.n_trials < 1:
                raise UserError(f"--n-trials: give 1 or more (the baseline is the first trial), got {self.n_trials}")
            spec.search.n_trials = self.n_trials
        if self.seed is not None:
            spec.search.seed = self.seed
        if self.keep_compile_cache is not None:
            spec.search.keep_compile_cache = self.keep_compile_cache
        if self.tracking_uri is not None and not resumed:
            spec.tracking.uri = self.tracking_uri


def _run(spec, *, quiet: bool, reuse: bool, refresh: bool, resume: bool, backend: str):
    """The search, its trials shown as they run (the live view; `quiet`: a line each), then its last screen.
    Ctrl-C: the line that says how to continue it, exit 130."""
    from autotune import api
    from autotune.cli import live

    view = live.LiveView(quiet=quiet)
    try:
        result = api.search(spec, reuse=reuse, refresh=refresh, resume=resume, callbacks=[view], backend=backend)
    except KeyboardInterrupt:
        report.error(
            f"interrupted; finished trials are saved: continue with `autotune search --resume "
            f"{spec.resolved_output_dir()}`"
        )
        raise typer.Exit(130) from None
    finally:
        view.stop()
    # knob importance as the plots computed it (none for a reused result: `autotune report RUN_DIR`)
    report.summary(result, result.importance)
    return result
