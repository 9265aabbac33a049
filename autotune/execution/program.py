"""A user's own program as the workload (`workload.command`): before a search
starts, one probe run of it at its own settings (warm-up 1, a 2-step window)
tells what the space can be (the autotune.config() methods it calls: a knob
whose method it never calls is "not used by your program"; what its model cannot
take, a knob or one of its values, with the reason), the knob values it runs with
on its own (its attention kernel, TRL's checkpointing and packing, its DataLoader's
arguments, a Trainer script's batch, loader, precision and optimizer: the baseline's),
and its samples per step (the baseline batch size); a program that cannot be a trial (the command
does not run, it exits before its first step, or finishes no optimizer step within its first-step
limit, which never runs past the search's time budget: `probe_limits`) is refused in one line before
any trial runs, saying what it did and where it was (the probe's trial.log kept)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from autotune import knobs as K
from autotune.config import unused
from autotune.execution.launcher import Launch, run_in_process, user_thread_env
from autotune.records.run_dir import compile_cache_of
from autotune.execution.watch import Limits
from autotune.spec import SpecError, UserKnob, WorkloadSpec
from autotune.trial.result import TrialResult

PROBE_DIR = "probe"


@dataclass
class Program:
    used: list[str]  # the autotune.config() methods it called
    batch_size: int  # samples per step, as it reported them
    result: TrialResult  # the probe's result
    baseline: dict | None = None  # knobs a workload states itself: a program's own settings, as the probe found them
    cannot: dict[str, str] | None = None  # what its model cannot take: "knob" or "knob=value" -> why

    def record(self) -> dict:
        """What search.json keeps of the probe (`SearchState.program`): the methods, its own knob values."""
        return {"used": self.used, "own": self.baseline or {}}


def probe(
    workload: WorkloadSpec,
    run_dir: Path,
    user_path: str | None,
    *,
    ranks: int = 1,
    timeout_s: float,
    shared: str | None = None,
    limits: Limits | None = None,
) -> Program:
    """Run the program once at its own settings (see the module doc), on `ranks` processes, killed after
    `timeout_s` (the trial's), or without a first step within `limits` (`probe_limits`); `shared`: the search's
    fork server's socket (the probe's wait for its imports is the later trials' gain)."""
    wl = workload.model_dump(mode="json")
    wl["dir"] = wl.get("dir") or os.getcwd()
    config = {
        "workload": {k: v for k, v in wl.items() if v is not None},
        "knobs": {},
        "warmup_steps": 1,
        "measure_steps": 2,
        "min_window_s": 0.0,
        "max_window_s": 5.0,
        "profile_steps": 0,
        "diagnose": False,
        **({"ranks": ranks} if ranks > 1 else {}),
    }
    where = run_dir / PROBE_DIR
    launch = Launch(shared=shared, compile_cache=str(compile_cache_of(run_dir)))  # a program's own compile: shared
    result = run_in_process(config, where, timeout_s, user_path, user_thread_env(), launch=launch, limits=limits)
    if result.status not in ("ok", "pruned"):
        why = result.error or result.status
        if result.error_type not in ("NoStep", "CommandNotFound"):
            why = (
                f"the program failed in its first steps at its own settings ({result.error_type}: {why}); "
                f"see {where / 'trial.log'}"
            )
        raise SpecError(f"workload.command: {why}")
    m = result.metrics
    per_rank = m["samples_per_s"] / m["steps_per_s"] / m.get("ranks", 1)  # a rank's batch, as the built-in's
    from autotune.knobs import canonical

    own = canonical(result.own_knobs or {})
    return Program(result.used or [], max(1, round(per_rank)), result, own or None, result.cannot or {})


def probe_limits(first_step_s: float, budget_s: float | None, spent_s: float) -> Limits:
    """The probe's first-step limit: `first_step_s` (trial.first_step_s), or what is left of the search's time
    budget (`budget_s`, `spent_s` of it gone) where that is less: the probe never waits past the budget (its
    wait for the fork server's imports included)."""
    if budget_s is None:
        return Limits(first_step_s)
    left = max(0.0, budget_s - spent_s)
    by = time.monotonic() + left
    if left < first_step_s:
        return Limits(left, "what was left of the time budget; `--budget` sets it", by)
    return Limits(first_step_s, first_step_by=by)


def not_found(command: list[str], dir: str | Path) -> str | None:
    """Why `command` cannot start in `dir`, checked before anything runs: its program is not a command on PATH
    (or, given as a path, not a file there), or a Python interpreter's script is not there. None: it can start
    (whether it then runs is the probe's to find)."""
    import re
    import shutil

    from autotune.execution.launcher import program_command

    program = program_command(command)[0]
    if os.sep in program:
        if not os.access(Path(dir, program), os.X_OK) or Path(dir, program).is_dir():
            return f"`{command[0]}` is not a program in {dir}"
    elif shutil.which(program) is None:
        return f"`{command[0]}` is not a command on PATH"
    if not re.fullmatch(r"python[\d.]*", Path(command[0]).name):
        return None
    args = iter(command[1:])
    for arg in args:  # the interpreter's own options, then its script (none with -m or -c: a module, a string)
        if arg in ("-m", "-c") or arg.startswith(("-m", "-c")) and not arg.startswith("--"):
            return None
        if arg in ("-W", "-X"):
            next(args, None)
        elif not arg.startswith("-"):
            return None if Path(dir, arg).is_file() else f"`{arg}` not found in {dir}"
    return None


def inert(own: dict, device, given: dict) -> dict:
    """The program's own knob values that `device` cannot run (a Trainer's default pinned memory on a CPU: torch
    ignores it there), as PyTorch's defaults, which its baseline says instead: a trial never sets them, so the
    program keeps its own, to the same effect. A spec's `given` baseline stays as it says."""
    return {
        k: K.KNOBS[k].pytorch_default
        for k, v in own.items()
        if k in K.KNOBS and k not in given and K.KNOBS[k].unavailable(v, device)
    }


# the batch of a loop whose DataLoader alone carries it, where the search keeps the effective batch
NO_ACCUMULATION = (
    "your loop's batch reaches autotune only through its DataLoader, and its gradient accumulation is its own code: "
    "a smaller micro-batch would change the optimization (safety.level: dynamics without keep_effective_batch "
    "searches the batch itself)"
)


def fix_unused(space, used: list[str], cannot: dict[str, str] | None = None, *, keep_effective_batch=False) -> None:
    """Knobs the program cannot take (`autotune.config.unused`, or its model cannot: `cannot`) out of the
    space, with the reason; a value its model cannot take ("knob=value") out of the knob's values, and the
    knob fixed where one value is left. Where the search keeps the effective batch, a batch that only its
    DataLoader carries (torch's hooks: no method, no Trainer argument sets the accumulation) is fixed too."""
    cannot = dict(cannot or {})
    if keep_effective_batch and "torch:loader" in used and "dataloader_kwargs" not in used:
        cannot.setdefault("batch_size", NO_ACCUMULATION)
    for name in list(space.search):
        why = unused(name, used) or cannot.get(name)
        refused = [v for v in space.search[name] if f"{name}={v}" in cannot and v != space.baseline.get(name)]
        space.dropped += [f"{name}={v!r}: {cannot[f'{name}={v}']}" for v in refused]
        left = [v for v in space.search[name] if v not in refused]
        if why or len(left) < 2:
            del space.search[name]
            space.fixed[name] = why or cannot[f"{name}={refused[-1]}"]
        else:
            space.search[name] = left


def flag_baseline(command: list[str], workload_args: dict[str, UserKnob]) -> dict:
    """The program's own value of each searched flag (`workload_args`, the search space's), as `command` gives it
    (a switch left out: false); a flag the command does not give is refused,
    since the baseline must be what the program runs."""
    import yaml

    from autotune.trial.request import flag_value

    out = {}
    for name, knob in workload_args.items():
        syntax = knob.syntax(name)
        if syntax["env"]:
            text = os.environ.get(name, "")
            out[name] = next((v for v in knob.values if str(v) == text), text)
            continue
        found, text = flag_value(command, syntax)
        if syntax["switch"]:
            out[name] = found
            continue
        if not found or text is None:
            raise SpecError(
                f"search_space.workload_args.{name}: workload.command does not give `{syntax['flag']}`; "
                "write it in the command with your program's current value (the baseline)"
            )
        bools = dict(zip(syntax["bool_text"], (True, False)))
        out[name] = (
            bools[text]
            if text in bools and all(isinstance(v, bool) for v in knob.values)
            else next((v for v in knob.values if str(v) == text), None)
        )
        if out[name] is None:
            out[name] = yaml.safe_load(text)
    return out
