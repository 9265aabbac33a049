"""The config a training program applies: one class, `Config`, the same in a trial and in production (issue 42),
and the same for `autotune.config()` and `autotune.load_config()` (issue 61).

    cfg = autotune.config()
    loader = DataLoader(dataset, **cfg.dataloader_kwargs(batch_size=64, num_workers=2))
    model, optimizer = cfg.prepare(model, optimizer)
    for batch in cfg.steps(loader):          # or: with cfg.data(): batch = get_batch() ... cfg.step(samples=n, loss=loss)
                                             # (a language model's loop: cfg.step(samples=n, tokens=t, loss=loss))
        with cfg.autocast():
            loss = ...

What a config is given, not a mode, makes the difference:
- a trial's request (`AUTOTUNE_TRIAL=<trial dir>/config.json`: the launcher sets it): the trial's knobs, and its
  measured loop (`autotune.trial.loop.TrialLoop`): `steps`/`step` write the trial's result and end the process
  once its window is done;
- a best_config.yaml (`autotune.config("best_config.yaml")` or `AUTOTUNE_CONFIG=path`): the knobs the search
  changed, the program's own values standing for the rest; the loop passes through (`PassThrough`; `online`:
  issue 43's loader tuner);
- neither: no knob, every method returns the program's own values (a no-op).
`load_config(path)` gives the same class with every knob of the file set (torch's defaults for those it leaves
out), for production code that passes nothing of its own: `cfg.dataloader_kwargs()` gives the tuned batch size.

One behaviour per method, however the config came: `dataloader_kwargs(**yours)`: yours, the set loader knobs over
them; `prepare(model, optimizer)`: the process-wide knobs (once: `apply_process_knobs`), the set language-model
knobs, the config's device, the memory format, compile, the optimizer fused; `wrap(model)`: the same on this
rank's device, then DDP or FSDP2 with ranks; `autocast()`; `grad_scaler(yours)`: enabled for fp16, else disabled
(its calls pass through); `to_device(batch, preprocess)`; `zero_grad(optimizer)`; `grad_accumulation_steps`
(`accumulation_steps`: its deprecated name). Each knob reaches a model in one place, which the instrumentation's
ways in use too: autotune.knobs.prepare_model (device, layout, compile), autotune.knobs._lm.prepare_lm,
autotune.knobs.over_loader_kwargs, autotune.knobs.prepare_optimizer.

The ways the knobs reach the program are recorded (`used`: the methods it calls, and the instrumentation's ways
in): a knob whose way it never takes is "not used by your program" and not searched (`unused`); so are the
program's own values of the knobs (`own`: its DataLoader arguments, its TrainingArguments, its model's), which a
search takes as its baseline.

Cheap to import: torch loads when `config()` is called.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from autotune.knobs._registry import KNOBS, USER_PREFIX, canonical

TRIAL_ENV, CONFIG_ENV, ONLINE_ENV = "AUTOTUNE_TRIAL", "AUTOTUNE_CONFIG", "AUTOTUNE_ONLINE"
# the knobs applied when config() is called (process and backend flags), or before the process starts (the
# environment knobs, by the launcher): used by every program
APPLIED_AT_START = ("num_threads", "cudnn_benchmark", "expandable_segments")
# a language model's knobs applied to the model (autotune.knobs._lm.prepare_lm)
LM_MODEL = ("attention", "liger_kernels", "activation_checkpointing", "float8")
# the methods through which each other knob reaches a program; beside the methods, what the zero-code
# instrumentation records where it reaches one (`REACHES`)
USES = {
    "dataloader_kwargs": ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size"),
    "prepare": ("channels_last", "compile", "fused_optimizer", *LM_MODEL),
    "flatten": ("padding_free",),
    "packing": ("packing",),
    "wrap": (
        *LM_MODEL,
        "channels_last",
        "compile",
        "ddp_bucket_cap_mb",
        "ddp_gradient_as_bucket_view",
        "ddp_static_graph",
        "sharding",
        "fsdp_reshard_after_forward",
    ),
    "autocast": ("precision",),
    "to_device": ("channels_last",),
    "zero_grad": ("set_to_none",),
    # torch itself, instrumented (autotune.instrument._torch): where a program that calls no method takes them
    "torch:loader": ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size"),
    "torch:model": ("channels_last", "compile", *LM_MODEL),
    "torch:optimizer": ("fused_optimizer",),
    "torch:autocast": ("precision",),
    "torch:zero_grad": ("set_to_none",),
    "torch:ddp": ("ddp_bucket_cap_mb", "ddp_gradient_as_bucket_view", "ddp_static_graph"),
    "torch:fsdp": ("fsdp_reshard_after_forward",),
}
# the methods whose knobs a Trainer script's TrainingArguments carry (`training_arguments`, and the flags the
# instrumentation appends): the loader's and the batch, precision, compile and the fused optimizer, activation
# checkpointing and DDP's; `training_arguments` itself says they reach it as TrainingArguments fields (its flags)
HF_REACHES = ("dataloader_kwargs", "autocast", "prepare", "wrap", "training_arguments")


# the reaches that are no method of the config: what the program lacks where a knob never reached it
REACHES = {
    "flatten": "iterates no padded batches (`input_ids` with an `attention_mask`: they are flattened)",
    "packing": "has no `packing` argument (TRL's SFTConfig has one)",
    "torch:loader": "builds no DataLoader",
    "torch:model": "runs no module with trainable parameters in grad mode",
    "torch:optimizer": "builds no torch optimizer that has a fused implementation",
    "torch:autocast": "runs no module with trainable parameters in grad mode",
    "torch:zero_grad": "never calls zero_grad()",
    "torch:ddp": "builds no DistributedDataParallel",
    "torch:fsdp": "never calls fully_shard()",
}


def unused(knob: str, used: list[str]) -> str | None:
    """Why a program that called the methods `used` cannot take `knob` (None: it can)."""
    if knob.startswith(USER_PREFIX) or knob in APPLIED_AT_START:
        return None
    methods = [m for m, knobs in USES.items() if knob in knobs]
    if not methods or set(methods) & set(used):
        return None
    # the config's methods it could call, where it calls any (a program that calls none: what it lacks alone)
    methods_used = any(not u.startswith("torch:") and u not in REACHES for u in used)
    calls = [f"cfg.{m}()" for m in methods if m not in REACHES] if methods_used else []
    lacks = list(dict.fromkeys(REACHES[m] for m in methods if m in REACHES))
    return "not used by your program: it " + " and ".join(
        ([f"never calls {' or '.join(calls)}"] if calls else []) + lacks
    )


def _set_knobs(data: dict[str, Any]) -> dict[str, Any]:
    """The knobs a best_config.yaml changes from its baseline (its `safety` list);
    a file without one (written by hand): every knob it names."""
    knobs = canonical({k: v for k, v in (data.get("knobs") or {}).items() if k in KNOBS})
    if isinstance(data.get("safety"), list):
        changed = {f["knob"] for f in data["safety"] if isinstance(f, dict)}
        knobs = {k: v for k, v in knobs.items() if k in changed}
    return knobs


def _beyond_knobs(file: dict[str, Any], request: dict[str, Any] | None) -> tuple[dict[str, Any], int, Any]:
    """What a config applies beyond its knobs: the searched workload arguments, the micro-batches an optimizer
    step takes, the model's repeated block classes; a trial's `request`'s (as its loop checked it), else its
    best_config.yaml's (`file`; {}: none of them)."""
    if request is not None:
        return (
            dict((request.get("workload") or {}).get("args") or {}),
            int(request.get("accum_steps") or 1),
            request.get("blocks"),
        )
    return (
        dict(file.get("workload_args") or {}),
        int((file.get("batch") or {}).get("grad_accumulation_steps") or 1),
        (file.get("parallel") or {}).get("blocks"),
    )


class Config:
    """The config a training program applies (see the module doc): `autotune.config()`'s and `load_config`'s.

    `knobs`: the knobs it sets (the rest stay the program's own); `device_type`: where the model and batches go;
    `file`: the best_config.yaml it applies ({}: none); `request`: a trial's (its loop is then the measured one,
    `autotune.trial.loop.TrialLoop`; else the loop passes through, `PassThrough`), with its `trial_dir`;
    `online`: a file's loaders re-tuned as they run (`steps`)."""

    def __init__(
        self,
        knobs: dict[str, Any],
        device_type: str,
        *,
        file: dict[str, Any] | None = None,
        request: dict[str, Any] | None = None,
        trial_dir: Path | None = None,
        online: bool = False,
    ):
        from autotune.trial.loop import PassThrough, TrialLoop

        self.knobs, self.device_type, self.file = dict(knobs), device_type, dict(file or {})
        self.trial_dir = trial_dir  # a trial's dir (its program's outputs go under it); None outside a trial
        self.online = online
        self.used: set[str] = set()  # the ways the knobs reach the program (`record_reach`)
        # what the program's model cannot take ("knob" or "knob=value" -> why), and the knob values it runs with
        # on its own: recorded where a model reaches autotune (prepare, the instrumented Trainer), read off the probe
        self.cannot: dict[str, str] = {}
        self.own: dict[str, Any] = {}
        self._model_recorded = False  # a model was handed over (`record_model`)
        self._compiled_loaded = False  # the file's compiled artifacts were looked at (`load_compiled`)
        self._process_applied = False  # the process-wide knobs are in effect (`apply_process_knobs`)
        self.flag_knobs: set[str] = set()  # knobs a script's own flags set (autotune.instrument._transformers)
        self.framework: str | None = None  # a framework whose instrumentation reports the steps (`claim`)
        self.loop = (
            PassThrough()
            if request is None
            else TrialLoop(request, trial_dir, self.used, device_type, self.cannot, self.own)
        )
        given = None if request is None else self.loop.cfg
        self._args, self._accumulation, self._blocks = _beyond_knobs(self.file, given)

    def __eq__(self, other) -> bool:
        """The same knobs on the same device, from the same file (a best_config.yaml read twice is one config)."""
        if not isinstance(other, Config):
            return NotImplemented
        mine = (self.knobs, self.device_type, self.file, self.trial_dir)
        return mine == (other.knobs, other.device_type, other.file, other.trial_dir)

    __hash__ = None  # equal by value, and mutable

    def apply_process_knobs(self) -> None:
        """The process-wide knobs this config sets, once: the allocator's environment (where CUDA has not
        started), intra-op threads, cuDNN's autotuning, the fp32 matmul precision. `autotune.config()` applies
        them as it makes the config, before the program's own code runs on; `load_config`'s config, at its first
        `prepare` or `wrap` (loading a file changes nothing of the process)."""
        if self._process_applied:
            return
        self._process_applied = True
        import torch

        from autotune.knobs import apply_backend_flags, apply_process_flags, environment

        if not torch.cuda.is_initialized():  # a trial's process started with them (the launcher's): the same
            os.environ.update(environment(self.knobs, dict(os.environ)))
        apply_process_flags(self.knobs)
        apply_backend_flags(self.knobs)

    def load_compiled(self) -> None:
        """The search's compiled artifacts beside the file (its `compile_artifacts`: the winner's, autotune.trial.
        compiled), loaded once before this process compiles a model, where the file compiles one: production's
        first steps do not compile from scratch. One made with another torch or on another device is stale: one
        line on stderr says so, and the program compiles as usual. Called where a model is prepared (`prepare`,
        `wrap`, the instrumentation's model and Trainer); nothing in a trial (it measures its own compile)."""
        artifacts = self.file.get("compile_artifacts")
        if self._compiled_loaded or self.in_trial or not isinstance(artifacts, dict) or not artifacts.get("path"):
            return
        self._compiled_loaded = True
        if (self.file.get("knobs") or {}).get("compile", "none") == "none":
            return
        import sys

        import torch

        from autotune.trial import compiled

        device = torch.cuda.get_device_name() if self.device_type == "cuda" else "cpu"
        line = compiled.load(artifacts["path"], device)
        if line:
            print(line, file=sys.stderr)

    def claim(self, framework: str) -> None:
        """`framework`'s instrumentation (a Trainer's callback) reports the steps and applies the knobs: torch's
        own (autotune.instrument._torch) stand down."""
        self.framework = framework
        self.loop.claim()

    @property
    def in_trial(self) -> bool:
        """True while autotune measures this process (leave out what a trial need not run)."""
        return self.trial_dir is not None

    @property
    def workload_args(self) -> dict[str, Any]:
        """The searched arguments (`search_space.workload_args`) as this config sets them ({}: none)."""
        return dict(self._args)

    @property
    def trial_workload_args(self) -> dict[str, Any]:
        """Every argument the search's best trial gave your factory: the spec's `workload.args`, the searched
        ones over them (to reproduce its numbers)."""
        return {**((self.file.get("workload") or {}).get("args") or {}), **self.workload_args}

    @property
    def grad_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step this config asks for (the search's keep_effective_batch, which keeps
        the baseline's effective batch; 1: step every batch), with its `batch_size` knob as the micro-batch."""
        return self._accumulation

    @property
    def accumulation_steps(self) -> int:
        """Deprecated: `grad_accumulation_steps`."""
        import warnings

        warnings.warn("`accumulation_steps` is `grad_accumulation_steps`", DeprecationWarning, stacklevel=2)
        return self.grad_accumulation_steps

    @property
    def num_threads(self) -> int | None:
        """Intra-op threads this config sets (None: torch's default, or the program's own)."""
        return self.knobs.get("num_threads")

    @property
    def blocks(self) -> list[str] | None:
        """The model's repeated block classes, where the search named them (resources.blocks)."""
        return self._blocks

    # --- what the program hands over and how the knobs reach it ----------------------------------------------

    def record_model(self, model) -> None:
        """Records what `model` cannot take and runs with on its own (autotune.knobs._lm.what_it_takes),
        before any knob changes it; the first model a program hands over is the one recorded."""
        if self._model_recorded:
            return
        from autotune.knobs._lm import what_it_takes

        self._model_recorded = True
        cannot, own = what_it_takes(model, self.blocks)
        self.cannot.update(cannot)
        self.record_own(own)

    def record_own(self, values: dict[str, Any]) -> None:
        """Records knob values the program runs with on its own; one this config sets is not its own."""
        self.own.update({k: v for k, v in values.items() if k not in self.knobs})

    def record_reach(self, *ways: str) -> None:
        """Records in `used` that the knobs of these ways reach the program: a method of this config it calls,
        or the instrumentation's own way in (`torch:loader`...: `USES`)."""
        self.used.update(ways)

    # --- the methods ----------------------------------------------------------------

    def dataloader_kwargs(self, **yours) -> dict[str, Any]:
        """Your DataLoader arguments with this config's loader knobs over them (autotune.knobs.over_loader_kwargs);
        with none of yours, a `load_config` config's alone (its batch size, workers, pinning, prefetch)."""
        from autotune.knobs import loader_kwargs, over_loader_kwargs

        self.record_reach("dataloader_kwargs")
        # its own loader arguments; the first loader's (the one it trains on, before an evaluation's)
        own = {name: yours[k.kwarg] for name, k in KNOBS.items() if k.stage == "loader" and k.kwarg in yours}
        self.record_own({k: v for k, v in own.items() if v is not None and k not in self.own})
        return over_loader_kwargs(yours, loader_kwargs(self.knobs))

    def prepare(self, model, optimizer=None):
        """The process-wide knobs (`apply_process_knobs`), then the model with the set language-model knobs
        (float8, Liger, attention kernel, activation checkpointing: autotune.knobs._lm.prepare_lm), on this
        config's device, in the set memory format, compiled if set (autotune.knobs.prepare_model); the optimizer
        fused if set, rebuilt with the same class, groups and state (use the one returned). Parameters stay the
        same objects, so an optimizer built before stays valid. Returns (model, optimizer)."""
        from autotune.knobs import prepare_model, prepare_optimizer
        from autotune.knobs._lm import prepare_lm

        self.apply_process_knobs()
        self.record_reach("prepare")
        self.loop.watch(model)
        self.record_model(model)
        prepare_lm(model, self.knobs, self.blocks)
        self.load_compiled()
        model = prepare_model(model, self.knobs, self.device_type)
        return model, None if optimizer is None else prepare_optimizer(optimizer, self.knobs)

    def wrap(self, model):
        """The model as a trial's ranks run it, in torchtitan's order (autotune.knobs.wrap): the set
        language-model knobs (activation checkpointing per repeated block among them), then this rank's device,
        the memory format and compile (`prepare`'s), then, in a process group of two or more ranks (torchrun),
        DDP with the set bucket size, gradient views and static graph, or FSDP2 `fully_shard` per block. Call it
        instead of `prepare`'s model part, after `dist.init_process_group()`, and build the optimizer after it
        (FSDP replaces the parameters by shards)."""
        import torch
        import torch.distributed as dist

        from autotune.knobs import wrap

        self.apply_process_knobs()
        self.record_reach("wrap")
        self.loop.watch(model)
        self.record_model(model)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        device = (
            torch.device(self.device_type, int(os.environ.get("LOCAL_RANK", 0)))
            if self.device_type == "cuda"
            else torch.device("cpu")
        )
        self.load_compiled()
        return wrap(model, self.knobs, device, world, self.blocks)

    def watch(self, model):
        """Hand autotune your model where you call neither `prepare` nor `wrap`: loss parity's noise runs
        perturb its weights (without it, a numerics knob's parity is "not judged"). Returns the model."""
        self.loop.watch(model)
        return model

    def autocast(self):
        """The set precision's autocast (none set: a no-op, your own autocast stays)."""
        import contextlib

        from autotune.knobs import autocast

        self.record_reach("autocast")
        if "precision" not in self.knobs:
            return contextlib.nullcontext()
        return autocast(self.knobs, self.device_type)

    def grad_scaler(self, yours=None):
        """A GradScaler enabled for fp16; for another set precision a disabled one (its calls pass through, so
        one loop serves every precision); with no precision set, `yours` (default: a disabled one)."""
        import torch

        from autotune.knobs import grad_scaler

        self.record_reach("grad_scaler")
        scaler = grad_scaler(self.knobs, self.device_type)  # fp16's, else None
        if scaler is not None:
            return scaler
        if yours is not None and "precision" not in self.knobs:
            return yours
        return torch.amp.GradScaler(self.device_type, enabled=False)

    def to_device(self, batch, preprocess=None, *, device=None):
        """A batch on `device` (default: the config's), non_blocking when pinned, your on-device `preprocess`,
        then channels_last 4-D inputs when set."""
        from autotune.knobs import to_channels_last, to_device

        self.record_reach("to_device")
        batch = to_device(batch, device or self.device_type, non_blocking=bool(self.knobs.get("pin_memory")))
        if preprocess is not None:
            batch = preprocess(batch)
        return to_channels_last(batch) if self.knobs.get("channels_last") else batch

    def zero_grad(self, optimizer, set_to_none: bool = True) -> None:
        """`optimizer.zero_grad` with the set `set_to_none` (else yours)."""
        self.record_reach("zero_grad")
        optimizer.zero_grad(set_to_none=self.knobs.get("set_to_none", set_to_none))

    def training_arguments(self, **yours) -> dict[str, Any]:
        """`TrainingArguments(**cfg.training_arguments(output_dir=..., ...))`, for a script that builds them
        without HfArgumentParser: your arguments with this config's knobs over them (autotune.export.hf_args),
        and in a trial its side-effect settings (`hf_fields`; the instrumentation appends the same to a script's
        own flags, autotune.instrument)."""
        from autotune.export import hf_args

        self.record_reach(*HF_REACHES)
        self.record_own(hf_args.knobs_of(yours))
        return {**yours, **hf_fields(self)}

    # --- the measured loop (autotune.trial.loop) ------------------------------------------

    def steps(self, iterable, *, online: bool | None = None):
        """`for batch in cfg.steps(loader):` each batch; in a trial, the measured loop. Where a best_config.yaml
        is applied with `online` on (the config's, or this loader's own `online=`), a DataLoader is re-tuned
        while it runs: the same `OnlineLoader` (autotune.online) for this loader across epochs."""
        self.record_reach("steps")
        if self.file and (self.online if online is None else online):
            iterable = self._online_loader(iterable)
        return self.loop.steps(iterable)

    def _online_loader(self, loader):
        from torch.utils.data import DataLoader

        if not isinstance(loader, DataLoader):
            return loader
        import weakref

        from autotune.online.loader import OnlineLoader

        if not hasattr(self, "_online"):
            self._online = weakref.WeakKeyDictionary()
        if loader not in self._online:
            options = self.file.get("online") if isinstance(self.file.get("online"), dict) else {}
            self._online[loader] = OnlineLoader(loader, **options)
        return self._online[loader]

    def step(self, samples: int | None = None, loss=None, *, tokens=None, slots=None) -> None:
        """At the end of each optimizer step of a loop without `steps` (or to report its samples and loss). A
        language model's loop says the `tokens` the step trained on (its non-padding tokens, an int or a device
        tensor: it is read at the window's end): its throughput is then tokens/s, and its MFU is counted; and
        the token `slots` its padded batches held (their `input_ids`' size): the share of them that was padding
        is measured. Left out in a `steps` loop: the batches' own (autotune.trial.tokens: `input_ids` and an
        attention mask)."""
        self.record_reach("step")
        self.loop.step(samples, loss, tokens, slots)

    def data(self):
        """`with cfg.data(): batch = get_batch()`: the time inside is data wait."""
        self.record_reach("data")
        return self.loop.data()


TunedConfig = Config  # the name `load_config`'s config had (one class: `autotune.config()`'s too)


def hf_fields(cfg: Config, known: set[str] | None = None, own_kwargs: dict | None = None) -> dict[str, Any]:
    """The TrainingArguments fields a process gets: its config's knobs' (the batch with its accumulation; of the
    parser's `known` fields), and in a trial its side-effect settings (no hub push, tracker, checkpoint or eval;
    the outputs under the trial's dir)."""
    from autotune.export import hf_args

    fields = hf_args.fields(cfg.knobs, cfg.device_type, cfg.grad_accumulation_steps, known, own_kwargs)
    if cfg.trial_dir is not None:
        fields.update(hf_args.TRIAL_FIELDS, output_dir=str(cfg.trial_dir / "output"))
    return fields


def _device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


_made: dict[tuple, Config] = {}


def config(path: str | os.PathLike | None = None, *, online: bool | None = None) -> Config:
    """The program's config: the trial's (AUTOTUNE_TRIAL), else `path`'s or
    AUTOTUNE_CONFIG's best_config.yaml, else none (see the module doc). One per process for each: the program's
    call and the instrumentation's (autotune.instrument) get the same object, where the environment names it (a
    `path` given, or none at all: a new one each call)."""
    key = (os.environ.get(TRIAL_ENV), os.environ.get(CONFIG_ENV), online)
    if path is not None or key[:2] == (None, None):  # a file of the program's own choosing, or plain: its own
        return _config(path, online=online)
    if key not in _made:
        _made[key] = _config(path, online=online)
    return _made[key]


def _config(path: str | os.PathLike | None = None, *, online: bool | None = None) -> Config:
    """The config this process is given (see `config`), its process-wide knobs applied."""
    trial = os.environ.get(TRIAL_ENV)
    path = path or os.environ.get(CONFIG_ENV)
    if trial:
        request = json.loads(Path(trial).read_text())
        device = _device(request.get("device", "auto"))
        cfg = Config(
            canonical(request.get("knobs") or {}), device, request=request, trial_dir=Path(trial).resolve().parent
        )
    elif path:
        from autotune.export import load

        data = load.read(path)
        cfg = _of_file(data, _set_knobs(data), online)
    else:
        cfg = Config({}, _device("auto"), online=bool(online))
    cfg.apply_process_knobs()
    return cfg


def _of_file(data: dict[str, Any], knobs: dict[str, Any], online: bool | None = None) -> Config:
    """The config of best_config.yaml's content `data` that sets `knobs`, its loaders re-tuned as they run where
    `online` says (None: the file's `online`, `{cpu_budget: ..}` too, or AUTOTUNE_ONLINE=1)."""
    if online is None:
        online = bool(data.get("online")) or os.environ.get(ONLINE_ENV) == "1"
    device = (data.get("device") or {}).get("type", "cpu")
    return Config(knobs, _device("auto") if device == "cuda" else device, file=data, online=online)


def load_config(path: str | os.PathLike) -> Config:
    """best_config.yaml for production code: the config that sets every knob the file holds (torch's defaults
    for those it leaves out), so `cfg.dataloader_kwargs()` alone gives its batch size and loader settings. Warns
    where the file was tuned on CUDA and none is here (the config then runs on the CPU), or with another major
    version of torch. (`autotune.config(path)` reads the same file and sets only the knobs the search changed.)"""
    import warnings

    import torch

    from autotune.export import load
    from autotune.knobs import pytorch_defaults

    data = load.read(path)
    device = data.get("device") or {}
    if device.get("type", "cpu") == "cuda" and not torch.cuda.is_available():
        warnings.warn(
            f"{path} was tuned on CUDA ({device.get('name')}) but no CUDA device is available here; its numbers do not apply"
        )
    made_with = str(device.get("torch") or "")
    if made_with and made_with.split(".")[0] != torch.__version__.split(".")[0]:
        warnings.warn(f"{path} was tuned with torch {made_with}; this is torch {torch.__version__}")
    return _of_file(data, {**pytorch_defaults(None), **canonical(data["knobs"])})
