"""The trial result: what the runner reports for one trial (its result.json),
typed, with a per-rank part for a multi-rank trial. The one conversion from and
to the runner's JSON is here: `TrialResult.from_dict` (a key the contract lacks,
or a value of the wrong type, is an error naming the key) and `to_dict` (what
result.json holds, unchanged on disk, so old run dirs still read). Typed end to
end: the runner builds one from its first line, and the ranks' merge, the
launcher, the scaling reference and the anchor's re-read return one; the Ray
adapter, the recorder, the late checks, the re-measurement and the scripts take
one, and read result.json only through `read` (`write` checks what it writes).
Needs neither torch nor Ray.

    result = TrialResult.read(trial_dir / "result.json")
    result.status, result.metrics["samples_per_s"], result.ranks[1].metrics

The unit a throughput is in is decided here, once, for every reader (`unit_of`): tokens/s for a language model,
samples/s for the rest.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union


class ResultError(ValueError):
    """A trial result that does not fit the contract; the message names the key."""


@dataclass(frozen=True)
class Unit:
    """What a throughput counts: its metric's name (`metrics[unit.metric]`), its label for people, and the
    names of the figures that follow it (`key("best")`: best_tokens_per_s in best_config.yaml and the
    re-measurement)."""

    name: str  # tokens | samples
    metric: str  # tokens_per_s | samples_per_s
    label: str  # tokens/s | samples/s

    def key(self, prefix: str) -> str:
        return f"{prefix}_{self.metric}"


SAMPLES = Unit("samples", "samples_per_s", "samples/s")
TOKENS = Unit("tokens", "tokens_per_s", "tokens/s")


def unit_of(metrics: dict[str, Any] | None) -> Unit:
    """The unit of a trial's throughput, and so of its search's: tokens/s where the trial counted the tokens
    its steps trained on (a language model: batches with `input_ids`, or a program that reports
    `cfg.step(tokens=...)`: autotune.trial.tokens), else samples/s. Every trial of one workload counts alike, so
    this is the search's unit too: what the strategy maximizes, the re-measurement compares, and the report,
    trials.csv, MLflow, best_config.yaml and the break-even lead with. The one place that decides it."""
    return TOKENS if (metrics or {}).get(TOKENS.metric) is not None else SAMPLES


@dataclass
class DeviceInfo:
    """The device a trial ran on."""

    type: str  # cpu | cuda
    name: str
    cpus: int  # the CPUs the trial's process may use
    torch_threads: int | None = None  # intra-op threads in effect during the window

    KEPT = ("type", "name", "cpus")


@dataclass
class RankResult:
    """One rank of a multi-rank trial (`autotune.trial.ranks.merge` keeps this of each)."""

    rank: int | None
    status: str | None
    host: str | None
    metrics: dict[str, float | None] = field(default_factory=dict)  # its own rate, times and peak memory
    error: str | None = None
    node_ip: str | None = None  # where it ran, when spread over nodes (autotune.execution.spread)
    node_id: str | None = None

    KEPT = ("rank", "status", "host", "metrics")  # written even when None


@dataclass
class ScalingReference:
    """The same config on one rank, measured after an N-rank baseline (autotune.records.scaling)."""

    status: str | None
    samples_per_s: float | None
    knobs: dict[str, Any] | None
    trial_wall_s: float | None
    error: str | None

    KEPT = ("status", "samples_per_s", "knobs", "trial_wall_s", "error")


@dataclass
class TrialResult:
    """One trial's result (result.json). A key left out on disk is None here."""

    status: str  # ok | pruned | oom | error | timeout
    knobs: dict[str, Any] | None = None  # as run (batch_size resolved)
    metrics: dict[str, float | None] | None = None  # names carry their units
    device: DeviceInfo | None = None
    host: str | None = None
    torch: str | None = None  # torch's version
    optimizer: str | None = None  # the optimizer's class
    optimizer_fused: bool | None = None
    has_batchnorm: bool | None = None
    disturbed: str | None = None  # why the window's figure is suspect (autotune.trial.disturbance)
    profile: dict[str, Any] | None = None  # the profiled window (measure.profile_window)
    diagnosis: dict[str, Any] | None = None  # bottleneck, evidence, recommendations
    parity: dict[str, Any] | None = None  # loss parity against the baseline
    parity_late: bool | None = None  # the parity verdict came from a late check (autotune.decide.checked)
    skipped: str | None = None  # what the trial did not pay for (not the incumbent)
    error_type: str | None = None
    error: str | None = None
    traceback: str | None = None
    trial_s: float | None = None  # the runner's own time
    phases_s: dict[str, float] | None = None  # where the trial's seconds went: setup, warmup, window, ...
    trial_wall_s: float | None = None  # the trial process's, start-up included (autotune.execution.launcher)
    launcher: str | None = None  # fork (this process's fork server) | shared (the search's) | spawn
    ranks: list[RankResult] | None = None  # a multi-rank trial's ranks (autotune.trial.ranks.merge)
    ranks_wall_s: float | None = None
    rank: int | None = None  # one rank's own result (a launched rank, before the merge)
    ended_unix: float | None = None
    node_ip: str | None = None  # spread over nodes (autotune.execution.spread): rank 0's node (a rank's: its own)
    node_id: str | None = None
    master_addr: str | None = None  # the process group's rendezvous address
    scaling_reference: ScalingReference | None = None
    chosen_by: str | None = None  # what chose this config (the search's: its move's measurement, the rate model)
    # a user's own program as the trial (autotune.trial.loop):
    used: list[str] | None = None  # the autotune.config() methods it called (the knobs it can take)
    # what its model cannot take ("knob" or "knob=value" -> why) and the knob values it runs with on its own, as
    # the probe found them (autotune.config.Config.cannot / .own)
    cannot: dict[str, str] | None = None
    own_knobs: dict[str, Any] | None = None
    losses: list[float] | None = None  # its loss at each step from the first (warm-up included), for parity
    data_wait: str | None = None  # why data wait was not measured, where it was not

    KEPT = ("status",)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def metric(self, name: str) -> float | None:
        return (self.metrics or {}).get(name)

    @property
    def unit(self) -> Unit:
        return unit_of(self.metrics)

    @property
    def rate(self) -> float | None:
        """Its throughput in its unit (`unit_of`): tokens/s for a language model, else samples/s."""
        return self.metric(self.unit.metric)

    def add_derived(self, **metrics: float) -> None:
        """Metrics set after the trial, computed from what it measured and from another trial (a multi-rank
        trial's scaling reference and efficiency, `autotune.records.scaling`): added here, the one way, beside
        what the runner measured."""
        if self.metrics is None:
            self.metrics = {}
        self.metrics.update(metrics)

    @classmethod
    def from_dict(cls, data: Any) -> "TrialResult":
        """The runner's result (result.json's object), checked: an unknown key or
        a value of the wrong type is a ResultError naming the key."""
        return _build(cls, data, "")

    def to_dict(self) -> dict[str, Any]:
        """What result.json holds: the keys left out stay out."""
        return _plain(self)

    def checked(self) -> dict[str, Any]:
        """`to_dict`, held to the contract as a reader will hold it (a field set
        to a value of the wrong type is a ResultError naming the key)."""
        data = self.to_dict()
        _build(type(self), data, "")
        return data

    @classmethod
    def read(cls, path) -> "TrialResult":
        """A trial's result.json."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except ResultError as e:
            raise ResultError(f"{path}: {e}") from None

    def write(self, path) -> None:
        """result.json (checked: what is written reads back)."""
        Path(path).write_text(json.dumps(self.checked(), indent=2) + "\n")


def failed(status: str, error_type: str, error: str, **extra) -> TrialResult:
    """A trial that produced no result of its own (it died, timed out, or Ray failed it)."""
    return TrialResult(status=status, error_type=error_type, error=error, **extra)


# --- the one conversion ------------------------------------------------------------

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _build(cls, data: Any, where: str):
    if not isinstance(data, dict):
        raise ResultError(f"`{where or 'result'}` must be an object, got {type(data).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ResultError(f"unknown result key `{where}{unknown[0]}`; allowed: {', '.join(names)}")
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [n for n in required if n not in data]
    if missing:
        raise ResultError(f"result key `{where}{missing[0]}` is missing")
    hints = _hints(cls)
    return cls(**{k: _value(hints[k], v, f"{where}{k}") for k, v in data.items()})


def _value(hint, value: Any, key: str):
    """`value` checked against the type `hint` (dataclasses built)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        kinds = [a for a in args if a is not type(None)]
        if len(kinds) == 1:
            return _value(kinds[0], value, key)
        if all(a in (int, float) for a in kinds):  # float | None: a number
            return _value(float, value, key)
        raise ResultError(f"result key `{key}`: no rule for {hint}")  # pragma: no cover (the contract's own types)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, f"{key}.")
    if origin is list:
        if not isinstance(value, list):
            raise ResultError(f"result key `{key}` must be a list, got {value!r:.80}")
        return [_value(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ResultError(f"result key `{key}` must be an object, got {value!r:.80}")
        return {k: _value(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if hint is Any:
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ResultError(f"result key `{key}` must be a number, got {value!r:.80}")
        return value
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ResultError(f"result key `{key}` must be an integer, got {value!r:.80}")
    if not isinstance(value, hint):
        raise ResultError(f"result key `{key}` must be {hint.__name__}, got {value!r:.80}")
    return value


def _plain(obj) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None and f.name not in type(obj).KEPT:
            continue
        if dataclasses.is_dataclass(value):
            value = _plain(value)
        elif isinstance(value, list):
            value = [_plain(v) if dataclasses.is_dataclass(v) else v for v in value]
        out[f.name] = value
    return out
