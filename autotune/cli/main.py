"""`autotune`: the command line. Thin: parse, call, print. Heavy imports happen
inside the commands, so `autotune --help` stays fast."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperCommand

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Measured performance tuning for PyTorch training.",
)


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit code 2."""


def _fail(e: Exception, debug: bool) -> None:
    from autotune.cli.report import error

    if debug:
        raise e
    error(str(e))
    raise typer.Exit(2)


def _user_errors():
    from autotune.spec import SpecError
    from autotune.trial.runner import TrialConfigError
    from autotune.workload import WorkloadError

    return (UserError, SpecError, WorkloadError, TrialConfigError)


COMMAND = "program_command"  # ctx.meta: what follows `--` on `autotune search`'s line (None: no `--`)


class _WithCommand(TyperCommand):
    """A command whose line may end with `-- PROGRAM ARGS`: that tail is kept whole in `ctx.meta[COMMAND]`
    (the program's own options are never read as autotune's), the rest parsed as usual."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        ctx.meta[COMMAND] = args[args.index("--") + 1 :] if "--" in args else None
        return super().parse_args(ctx, args[: args.index("--")] if "--" in args else args)


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


@app.command(cls=_WithCommand, context_settings={"allow_extra_args": True})
def search(
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
        from autotune import spec as S

        command_spec = _command_spec(ctx.meta.get(COMMAND), ctx.args, spec_path, resume)

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
        elif command_spec is not None:
            spec = command_spec
        elif spec_path is None:
            raise UserError(
                "give a spec (`autotune search spec.yaml`), a training command after `--` (`autotune search -- "
                "python train.py`) or a search to continue (`--resume RUN_DIR`)"
            )
        else:
            spec = S.load(spec_path)
        if output_dir is not None and resume is None:
            spec.output_dir = output_dir
        if address is not None:
            spec.resources.ray_address = address
        from autotune.decide.budget import parse_duration

        try:
            if budget is not None:
                spec.search.time_budget_s = parse_duration(budget)
            if first_step_limit is not None:
                spec.trial.first_step_s = parse_duration(first_step_limit, "--first-step-limit")
        except ValueError as e:
            raise UserError(str(e)) from None
        if n_trials is not None:
            if n_trials < 1:
                raise UserError(f"--n-trials: give 1 or more (the baseline is the first trial), got {n_trials}")
            spec.search.n_trials = n_trials
        if seed is not None:
            spec.search.seed = seed
        if tracking_uri is not None and resume is None:
            spec.tracking.uri = tracking_uri
        from autotune import api
        from autotune.cli import live, report

        view = live.LiveView(quiet=quiet)
        try:
            result = api.search(
                spec, reuse=reuse, refresh=refresh, resume=resume is not None, callbacks=[view], backend=backend
            )
        except KeyboardInterrupt:
            from autotune.cli.report import error

            error(
                f"interrupted; finished trials are saved: continue with `autotune search --resume "
                f"{spec.resolved_output_dir()}`"
            )
            raise typer.Exit(130) from None
        finally:
            view.stop()
        # knob importance as the plots computed it (none for a reused result: `autotune report RUN_DIR`)
        report.summary(result, result.importance)
    except _user_errors() as e:
        _fail(e, debug)
    if result.stopped_reason:
        raise typer.Exit(1)


def _study(run_dir: Path) -> tuple[str, str]:
    """The search's Optuna storage and its study."""
    from autotune.records.state import SearchState

    study = SearchState.read(run_dir).optuna_study
    return f"sqlite:///{(run_dir / 'optuna.db').resolve()}", study


def _read_run(run_dir: Path):
    from autotune.records.run_dir import read_run

    try:
        return read_run(run_dir)
    except FileNotFoundError as e:
        raise UserError(f"{e}; run `autotune search spec.yaml` first, or pass its output dir") from None


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="a search's output dir"),
    fmt: str = typer.Option("text", "--format", "-f", help="text | json | markdown"),
    plots: bool = typer.Option(True, help="(re)draw the plots into RUN_DIR/plots"),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks"),
) -> None:
    """Summarize a finished or interrupted search (and draw its plots)."""
    try:
        if fmt not in ("text", "json", "markdown"):
            raise UserError(f"--format `{fmt}` is not one of: text, json, markdown")
        result = _read_run(run_dir)
    except _user_errors() as e:
        _fail(e, debug)
    import json

    from autotune.cli import report as R
    from autotune.export import analysis
    from autotune.records import plots as P

    drawn, importance = [], None
    if (run_dir / "optuna.db").exists():  # a run dir copied without its databases (*.db) reads without them
        storage, study = _study(run_dir)
        drawn = P.write_all(result, storage, study) if plots and result.best else []
        importance = result.importance if drawn else P.knob_importance(storage, study)
    if fmt == "json":
        data = {**analysis.as_dict(result, importance), "plots": [str(p) for p in drawn]}
        print(json.dumps(data, indent=2, default=str))
    elif fmt == "markdown":
        print(R.as_markdown(result, importance), end="")
    else:
        R.report(result, importance, drawn)


def _best_config(path: Path) -> dict:
    """`path`'s best_config.yaml content; one that is not one is the user's error."""
    from autotune.export import load

    try:
        return load.read(path)
    except ValueError as e:
        raise UserError(str(e)) from None


@app.command()
def export(
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
        from autotune.records.run_dir import run_paths

        data = {"knobs": {}}
        if run_dir is not None:
            best = run_paths(run_dir)["best_config"]
            if not best.exists():
                raise UserError(
                    f"`{run_dir}` has no best_config.yaml (no search there, or its baseline never "
                    "finished); run `autotune search spec.yaml` first"
                )
            data = _best_config(best)
        if from_online is not None:
            from autotune.online.loader import settings_from_log

            if not from_online.is_file():
                raise UserError(f"`{from_online}` is not a file: give the log an OnlineLoader wrote (`log=`)")
            try:
                data = E.with_online(data, settings_from_log(from_online))
            except ValueError as e:
                raise UserError(str(e)) from None
        text = E.render(data, fmt)
    except _user_errors() as e:
        _fail(e, debug)
    if output:
        output.write_text(text)
        from autotune.cli.report import console

        console.print(f"wrote {output}")
    else:
        print(text, end="")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
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
        data = _best_config(config)
        workload = data.get("workload") or {}
        command, cwd = (list(ctx.args), None) if ctx.args else (workload.get("command"), workload.get("dir"))
        if not command:
            raise UserError(
                "no program to run: give its command after `--`, e.g. "
                "`autotune run best_config.yaml -- python train.py`"
            )
        from autotune.execution.launcher import program_command

        command = program_command(command)  # `python`: the interpreter autotune runs in, as in the trials
        program = shutil.which(command[0])
        if program is None:
            raise UserError(f"`{command[0]}` is not a command on PATH")
    except _user_errors() as e:
        _fail(e, debug)
    from autotune import instrument

    from autotune.config import _set_knobs
    from autotune.knobs import environment

    env = {
        **os.environ,
        **{k: str(v) for k, v in (workload.get("env") or {}).items()},
        **environment(_set_knobs(data), dict(os.environ)),  # the allocator's, as its trials started
        "AUTOTUNE_CONFIG": str(config.resolve()),
    }
    sys.stdout.flush()
    if cwd:
        os.chdir(cwd)
    os.execve(program, command, instrument.with_env({k: v for k, v in env.items() if v != ""}))  # '': unset


@app.command()
def ui(
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
    except _user_errors() as e:
        _fail(e, debug)
    from autotune.cli.report import console

    url = _trials_url(run_dir, db, f"http://127.0.0.1:{port}")
    console.print(f"MLflow UI for {run_dir}: [bold]{url}[/] (its trials, fastest first; Ctrl-C to stop)")
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
