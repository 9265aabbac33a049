"""The search spec (spec.yaml) as typed models, every error naming its field path, and its reading: parsed from a
file, a dict or a command (`load`, `parse`, `for_command`), its output dir checked. What a search runs from is the
plan it is resolved into once (`autotune.plan.SearchPlan`).

Over 600 lines because each section's model carries its fields' descriptions (docs/spec.md is generated from them)
and the checks that name a field's path beside the field."""

from __future__ import annotations

import errno
import os
import re
import shlex
import sys
import tempfile
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import (
    BaseModel,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from autotune.knobs import KNOBS, SAFETY_CLASSES, STAGES, USER_PREFIX, Knob
from autotune.workload import BUILTINS

FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class SpecError(Exception):
    """A spec that cannot be used; str() is the message a user sees."""


class _Strict(BaseModel):
    """Unknown keys are errors that list the allowed keys."""

    @model_validator(mode="before")
    @classmethod
    def _no_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = [k for k in data if k not in cls.model_fields]
            if unknown:
                raise ValueError(f"unknown key `{unknown[0]}`; allowed: {', '.join(cls.model_fields)}")
        return data


class Launcher(_Strict):
    """How a launcher's line (`torchrun ...`, `accelerate launch ...`) starts the ranks of `workload.command`."""

    command: list[str] = Field(
        ..., description="the launcher's part of your command line, up to the script (`torchrun --nproc-per-node 2`)"
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="what it sets for each rank beyond torchrun's environment (accelerate's ACCELERATE_*)",
    )
    rank_env: StrictBool = Field(
        True, description="its ranks get torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR...), one rank too"
    )


class WorkloadSpec(_Strict):
    name: Optional[str] = Field(None, description=f"a built-in workload: {', '.join(BUILTINS)}")
    factory: Optional[str] = Field(None, description="a user factory `pkg.module:function` returning autotune.Workload")
    pickled: Optional[str] = Field(
        None,
        description="set by autotune.search(spec, workload=fn): the qualified name of a factory given in Python, "
        "kept pickled in the run dir's workload.pkl (what --resume loads)",
    )
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the factory")
    command: Optional[Union[list[str], str]] = Field(
        None,
        description="your own training program, e.g. `python train.py --config small.yaml` (a list, or a string "
        "split as a shell would): each trial runs it with AUTOTUNE_TRIAL set; it measures itself "
        "through autotune.config(). A launcher's line (`torchrun --nproc-per-node 2 train.py`, `python -m "
        "torch.distributed.run ...`, `accelerate launch ...`) becomes what each rank runs (`python train.py`), "
        "its ranks resources.ranks_per_trial, the rest `launcher`",
    )
    launcher: Optional[Launcher] = Field(
        None, description="set from a launcher's line in `command`: the launcher's part, its ranks' environment"
    )
    dir: Optional[str] = Field(None, description="where `command` runs (default: the spec file's directory)")

    @field_validator("command")
    @classmethod
    def _command(cls, v):
        if isinstance(v, str):
            try:
                v = shlex.split(v)
            except ValueError as e:
                raise ValueError(f"cannot be split as a shell would: {e}") from None
        if v is not None and (not v or not all(isinstance(a, str) and a for a in v)):
            raise ValueError("must be a non-empty command, e.g. `python train.py`")
        return v

    @field_validator("name")
    @classmethod
    def _builtin(cls, v):
        if v is not None and v not in BUILTINS:
            raise ValueError(f"`{v}` is not a built-in workload; built-ins: {', '.join(BUILTINS)}")
        return v

    @field_validator("factory")
    @classmethod
    def _factory_path(cls, v):
        if v is not None and not FACTORY_RE.match(v):
            raise ValueError(f"`{v}` is not of the form `pkg.module:function`")
        return v

    @model_validator(mode="after")
    def _one_of(self):
        if sum(v is not None for v in (self.name, self.factory, self.pickled, self.command)) != 1:
            raise ValueError(
                "give exactly one of `name` (built-in), `factory` (pkg.module:function) or `command` (your own program)"
            )
        if self.launcher and not self.command:
            raise ValueError("`launcher` goes with `command` (what each rank runs), not alone")
        return self

    @property
    def ref(self) -> str:
        """How records name the factory: the built-in, the factory path, the pickled callable's name, or the command."""
        if self.command:
            return shlex.join(self.line())
        return self.factory or self.name or self.pickled  # type: ignore[return-value]

    def line(self, command: list[str] | None = None) -> list[str]:
        """Your own command line: `command` (default: the workload's, what each rank runs; a trial's, its flags
        written) under its launcher as you gave it (`torchrun --nproc-per-node 2 train.py ...`), else itself."""
        from autotune.launch_command import line

        command = list(command or self.command or [])
        return line(self.launcher.command, command) if self.launcher else command


def _value_type(knob: Knob):
    """The pydantic type of one value of a knob, from the registry (with its older spellings: `Knob.aliases`)."""
    if knob.choices:
        if knob.aliases:
            return Union[Literal[knob.choices], StrictBool]  # type: ignore[valid-type]
        return Literal[knob.choices]  # type: ignore[valid-type]
    return {int: StrictInt, bool: StrictBool, str: str}[knob.type]


def _describe_knob(knob: Knob) -> str:
    values = " | ".join(knob.choices) if knob.choices else knob.type.__name__
    return f"{knob.help} ({values}{' or null' if knob.nullable else ''})"


class _KnobSettingsBase(_Strict):
    @field_validator("*")
    @classmethod
    def _canonical(cls, v, info):
        return KNOBS[info.field_name].canonical(v)


# One value per knob; None means "PyTorch's default" (batch size: the workload's).
KnobSettings = create_model(
    "KnobSettings",
    __base__=_KnobSettingsBase,
    **{
        name: (Optional[_value_type(k)], Field(None, ge=k.minimum, description=_describe_knob(k)))
        for name, k in KNOBS.items()
    },
)


class _KnobListsBase(_Strict):
    """The values to search, per knob; a knob left out stays at its baseline value."""

    @field_validator("*")
    @classmethod
    def _check(cls, v, info):
        if v is not None and len(v) == 0:
            raise ValueError("must not be empty; leave the knob out to keep its baseline value")
        knob = KNOBS[info.field_name]
        low = knob.minimum
        if v is not None and low is not None and any(x is not None and x < low for x in v):
            raise ValueError(f"values must be >= {low}, got {v}")
        return None if v is None else [knob.canonical(x) for x in v]

    def given(self) -> dict[str, list]:
        return {k: list(dict.fromkeys(v)) for k, v in self.model_dump().items() if v is not None}


KnobLists = create_model(
    "KnobLists",
    __base__=_KnobListsBase,
    **{
        name: (
            Optional[list[Optional[_value_type(k)]] if k.nullable else list[_value_type(k)]],
            Field(None, description=_describe_knob(k)),
        )
        for name, k in KNOBS.items()
    },
)


class UserKnob(_Strict):
    """A workload factory argument searched like a knob (`search_space.workload_args`)."""

    values: list[Union[StrictBool, StrictInt, StrictFloat, str]] = Field(
        ...,
        min_length=1,
        description="the values to try (the baseline's value, from workload.args or the "
        "factory's default, is always tried)",
    )
    safety: Literal[SAFETY_CLASSES] = Field(  # type: ignore[valid-type]
        "dynamics",
        description="what changing it may do to training: safe | reproducibility | numerics | dynamics "
        "(default: dynamics, it may change training)",
    )
    stage: Optional[Literal[tuple(s for s in STAGES if s != "workload")]] = Field(  # type: ignore[misc]
        None,
        description="where it acts (loader: the input pipeline, model, step, process, backend), so the "
        "diagnosis can move it",
    )
    flag: Optional[str] = Field(
        None,
        description="for a program (workload.command): its flag, `--name` (written `--name value`) or `--name=` "
        "(written `--name=value`); default `--NAME`. It replaces the same flag in the command",
    )
    switch: StrictBool = Field(False, description="a boolean written as the flag alone (present: true, absent: false)")
    bool_text: Optional[tuple[str, str]] = Field(
        None, description="how the program reads a boolean value, [true, false] (default: true, false)"
    )
    env: StrictBool = Field(
        False,
        description="for a program: an environment variable of its process (OMP_NUM_THREADS, ...), not a "
        "flag; its baseline is this environment's value ('' where unset: left unset)",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data):
        return {"values": data} if isinstance(data, list) else data

    def syntax(self, name: str) -> dict[str, Any]:
        """How the program's command writes this knob (`request.with_flags`)."""
        from autotune.trial.request import flag_syntax

        return flag_syntax(name, self.model_dump())


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("search_spaces").iterdir() if p.name.endswith(".yaml"))


def load_preset(name: str) -> KnobLists:
    if name not in preset_names():
        raise ValueError(f"unknown preset `{name}`; presets: {', '.join(preset_names())}")
    text = resources.files("search_spaces").joinpath(f"{name}.yaml").read_text()
    return KnobLists.model_validate(yaml.safe_load(text) or {})


class SearchSpaceSpec(_Strict):
    preset: Optional[Union[str, list[str]]] = Field(
        "default",
        description="a preset from search_spaces/, or several, each one's lists over the ones before "
        "([default, lm]: a language model's knobs beside the default ones); null: only the knobs given here",
    )
    knobs: KnobLists = Field(default_factory=KnobLists, description="per-knob values, overriding the preset's")
    workload_args: dict[str, UserKnob] = Field(
        default_factory=dict,
        description="your workload factory's arguments searched as knobs, e.g. "
        "{gpu_normalize: {values: [false, true], safety: safe}}",
    )

    @field_validator("workload_args")
    @classmethod
    def _identifiers(cls, v):
        bad = [name for name in v if not name.isidentifier()]
        if bad:
            raise ValueError(f"`{bad[0]}` is not a keyword argument name")
        return v

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data):
        return {"preset": data} if isinstance(data, (str, list)) else data

    @field_validator("preset")
    @classmethod
    def _known(cls, v):
        for name in [v] if isinstance(v, str) else v or []:
            load_preset(name)
        return v

    def lists(self) -> dict[str, list]:
        """Values per knob: the preset's, the spec's knobs, the user knobs as `args.NAME`."""
        base = {}
        for name in [self.preset] if isinstance(self.preset, str) else self.preset or []:
            base.update(load_preset(name).given())
        user = {USER_PREFIX + n: list(dict.fromkeys(k.values)) for n, k in self.workload_args.items()}
        return {**base, **self.knobs.given(), **user}

    def flags(self) -> dict[str, dict]:
        """Each searched argument's flag syntax, for a program (workload.command)."""
        return {n: k.syntax(n) for n, k in self.workload_args.items()}

    def user(self) -> dict[str, dict]:
        """The user knobs: name -> {safety, stage} (what `autotune.knobs.user_knob` takes)."""
        return {n: {"safety": k.safety, "stage": k.stage} for n, k in self.workload_args.items()}


class TrialSpec(_Strict):
    warmup_steps: StrictInt = Field(5, ge=0, description="untimed steps (worker start, compile, autotuning)")
    measure_steps: Optional[StrictInt] = Field(None, ge=2, description="fewest steps in the timed window (default: 10)")
    min_window_s: float = Field(1.0, ge=0, description="the timed window runs at least this long")
    target_ci: float = Field(
        0.02, gt=0, description="then until the step-time mean is known to +- this (95% confidence)"
    )
    max_window_s: float = Field(
        30.0, gt=0, description="or until this long (or 50x measure_steps, at least 1500 steps), whichever is first"
    )
    profile_steps: StrictInt = Field(5, ge=0, description="steps in the separate profiled window (0: no profile)")
    diagnose: StrictBool = Field(True, description="count FLOPs, probe 2x the batch, and diagnose the bottleneck")
    timeout_s: float = Field(600, gt=0, description="a trial running longer is killed and recorded as timed out")
    first_step_s: float = Field(
        120,
        gt=0,
        description="a probe of your own program (workload.command), and the baseline trial, that has finished no "
        "optimizer step this long after it started is ended, its stacks in its trial.log: a probe is refused, the "
        "search with it; a trial is recorded as hung. Later trials get 3x the baseline's time to its first step "
        "plus 30 s where that is less, its clock stopped while torch.compile works (3x the compiled first steps "
        "measured, 10 minutes before any). Never past search.time_budget_s",
    )
    stall_s: Optional[float] = Field(
        None,
        gt=0,
        description="a trial with no optimizer step this long after its last (once it took its first) is ended, "
        "every process's stacks in its trial.log, and recorded as hung; what hung (loader workers, a parallel "
        "setting) is not tried again. Default: 10x the baseline's p95 step time plus 10 s (torch.compile at work "
        "mid-run has the compile's limit). `autotune run` applies none",
    )
    prune_margin: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="a trial whose throughput is clearly (95% confidence) below the best so far less "
        "this fraction stops its window early and skips profile, diagnosis and parity (0: never)",
    )


class SearchSettings(_Strict):
    sampler: Literal["autotune", "tpe", "random", "grid"] = Field(
        "autotune",
        description="autotune: the baseline's diagnosis first, then one knob at a time, then TPE; "
        "tpe, random: Optuna's samplers; grid: every point (a whole landscape)",
    )
    n_trials: Optional[StrictInt] = Field(
        None,
        ge=1,
        description="trials in all, the baseline included; the first limit reached (n_trials, "
        "time_budget_s, patience, nothing left to try) ends the search. Left out: 20, or "
        "with a time_budget_s no cap but the space's points",
    )
    time_budget_s: Optional[float] = Field(
        None, gt=0, description="stop starting trials after this many seconds (or at n_trials, whichever is first)"
    )
    seed: StrictInt = Field(0, description="sampler seed")
    patience: Optional[StrictInt] = Field(
        None,
        ge=1,
        description="stop after this many trials in a row without a gain above min_improvement (grid: never)",
    )
    min_improvement: float = Field(0.02, ge=0, description="a gain below this fraction is noise: it moves nothing")
    reference_share: float = Field(
        0.10,
        ge=0,
        lt=0.5,
        description="the baseline is read again between trials (a fresh process, its timed window alone), its "
        "reads taking at most this share of the search's time, and each trial's speedup is taken against the "
        "baseline read near its own time (the host's speed drifts), the incumbent read afresh beside it (its "
        "figure is then not the best of many noisy reads); 0: every trial against the baseline's first read",
    )
    reference_reads: Literal["drifting", "always"] = Field(
        "drifting",
        description="drifting: the reads start once the search's own reads show the host drifting beyond the "
        "pairs' noise (the baseline's two reads apart by more than two fresh processes of one config allow, or a "
        "trial measured under outside load; on a quiet host they change no decision and cost up to a third of a "
        "short search); always: from the first trial on",
    )
    confirm_rounds: StrictInt = Field(
        3,
        ge=0,
        description="after the trials, the baseline and the best measured again this many times each, "
        "interleaved, a fresh process each; the speedup reported is the median of the paired "
        "ratios, and a best not faster in every pair ties with the baseline (0: no re-measuring; "
        "at most: stopping once two pairs within 10% of each other and the trials are all over 1.5x)",
    )
    confirm_spacing_s: float = Field(
        10.0,
        ge=0,
        description="pairs whose baseline reads more than 15% away from every read of it in the search, or whose "
        "ratios spread wider than fresh processes of one config allow, are taken again, this many seconds apart "
        "(within the time budget); if those disagree too, the claim is unsettled: both figures, no single number",
    )
    keep_compile_cache: StrictBool = Field(
        False,
        description="keep the trials' shared inductor and Triton caches (the run dir's compile-cache/) after the "
        "search; removed at its end by default (the winner's compiled artifacts stay beside best_config.yaml)",
    )


class Resources(_Strict):
    ray_address: Optional[str] = Field(None, description="an existing Ray cluster; default: a local Ray on 127.0.0.1")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where trials run")
    cpus_per_trial: Optional[StrictInt] = Field(
        None,
        ge=1,
        description="default: num_workers + 1 with a GPU; without one, every CPU but one (one trial at a time)",
    )
    gpus_per_trial: Optional[float] = Field(None, ge=0, description="default: ranks_per_trial with CUDA, else 0")
    ranks_per_trial: StrictInt = Field(
        1,
        ge=1,
        description="processes per trial, one device each (DDP or FSDP over torch.distributed: gloo on CPUs, "
        "nccl on GPUs); on a CPU host at most its CPUs",
    )
    rank_placement: Literal["pack", "spread"] = Field(
        "pack",
        description="where a trial's ranks run: pack, on one node (forked by the trial process); spread, "
        "one rank per node of the Ray cluster (a STRICT_SPREAD placement group, each rank's "
        "bundle 1/ranks of the trial's CPUs, GPUs and custom resources)",
    )
    blocks: Optional[list[str]] = Field(
        None,
        description="class names of the model's repeated blocks, for FSDP and activation checkpointing "
        "(default: the module class with two or more instances holding the most parameters)",
    )
    memory_limit_gib: Optional[float] = Field(
        None,
        gt=0,
        description="a forced memory limit per trial process: the C allocator's bytes in use (sampled "
        "every ms) above it, checked after each backward, end the trial as out of memory "
        "(shows on a CPU what a GPU's memory bounds)",
    )
    custom: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources each trial needs, e.g. {gpu_h100: 1} for nodes "
        "started with --resources='{\"gpu_h100\": 8}'",
    )


class Safety(_Strict):
    level: Literal["strict", "numerics", "dynamics"] = Field(
        "numerics",
        description="strict: only safe knobs; numerics: + precision/compile/cudnn when loss parity passes; "
        "dynamics: + batch size",
    )
    tolerance: float = Field(0.05, gt=0, description="multi-step deviations from the baseline below this always pass")
    parity_steps: StrictInt = Field(20, ge=2, description="training steps of the multi-step parity check")
    keep_effective_batch: StrictBool = Field(
        False,
        description="search micro-batches that divide the baseline's effective batch (its micro-batch times its "
        "gradient accumulation: 2 x 4 tries 4 x 2 and 8 x 1), with the accumulation that keeps it, so the "
        "optimization batch never changes",
    )


class Tracking(_Strict):
    uri: Optional[str] = Field(None, description="MLflow tracking URI; default: sqlite:///<output_dir>/mlflow.db")
    experiment: str = Field("autotune", description="MLflow experiment name")


class Spec(_Strict):
    name: Optional[str] = Field(None, description="the search's name; default: the spec file's stem")
    workload: WorkloadSpec
    baseline: KnobSettings = Field(
        default_factory=KnobSettings, description="your current settings (default: PyTorch's)"
    )
    search_space: SearchSpaceSpec = Field(default_factory=SearchSpaceSpec)
    trial: TrialSpec = Field(default_factory=TrialSpec)
    search: SearchSettings = Field(default_factory=SearchSettings)
    resources: Resources = Field(default_factory=Resources)
    tracking: Tracking = Field(default_factory=Tracking)
    safety: Safety = Field(default_factory=Safety)
    output_dir: Optional[Path] = Field(None, description="default: runs/<name>-<timestamp>")

    def to_yaml(self) -> str:
        """The spec as resolved (the run dir's spec.yaml)."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def resolved_output_dir(self) -> Path:
        """The search's output dir, checked: a directory this process can create
        and write, on a disk with room (nothing is written to check it). The
        default, runs/<name>-<timestamp>, is fixed by the first call, so every
        later one (the interrupted line's `--resume DIR`) names the same dir."""
        if self.output_dir is None:
            self.output_dir = Path("runs") / f"{self.name}-{datetime.now():%Y%m%d-%H%M%S}"
        check_output_dir(self.output_dir)
        return self.output_dir


MIN_FREE_BYTES = 64 << 20  # a search writes its MLflow store, Optuna storage, trial files and traces


def check_output_dir(path: Path) -> None:
    """Refuse, in one line, an output dir that is a file, cannot be created or
    written, or is on a read-only or full disk: before anything starts."""
    fix = "name a directory you can write (it is created) or leave output_dir out for runs/<name>-<timestamp>"
    if path.exists() and not path.is_dir():
        raise SpecError(
            f"output_dir: `{path}` is a file, not a directory; name a directory "
            "(it is created) or leave output_dir out for runs/<name>-<timestamp>"
        )
    chain = (path.absolute(), *path.absolute().parents)
    existing = next(p for p in chain if p.is_dir())
    below = chain[chain.index(existing) - 1] if existing != chain[0] else None
    if below is not None and below.exists():
        raise SpecError(f"output_dir: `{path}` cannot be created: `{below}` is a file, not a directory; {fix}")
    try:
        fs = os.statvfs(existing)
    except OSError as e:
        raise SpecError(f"output_dir: `{path}` cannot be written: {e.strerror} (`{existing}`); {fix}") from None
    if fs.f_flag & os.ST_RDONLY:
        raise SpecError(f"output_dir: `{path}` is on a read-only file system (`{existing}`); {fix}")
    try:  # what a search will do there first: create a directory (removed at once)
        os.rmdir(tempfile.mkdtemp(prefix=".autotune-check-", dir=existing))
    except OSError as e:
        why = os.strerror(e.errno) if e.errno else str(e)
        raise SpecError(
            f"output_dir: `{path}` cannot be written: creating a directory in `{existing}` fails "
            f"({why}{'; the disk is full' if e.errno == errno.ENOSPC else ''}); {fix}"
        ) from None
    free = fs.f_bavail * fs.f_frsize
    if fs.f_blocks and free < MIN_FREE_BYTES:  # f_blocks 0: a pseudo file system that reports no sizes
        raise SpecError(
            f"output_dir: `{path}` is on a full disk ({free >> 20} MiB free in `{existing}`; a search "
            f"needs at least {MIN_FREE_BYTES >> 20} MiB for its stores and trial files); {fix}"
        )


def _describe(err: dict) -> str:
    path = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"{path}: required, missing"
    if err["type"] in ("value_error", "assertion_error"):
        return f"{path}: {msg}"
    return f"{path}: {msg}, got {err['input']!r}"


def parse(data: Any, source: str = "spec", factory_name: str | None = None, *, where: str | Path | None = None) -> Spec:
    """`factory_name`: a factory callable comes with the spec (`autotune.search(spec,
    workload=fn)`); the spec must not name another, and records it as `workload.pickled`. `where`: the directory a
    program runs from where the spec names none (a spec file's own). A launcher's line as the command is read into
    what it stands for (`launched`)."""
    if not isinstance(data, dict):
        raise SpecError(
            f"{source}: the spec must be a YAML mapping with at least `workload`, got {type(data).__name__}"
        )
    if factory_name is not None:
        wl = data.get("workload") or {}
        if not isinstance(wl, dict):
            raise SpecError(f"{source}: workload: expected a mapping (`args`, with a factory callable), got {wl!r}")
        named = next((f"{k}: {wl[k]}" for k in ("name", "factory", "pickled") if wl.get(k)), None)
        if named:
            raise SpecError(
                f"{source}: workload: the spec names `{named}` and a factory callable (`{factory_name}`) "
                "was given; give one (leave workload.name and workload.factory out to use the callable)"
            )
        data = {**data, "workload": {**wl, "pickled": factory_name}}
    data = _without_strategy(data, source)
    try:
        spec = Spec.model_validate(data)
    except ValidationError as e:
        # the first error of a field is the one to fix; union branches repeat it
        lines = list(dict.fromkeys(_describe(err) for err in e.errors(include_url=False)))
        raise SpecError(f"{source}: " + "\n  ".join(lines)) from e
    if spec.name is None:  # the file's name, else the factory's
        spec.name = (
            Path(source).stem
            if source != "spec"
            else re.sub(r"\W", "", (factory_name or "").rsplit(".", 1)[-1]) or "search"
        )
    if spec.workload.command and spec.workload.dir is None and where is not None:
        spec.workload.dir = str(Path(where).resolve())
    return launched(spec, source)


def launched(spec: Spec, source: str = "spec") -> Spec:
    """`spec` with a launcher's line as its command (`torchrun --nproc-per-node 2 train.py`, `python -m
    torch.distributed.run ...`, `accelerate launch ...`: autotune.launch_command) read into what it stands for: the
    command each rank runs (`python train.py`), as a trial forks it; the ranks its flags start as
    `resources.ranks_per_trial` (a different number given there is refused); the launcher's part of the line and
    the environment it gives each rank as `workload.launcher`. Another spec is returned as it is."""
    from autotune import launch_command as L

    wl = spec.workload
    if not wl.command or wl.launcher is not None:
        return spec
    try:
        launch = L.of(wl.command, wl.dir or os.getcwd())
    except L.LaunchError as e:
        raise SpecError(f"{source}: workload.command: {e}") from None
    if launch is None:
        return spec
    res = spec.resources
    if "ranks_per_trial" in res.model_fields_set and res.ranks_per_trial != launch.ranks:
        raise SpecError(
            f"{source}: resources.ranks_per_trial: {res.ranks_per_trial}, but `{shlex.join(launch.launcher)}` "
            f"starts {launch.ranks} rank{'s' if launch.ranks > 1 else ''}; leave ranks_per_trial out (the command's "
            "count is the trials') or give the same number"
        )
    wl.command = launch.command
    wl.launcher = Launcher(command=launch.launcher, env=launch.env, rank_env=launch.rank_env)
    res.ranks_per_trial = launch.ranks
    return spec


def _without_strategy(data: dict, source: str) -> dict:
    """`search.strategy`, from specs written before it left: `v2` (the search as it is) is accepted with a note,
    anything else is refused."""
    search = data.get("search")
    if not isinstance(search, dict) or "strategy" not in search:
        return data
    if search["strategy"] != "v2":
        raise SpecError(
            f"{source}: search.strategy: `{search['strategy']}` is gone; autotune searches one way "
            "(what v2 was): remove the line"
        )
    print(f"note: {source}: search.strategy: v2 is how autotune searches now; the line can go", file=sys.stderr)
    return {**data, "search": {k: v for k, v in search.items() if k != "strategy"}}


COMMAND_BUDGET_S = 600.0  # `autotune search -- CMD`'s time budget, where --budget does not give one
COMMAND_PRESETS = ("default", "lm")  # its space: the default knobs and a language model's, those the program takes


def for_command(command: list[str], dir: str | Path) -> Spec:
    """The spec `autotune search -- python train.py ARGS` stands for, with no spec file: the command is the
    workload, run from `dir`; its own settings are the baseline (its probe run reads them:
    autotune.execution.program); the space is the knobs of the default and lm presets that the program takes
    (COMMAND_PRESETS: a language model's knobs, beside the rest, where its model is one); the batch
    changes only as micro-batches with gradient accumulation at its own batch (`keep_effective_batch`), so the
    optimization it runs stays the same and the `numerics` level checks each change for loss parity; a time
    budget (COMMAND_BUDGET_S) ends it. Its name: the script's (`train` for `python train.py`), else the
    program's. A launcher's line (`torchrun --nproc-per-node 2 train.py`, `accelerate launch ...`) stands for its
    ranks, each running the script (`launched`)."""
    script = next((a for a in command[1:] if a.endswith(".py")), None)
    name = re.sub(r"[^\w.-]", "_", Path(script or command[0]).stem) or "search"
    return parse(
        {
            "name": name,
            "workload": {"command": list(command), "dir": str(Path(dir).resolve())},
            "search_space": {"preset": list(COMMAND_PRESETS)},
            "search": {"time_budget_s": COMMAND_BUDGET_S},
            "safety": {"level": "numerics", "keep_effective_batch": True},
        },
        "the command",
    )


def load(path: str | Path, factory_name: str | None = None) -> Spec:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"spec file `{path}` not found") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{where}: not valid YAML: {problem}") from e
    return parse(data, str(path), factory_name, where=path.resolve().parent)  # a program runs from its spec's directory


def as_spec(spec: Any, factory_name: str | None = None) -> Spec:
    """A typed Spec from a path, a dict or a Spec; `factory_name`: a factory
    callable comes with it (the spec then must not name another)."""
    if isinstance(spec, (str, Path)):
        return load(spec, factory_name)
    if isinstance(spec, Spec):
        return parse(spec.model_dump(mode="json"), "spec", factory_name) if factory_name else launched(spec)
    if isinstance(spec, dict):
        return parse(spec, "spec", factory_name)
    raise SpecError(f"spec: expected a spec file's path, a dict or an autotune.spec.Spec, got {type(spec).__name__}")
