"""The trial request: what the driver (through either backend) hands
the torch-only runner for one proposal. Built in one place from the search's
settings and the proposal's knobs, so every launcher runs the same trial; and
the runner's side of it, the trial config's defaults and check (`check_config`,
what `python -m autotune.trial` accepts). Needs neither torch nor Ray.

    settings = plan.trial_settings(device_type, baseline)   # autotune.plan.SearchPlan
    config = settings.config(knobs, PerTrial(prune_below, incumbent_above))   # -> python -m autotune.trial's JSON
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any

from autotune import knobs as K
from autotune import stats
from autotune.trial import measure as M
from autotune.trial.ranks import ConfigError

TRIAL_KEYS = ("warmup_steps", "measure_steps", "min_window_s", "target_ci", "max_window_s", "profile_steps", "diagnose")


@dataclass(frozen=True)
class PerTrial:
    """What a driver decides for one trial beside its knobs (`TrialSettings.config`); the Ray driver carries them
    in each trial's Ray config under these names (`PerTrial.of`, autotune.execution.trials.run_trial_in)."""

    prune_below: float | None = None
    """the search's unit (samples/s; a language model's tokens/s): clearly below it, the window stops early"""
    incumbent_above: float | None = None
    """what the trial must beat to become the incumbent: at or below it, the window alone (`autotune.decide.bar`)"""
    predicted: float | None = None
    """the rate model's samples/s (autotune.decide.model), recorded beside the measured"""
    incumbent_ci: float = 0.0
    """how well the incumbent's throughput is known (95%, relative)"""
    carry: dict | None = None
    """diagnosed from another trial's numbers measured apart (`Strategy.carry_for`)"""
    anchor: bool = False
    """the first incumbent of a search (its baseline), which every later trial is weighed against: its window
    stops at a promoted window's precision (`stats.promote_floor`), since no window length removes the spread
    between fresh processes (5-18%, scripts/bench/bench_window.py) and the confirm re-measures the baseline side by
    side with the best anyway"""
    tie_keeps_incumbent: bool = False
    """riskier than the incumbent: a window that ties with it leaves it (`Strategy`)"""
    incumbent_trial: int | None = None
    """the incumbent's trial number (the trial a kept tie goes to)"""

    @classmethod
    def of(cls, config: dict[str, Any]) -> "PerTrial":
        """The decisions a search config carries (a proposal's: `autotune.execution.proposer.Proposer.suggest`)."""
        return cls(**{f.name: config[f.name] for f in fields(cls) if f.name in config})


def trial_window(window: dict[str, Any]) -> dict[str, Any]:
    """The runner's window from the plan's trial section (TRIAL_KEYS): the step floor's default filled, a
    search's warm-up by time (WARMUP_MIN_S)."""
    return {
        **window,
        "measure_steps": window["measure_steps"] or DEFAULTS["measure_steps"],
        "warmup_min_s": WARMUP_MIN_S,
    }


def parity_against(baseline: dict[str, Any], steps: int, tolerance: float) -> dict[str, Any]:
    """A trial's loss parity against `baseline`'s built-in knobs, `steps` long, within `tolerance`."""
    return {"baseline": {k: v for k, v in baseline.items() if k in K.KNOBS}, "steps": steps, "tolerance": tolerance}


@dataclass(frozen=True)
class TrialSettings:
    """What every trial of a search shares (`autotune.plan.SearchPlan.trial_settings` builds it from the plan's
    sections)."""

    workload: dict[str, Any]  # {"name" | "factory", "args"}
    trial: dict[str, Any]  # the spec's trial settings the runner takes (TRIAL_KEYS)
    device: str  # auto | cpu | cuda
    seed: int
    base_batch: int  # the baseline's effective batch (its batch x its own accumulation)
    keep_effective_batch: bool
    parity: dict[str, Any]  # {"baseline": knobs, "steps", "tolerance", ...}
    ranks: int = 1  # processes per trial (resources.ranks_per_trial)
    blocks: list[str] | None = None  # the model's repeated block classes (resources.blocks)
    memory_limit_gib: float | None = None  # a forced memory limit per trial process (resources.memory_limit_gib)
    flops_cache: str | None = None  # the search's FLOPs per model and shape (measure.flops_per_sample)
    program_baseline: dict[str, Any] | None = None  # a program's (workload.command) baseline knobs: its own settings
    flags: dict[str, dict] | None = None  # a program's searched flags: name -> syntax (spec.UserKnob.syntax)

    def timed_only(self, target_ci: float | None = None) -> "TrialSettings":
        """The same trials with the window only: no profiled window, diagnosis or
        loss parity (a re-measurement, autotune.decide.confirm); `target_ci`: the
        window's, where the decision sizes it (confirm.window_ci)."""
        return replace(
            self,
            trial={
                **self.trial,
                "profile_steps": 0,
                "diagnose": False,
                "target_ci": target_ci or self.trial["target_ci"],
            },
            parity=None,
        )

    def parity_check(self, noise: dict | None = None) -> "TrialSettings":
        """Loss parity alone, no window (the late check of a config about to be
        exported whose trial did not run it). `noise`: {"seed", "level"}, a
        program's noise run (autotune.safety.program_parity): its weights
        perturbed at `level` before every step."""
        parity = {**self.parity, "noise": noise} if noise else self.parity
        return replace(
            self, trial={**self.trial, "profile_steps": 0, "diagnose": False, "parity_only": True}, parity=parity
        )

    def config(self, knobs: dict[str, Any], per_trial: PerTrial | None = None) -> dict[str, Any]:
        """The runner's config for these knobs (built-in knobs and `args.NAME` user knobs), with what the driver
        decided for this trial (`PerTrial`)."""
        per_trial = per_trial or PerTrial()
        base, args = self.program_baseline, K.workload_args(knobs)
        workload = {**self.workload, "args": {**self.workload.get("args", {}), **args}}
        if base is not None and self.flags:  # a program takes its searched arguments as its flags or environment
            workload["command"] = with_flags(workload["command"], args, self.flags)
            workload["env"] = env_of(args, self.flags)
        return {
            "workload": workload,
            # a program keeps its own settings but for the knobs this trial changes (autotune.config)
            "knobs": {k: knobs[k] for k in K.KNOBS if base is None or knobs[k] != base.get(k)},
            **self.trial,
            **({"target_ci": stats.promote_floor(self.trial["target_ci"], self.device)} if per_trial.anchor else {}),
            "trace_path": "trace.json" if self.trial["profile_steps"] else None,
            "device": self.device,
            # keep_effective_batch: micro-batches per optimizer step
            "accum_steps": self.base_batch // knobs["batch_size"] if self.keep_effective_batch else 1,
            "parity": self.parity,
            "seed": self.seed,
            "prune_below": per_trial.prune_below,
            # several ranks: a fixed window on every rank, no pruning (autotune.trial.ranks)
            **({"ranks": self.ranks, "prune_below": None} if self.ranks > 1 else {}),
            **({"blocks": self.blocks} if self.blocks else {}),
            **({"memory_limit_gib": self.memory_limit_gib} if self.memory_limit_gib else {}),
            "incumbent_above": per_trial.incumbent_above,  # below it: the window alone
            "incumbent_ci": per_trial.incumbent_ci,  # how well the incumbent's throughput is known (95%, relative)
            "predicted": per_trial.predicted,  # the rate model's samples/s (autotune.decide.model), beside the measured
            "carry": per_trial.carry,  # diagnosed from another trial's numbers measured apart (Strategy.carry_for)
            "tie_keeps_incumbent": per_trial.tie_keeps_incumbent,  # riskier than the incumbent: a tie leaves it
            "incumbent_trial": per_trial.incumbent_trial,  # the incumbent's trial number (the trial a kept tie goes to)
            **({"flops_cache": self.flops_cache} if self.flops_cache else {}),
        }


def flag_syntax(name: str, declared: dict[str, Any]) -> dict[str, Any]:
    """How a program takes a searched argument (spec.UserKnob's `flag`, `switch`, `bool_text`, `env`)."""
    return {
        "flag": declared.get("flag") or f"--{name}",
        "switch": bool(declared.get("switch")),
        "bool_text": list(declared.get("bool_text") or ("true", "false")),
        "env": bool(declared.get("env")),
    }


def env_of(values: dict[str, Any], flags: dict[str, dict]) -> dict[str, str]:
    """The searched arguments a program takes as environment variables ('': left unset)."""
    return {name: str(v) for name, v in values.items() if flags[name]["env"]}


def flag_value(command: list[str], syntax: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether `command` gives the flag, and its text (None for a switch)."""
    flag = syntax["flag"]
    for i, arg in enumerate(command):
        if flag.endswith("="):
            if arg.startswith(flag):
                return True, arg[len(flag) :]
        elif arg == flag:
            return True, None if syntax["switch"] or i + 1 == len(command) else command[i + 1]
        elif arg.startswith(flag + "="):
            return True, arg[len(flag) + 1 :]
    return False, None


def with_flags(command: list[str], values: dict[str, Any], flags: dict[str, dict]) -> list[str]:
    """`command` with each of `values` written as its flag (`flags`: spec.UserKnob.syntax),
    the same flag given before removed (`--name value`, `--name=value`, a switch)."""
    out = list(command)
    for name, value in values.items():
        syntax = flags[name]
        if syntax["env"]:
            continue
        flag, kept = syntax["flag"], []
        bare = flag.rstrip("=")
        skip = False
        for arg in out:
            if skip:
                skip = False
                continue
            if arg == bare and not syntax["switch"] and not flag.endswith("="):
                skip = True  # its value follows
                continue
            if arg == bare or arg.startswith(bare + "="):
                continue
            kept.append(arg)
        if isinstance(value, bool):
            if syntax["switch"]:
                out = kept + ([bare] if value else [])
                continue
            value = syntax["bool_text"][0 if value else 1]
        out = kept + ([f"{flag}{value}"] if flag.endswith("=") else [flag, str(value)])
    return out


# --- the runner's side: a trial config (python -m autotune.trial's JSON), its defaults and check ---

DEFAULTS = {
    "warmup_steps": 5,  # untimed
    "warmup_min_s": None,  # on a CPU, an eager one-rank config's warm-up ends after 2 steps once it ran this long
    "measure_steps": 10,  # the timed window: at least this many steps,
    "min_window_s": 1.0,  # at least this long,
    "target_ci": 0.02,  # then until the step-time mean is known to +-2% (95%)
    "max_window_s": 30.0,  # or this long, or max_steps(config) steps
    "profile_steps": 5,  # a separate profiled window (0: none)
    "trace_path": None,  # where the Chrome trace goes (default: a temporary file)
    "diagnose": True,  # FLOPs, a 2x-batch probe and the bottleneck diagnosis
    "accum_steps": 1,  # micro-batches per optimizer step (safety.keep_effective_batch)
    "parity": None,  # {"baseline": knobs, "steps": 20, "tolerance": 0.05, "reference": path}: measure loss parity
    # (a program's noise run, safety.program_parity: also "noise": {"seed": S, "level": L})
    "prune_below": None,  # the search's unit (samples/s; a language model's tokens/s: result.unit_of): clearly below it, stop the window early and skip the rest ("pruned")
    "incumbent_above": None,  # samples/s a config must beat to become the incumbent: at or below it, no profile,
    # diagnosis or parity, and a screening window (measure.WindowRule.screen_ms); None: every trial pays for all
    "incumbent_ci": 0.0,  # the incumbent's throughput known to +- this (95%, relative): screen and promote allow for it
    "predicted": None,  # samples/s the rate model predicted (autotune.decide.model): echoed next to the measurement
    "carry": None,  # {"trial": N, "metrics"}: trial N measured what a diagnosis measures apart from the window
    # (diagnose.APART) for a config that differs from this one in loader knobs alone: diagnose from it, no profile
    "tie_keeps_incumbent": False,  # this config is riskier than the incumbent (records.risk): a window that ties
    # with it (measure.WindowRule.tied) pays for nothing more, whatever its mean, as a tie goes to the safer config
    "incumbent_trial": None,  # the incumbent's trial number: a kept tie names it (metric `tie_kept_incumbent`)
    "parity_only": False,  # no window: loss parity alone (a late check of a config about to be exported)
    "flops_cache": None,  # a JSON file of FLOPs per sample, shared by a search's trials (measure.flops_per_sample)
    "device": "auto",
    "seed": 0,
    "ranks": 1,  # processes of one trial, one device each (autotune.trial.ranks)
    "backend": None,  # torch.distributed backend (default: gloo on the CPU, nccl on CUDA)
    "dist_timeout_s": 300,  # the process group's timeout: a collective waiting longer fails the trial
    "blocks": None,  # class names of the model's repeated blocks (default: found; knobs._parallel.find_blocks)
    "memory_limit_gib": None,  # a peak RSS above it (checked each step) is an out of memory: status "oom"
}
MAX_STEPS_FACTOR = 50
# the step floor of the search before issue 25, which sizes the window's step cap: 10 steps read what 30 to
# 60 do, once min_window_s has passed (scripts/bench/bench_window.py: jpeg_pipeline's 10-step prefix -2.5% and +0.4% of
# its 60-step window, inside the 5-9% spread of fresh processes), and 30 cost 10-23 s of every jpeg window
CAP_FLOOR_STEPS = 30
# the search's `warmup_min_s`: a warm-up is about time (the allocator, the loader's workers, caches), not
# steps. jpeg_pipeline (0.3-0.7-s steps) read the same 10-step windows after 2 warm-up steps as after 5 (prefix
# bias +1.2% / -0.5%, against -2.5% / +0.4%: scripts/bench/bench_window.py --warmup 2); tiny_cnn's 5 steps take 25 ms and
# all run. Compiled configs (CUDA graphs record on their first calls) and GPUs (not measured) keep warmup_steps.
WARMUP_MIN_S = 1.0


def max_steps(cfg: dict[str, Any]) -> int:
    """The window's step cap: 50x the step floor, never below 50x CAP_FLOOR_STEPS (so a
    10-step floor keeps fast steps' windows to min_window_s and beyond)."""
    return max(cfg["measure_steps"], CAP_FLOOR_STEPS) * MAX_STEPS_FACTOR


class TrialConfigError(ConfigError):
    """A trial config that cannot run; the message names the field."""


def check_config(config: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and check a trial config (the runner needs no pydantic)."""
    unknown = set(config) - set(DEFAULTS) - {"workload", "knobs"}
    if unknown:
        raise TrialConfigError(
            f"unknown trial config keys {sorted(unknown)}; allowed: workload, knobs, {', '.join(DEFAULTS)}"
        )
    wl = config.get("workload")
    if not isinstance(wl, dict) or not (wl.get("name") or wl.get("factory") or wl.get("file") or wl.get("command")):
        raise TrialConfigError(
            "`workload` must be an object with `name` (built-in), `factory` (pkg.module:fn), `file` "
            "(a pickled factory, relative to the config's dir) or `command` (your program), "
            "and optional `args`"
        )
    cfg = {**DEFAULTS, **config}
    given = K.canonical(dict(config.get("knobs") or {}))  # older spellings (activation_checkpointing: true)
    for name, value in given.items():
        knob = K.KNOBS.get(name)
        if knob is None:
            raise TrialConfigError(
                f"unknown knob `{name}`; knobs are: {', '.join(K.KNOBS)} (workload arguments go in workload.args)"
            )
        why = None if name == "batch_size" and value is None else knob.check(value)
        if why:
            raise TrialConfigError(f"knobs.{name}: {value!r} is not allowed: {why}")
    cfg["knobs"] = {**K.pytorch_defaults(None), **given}
    clash = K.conflicts(cfg["knobs"])
    if clash:
        raise TrialConfigError(f"knobs cannot run together: {'; '.join(clash)}")
    blocks = cfg["blocks"]
    if blocks is not None and not (isinstance(blocks, list) and all(isinstance(b, str) and b for b in blocks)):
        raise TrialConfigError(f"`blocks` must be null or a list of module class names, got {blocks!r}")
    for key, low in (
        ("warmup_steps", 0),
        ("measure_steps", 2),
        ("profile_steps", 0),
        ("accum_steps", 1),
        ("ranks", 1),
        ("dist_timeout_s", 1),
    ):
        if type(cfg[key]) is not int or cfg[key] < low:
            raise TrialConfigError(f"`{key}` must be an int >= {low}, got {cfg[key]!r}")
    if cfg["warmup_min_s"] is not None and (
        not isinstance(cfg["warmup_min_s"], (int, float))
        or isinstance(cfg["warmup_min_s"], bool)
        or cfg["warmup_min_s"] < 0
    ):
        raise TrialConfigError(f"`warmup_min_s` must be null or seconds >= 0, got {cfg['warmup_min_s']!r}")
    for key in ("min_window_s", "target_ci", "max_window_s", "incumbent_ci"):
        if not isinstance(cfg[key], (int, float)) or isinstance(cfg[key], bool) or cfg[key] < 0:
            raise TrialConfigError(f"`{key}` must be a number >= 0, got {cfg[key]!r}")
    for key, unit in (
        ("prune_below", "samples/s"),
        ("incumbent_above", "samples/s"),
        ("predicted", "samples/s"),
        ("memory_limit_gib", "GiB"),
    ):
        if cfg[key] is not None and (
            not isinstance(cfg[key], (int, float)) or isinstance(cfg[key], bool) or cfg[key] <= 0
        ):
            raise TrialConfigError(f"`{key}` must be null or {unit} > 0, got {cfg[key]!r}")
    carry = cfg["carry"]
    if carry is not None and not (
        isinstance(carry, dict)
        and isinstance(carry.get("trial"), int)
        and isinstance(carry.get("metrics"), dict)
        and all(isinstance(v, (int, float)) for v in carry["metrics"].values())
    ):
        raise TrialConfigError(f'`carry` must be null or {{"trial": N, "metrics": {{name: number}}}}, got {carry!r}')
    if not isinstance(cfg["tie_keeps_incumbent"], bool):
        raise TrialConfigError(f"`tie_keeps_incumbent` must be true or false, got {cfg['tie_keeps_incumbent']!r}")
    trial = cfg["incumbent_trial"]
    if trial is not None and (not isinstance(trial, int) or isinstance(trial, bool) or trial < 0):
        raise TrialConfigError(f"`incumbent_trial` must be null or a trial number >= 0, got {trial!r}")
    if cfg["parity_only"] and not cfg["parity"]:
        raise TrialConfigError("`parity_only` needs `parity` (the baseline and its steps)")
    return cfg


def parse_set(items: list[str]) -> dict[str, Any]:
    """`--set NAME=VALUE` items (the runner's, the scripts'): each value as JSON where it parses, else the text."""
    out = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep:
            raise TrialConfigError(f"--set expects knob=value, got `{item}`")
        try:
            out[name] = json.loads(raw)
        except json.JSONDecodeError:
            out[name] = raw
    return out


def window_rule(cfg: dict, batch: float, device_type: str) -> M.WindowRule:
    """The timed window's rule for a trial config (request.check_config's), with
    `batch` samples a step: its thresholds in samples/s become step times."""
    prune, above = cfg["prune_below"], cfg["incumbent_above"]
    return M.WindowRule(
        min_steps=cfg["measure_steps"],
        min_s=cfg["min_window_s"],
        target_ci=cfg["target_ci"],
        max_steps=max_steps(cfg),
        max_s=cfg["max_window_s"],
        prune_ms=batch / prune * 1e3 if prune else None,
        screen_ms=batch / above * 1e3 if above else None,
        screen_ci=stats.incumbent_interval(cfg["incumbent_ci"], device_type) if above else 0.0,
        promote_ci=stats.promote_floor(cfg["target_ci"], device_type) if above else None,
    )
