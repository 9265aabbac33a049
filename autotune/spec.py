"""The search spec (spec.yaml) as typed models; every error names its field path."""

from __future__ import annotations

import re
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, Field, StrictBool, StrictInt, ValidationError, field_validator, model_validator

from autotune.knobs import COMPILE_MODES, PRECISIONS
from autotune.workload import BUILTINS

Precision = Literal[PRECISIONS]  # type: ignore[valid-type]
CompileMode = Literal[COMPILE_MODES]  # type: ignore[valid-type]
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


class WorkloadSpec(_Strict):
    name: Optional[str] = Field(None, description=f"a built-in workload: {', '.join(BUILTINS)}")
    factory: Optional[str] = Field(None, description="a user factory `pkg.module:function` returning autotune.Workload")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments for the factory")

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
        if (self.name is None) == (self.factory is None):
            raise ValueError("give exactly one of `name` (built-in) or `factory` (pkg.module:function)")
        return self

    @property
    def ref(self) -> str:
        return self.factory or self.name  # type: ignore[return-value]


class KnobSettings(_Strict):
    """One value per knob; None means "PyTorch's default" (batch size: the workload's)."""

    num_workers: Optional[StrictInt] = Field(None, ge=0, description="DataLoader worker processes")
    pin_memory: Optional[StrictBool] = Field(None, description="pinned host memory + non_blocking copies")
    batch_size: Optional[StrictInt] = Field(None, ge=1, description="samples per optimizer step")
    precision: Optional[Precision] = Field(None, description="32-true | tf32 | bf16-mixed | 16-mixed")
    compile: Optional[CompileMode] = Field(None, description="none | default | reduce-overhead | max-autotune")
    set_to_none: Optional[StrictBool] = Field(None, description="optimizer.zero_grad(set_to_none=...)")
    channels_last: Optional[StrictBool] = Field(None, description="channels_last memory format")
    cudnn_benchmark: Optional[StrictBool] = Field(None, description="torch.backends.cudnn.benchmark")


class KnobLists(_Strict):
    """The values to search, per knob; a knob left out stays at its baseline value."""

    num_workers: Optional[list[StrictInt]] = Field(None, description="e.g. [0, 2, 4, 8]")
    pin_memory: Optional[list[StrictBool]] = None
    batch_size: Optional[list[StrictInt]] = Field(None, description="a ladder, e.g. [32, 64, 128, 256]")
    precision: Optional[list[Precision]] = None
    compile: Optional[list[CompileMode]] = None
    set_to_none: Optional[list[StrictBool]] = None
    channels_last: Optional[list[StrictBool]] = None
    cudnn_benchmark: Optional[list[StrictBool]] = None

    @field_validator("*")
    @classmethod
    def _check(cls, v, info):
        if v is not None and len(v) == 0:
            raise ValueError("must not be empty; leave the knob out to keep its baseline value")
        low = {"num_workers": 0, "batch_size": 1}.get(info.field_name)
        if v is not None and low is not None and any(x < low for x in v):
            raise ValueError(f"values must be >= {low}, got {v}")
        return v

    def given(self) -> dict[str, list]:
        return {k: list(dict.fromkeys(v)) for k, v in self.model_dump().items() if v is not None}


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("search_spaces").iterdir() if p.name.endswith(".yaml"))


def load_preset(name: str) -> KnobLists:
    if name not in preset_names():
        raise ValueError(f"unknown preset `{name}`; presets: {', '.join(preset_names())}")
    text = resources.files("search_spaces").joinpath(f"{name}.yaml").read_text()
    return KnobLists.model_validate(yaml.safe_load(text) or {})


class SearchSpaceSpec(_Strict):
    preset: Optional[str] = Field("default", description="a preset from search_spaces/ (null: only the knobs given here)")
    knobs: KnobLists = Field(default_factory=KnobLists, description="per-knob values, overriding the preset's")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data):
        return {"preset": data} if isinstance(data, str) else data

    @field_validator("preset")
    @classmethod
    def _known(cls, v):
        if v is not None:
            load_preset(v)
        return v

    def lists(self) -> dict[str, list]:
        base = load_preset(self.preset).given() if self.preset else {}
        return {**base, **self.knobs.given()}


class TrialSpec(_Strict):
    warmup_steps: StrictInt = Field(5, ge=0, description="untimed steps (worker start, compile, autotuning)")
    measure_steps: StrictInt = Field(30, ge=2, description="fewest steps in the timed window")
    min_window_s: float = Field(1.0, ge=0, description="the timed window runs at least this long")
    target_ci: float = Field(0.02, gt=0, description="then until the step-time mean is known to +- this (95% confidence)")
    max_window_s: float = Field(30.0, gt=0, description="or until this long (or 50x measure_steps), whichever is first")
    profile_steps: StrictInt = Field(5, ge=0, description="steps in the separate profiled window (0: no profile)")
    diagnose: StrictBool = Field(True, description="count FLOPs, probe 2x the batch, and diagnose the bottleneck")
    timeout_s: float = Field(600, gt=0, description="a trial running longer is killed and recorded as timed out")
    prune_margin: float = Field(
        0.2, ge=0, lt=1, description="a trial whose throughput is clearly (95% confidence) below the best so far less "
                                     "this fraction stops its window early and skips profile, diagnosis and parity (0: never)")


class SearchSettings(_Strict):
    sampler: Literal["autotune", "tpe", "random", "grid"] = Field(
        "autotune", description="autotune: the baseline's diagnosis first, then one knob at a time, then TPE; "
                                "tpe, random: Optuna's samplers; grid: every point (a whole landscape)")
    n_trials: StrictInt = Field(20, ge=1, description="trials in all, the baseline included")
    time_budget_s: Optional[float] = Field(None, gt=0, description="stop starting trials after this many seconds")
    seed: StrictInt = Field(0, description="sampler seed")
    patience: Optional[StrictInt] = Field(
        None, ge=1, description="stop after this many trials in a row without a gain above min_improvement (grid: never)")
    min_improvement: float = Field(0.02, ge=0, description="a gain below this fraction is noise: it moves nothing")


class Resources(_Strict):
    ray_address: Optional[str] = Field(None, description="an existing Ray cluster; default: a local Ray on 127.0.0.1")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="where trials run")
    cpus_per_trial: Optional[StrictInt] = Field(
        None, ge=1, description="default: num_workers + 1 with a GPU; without one, every CPU but one (one trial at a time)"
    )
    gpus_per_trial: Optional[float] = Field(None, ge=0, description="default: 1 with CUDA, else 0")
    custom: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each trial needs, e.g. {gpu_h100: 1} for nodes "
                                          "started with --resources='{\"gpu_h100\": 8}'")


class Safety(_Strict):
    level: Literal["strict", "numerics", "dynamics"] = Field(
        "numerics", description="strict: only safe knobs; numerics: + precision/compile/cudnn when loss parity passes; "
                                "dynamics: + batch size")
    tolerance: float = Field(0.05, gt=0, description="multi-step deviations from the baseline below this always pass")
    parity_steps: StrictInt = Field(20, ge=2, description="training steps of the multi-step parity check")
    keep_effective_batch: StrictBool = Field(
        False, description="search batch sizes that divide the baseline's, with gradient accumulation, "
                           "so the optimization batch never changes")


class Tracking(_Strict):
    uri: Optional[str] = Field(None, description="MLflow tracking URI; default: sqlite:///<output_dir>/mlflow.db")
    experiment: str = Field("autotune", description="MLflow experiment name")


class Spec(_Strict):
    name: Optional[str] = Field(None, description="the search's name; default: the spec file's stem")
    workload: WorkloadSpec
    baseline: KnobSettings = Field(default_factory=KnobSettings, description="your current settings (default: PyTorch's)")
    search_space: SearchSpaceSpec = Field(default_factory=SearchSpaceSpec)
    trial: TrialSpec = Field(default_factory=TrialSpec)
    search: SearchSettings = Field(default_factory=SearchSettings)
    resources: Resources = Field(default_factory=Resources)
    tracking: Tracking = Field(default_factory=Tracking)
    safety: Safety = Field(default_factory=Safety)
    output_dir: Optional[Path] = Field(None, description="default: runs/<name>-<timestamp>")

    def resolved_output_dir(self) -> Path:
        if self.output_dir is not None:
            return self.output_dir
        return Path("runs") / f"{self.name}-{datetime.now():%Y%m%d-%H%M%S}"


def _describe(err: dict) -> str:
    path = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "missing":
        return f"{path}: required, missing"
    if err["type"] in ("value_error", "assertion_error"):
        return f"{path}: {msg}"
    return f"{path}: {msg}, got {err['input']!r}"


def parse(data: Any, source: str = "spec") -> Spec:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: the spec must be a YAML mapping with at least `workload`, got {type(data).__name__}")
    try:
        spec = Spec.model_validate(data)
    except ValidationError as e:
        # the first error of a field is the one to fix; union branches repeat it
        lines = list(dict.fromkeys(_describe(err) for err in e.errors(include_url=False)))
        raise SpecError(f"{source}: " + "\n  ".join(lines)) from e
    if spec.name is None:
        spec.name = Path(source).stem if source != "spec" else "search"
    return spec


def load(path: str | Path) -> Spec:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"spec file `{path}` not found") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML: {e}") from e
    return parse(data, str(path))
