"""`cfg = autotune.config()`: one object for a training program, the same in a
trial and in production (issue 42).

    cfg = autotune.config()
    loader = DataLoader(dataset, **cfg.dataloader_kwargs(batch_size=64, num_workers=2))
    model, optimizer = cfg.prepare(model, optimizer)
    for batch in cfg.steps(loader):          # or: with cfg.data(): batch = get_batch() ... cfg.step(samples=n, loss=loss)
                                             # (a language model's loop: cfg.step(samples=n, tokens=t, loss=loss))
        with cfg.autocast():
            loss = ...

Three modes:
- trial: `AUTOTUNE_TRIAL=<trial dir>/config.json` (the launcher sets it): the
  trial's knobs; `steps`/`step` are the measured loop (`autotune.trial.loop`),
  which writes the trial's result and ends the process once its window is done;
- production: `autotune.config("best_config.yaml")` or `AUTOTUNE_CONFIG=path`:
  the exported knobs, the loop passes through (`online`: issue 43's loader tuner);
- plain: neither: every method returns the program's own values (a no-op).
Only the knobs the config sets override the program's own values. The methods
the program calls are recorded (`used`): a knob whose method it never calls is
"not used by your program" and not searched (`unused`); so are the program's own
values of the knobs (`own`: its DataLoader arguments, its TrainingArguments, its model's),
which a search takes as its baseline.

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


class Config:
    """See the module doc. `knobs`: the knobs this config sets (the rest stay the program's)."""

    def __init__(
        self,
        mode: str,
        knobs: dict[str, Any],
        device_type: str,
        *,
        data: dict[str, Any] | None = None,
        trial_dir: Path | None = None,
        request: dict[str, Any] | None = None,
        online: bool = False,
    ):
        from autotune.trial.loop import PassThrough, TrialLoop

        self.mode, self.knobs, self.device_type, self.file = mode, dict(knobs), device_type, data or {}
        self.trial_dir = trial_dir  # a trial's dir (its program's outputs go under it); None outside a trial
        self.online = online
        self.used: set[str] = set()
        # what the program's model cannot take ("knob" or "knob=value" -> why), and the knob values it runs with
        # on its own: found where a model reaches autotune (prepare, the instrumented Trainer), read off the probe
        self.cannot: dict[str, str] = {}
        self.own: dict[str, Any] = {}
        self._found = False  # a model was handed over (`found`)
        self.carried: set[str] = set()  # knobs a script's own flags carried (autotune.instrument)
        self.framework: str | None = None  # a framework whose instrumentation reports the steps (`claim`)
        self.loop = (
            TrialLoop(request, trial_dir, self.used, device_type, self.cannot, self.own)
            if mode == "trial"
            else PassThrough()
        )
        import torch

        from autotune.knobs import environment

        if mode == "production" and not torch.cuda.is_initialized():  # a trial's process started with them
            os.environ.update(environment(self.knobs, dict(os.environ)))
        if self.knobs.get("num_threads") is not None:
            torch.set_num_threads(self.knobs["num_threads"])
        if "cudnn_benchmark" in self.knobs:
            torch.backends.cudnn.benchmark = bool(self.knobs["cudnn_benchmark"])
        if self.knobs.get("precision") == "tf32":
            torch.set_float32_matmul_precision("high")
            torch.backends.cudnn.allow_tf32 = True

    def claim(self, framework: str) -> None:
        """`framework`'s instrumentation (a Trainer's callback) reports the steps and applies the knobs: torch's
        own (autotune.instrument._torch) stand down."""
        self.framework = framework
        self.loop.claim()

    @property
    def in_trial(self) -> bool:
        """True while autotune measures this process (leave out what a trial need not run)."""
        return self.mode == "trial"

    @property
    def workload_args(self) -> dict[str, Any]:
        """The searched arguments (`search_space.workload_args`) as this config sets them ({}: none)."""
        if self.mode == "trial":
            return dict(self.request_args)
        return dict(self.file.get("workload_args") or {})

    @property
    def grad_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step this config asks for (the search's keep_effective_batch; 1: step
        every batch), with its `batch_size` knob as the micro-batch."""
        if self.mode == "trial":
            return int(self.loop.cfg.get("accum_steps") or 1)
        return int((self.file.get("batch") or {}).get("grad_accumulation_steps") or 1)

    @property
    def blocks(self) -> list[str] | None:
        """The model's repeated block classes, where the search named them (resources.blocks)."""
        if self.mode == "trial":
            return self.loop.cfg.get("blocks")
        return (self.file.get("parallel") or {}).get("blocks")

    def found(self, model) -> None:
        """Records what `model` cannot take and runs with on its own (autotune.knobs._lm.what_it_takes),
        before any knob changes it; the first model a program hands over is the one recorded."""
        if self._found:
            return
        from autotune.knobs._lm import what_it_takes

        self._found = True
        cannot, own = what_it_takes(model, self.blocks)
        self.cannot.update(cannot)
        self.found_own(own)

    def found_own(self, values: dict[str, Any]) -> None:
        """Records knob values the program runs with on its own; one this config sets is not its own."""
        self.own.update({k: v for k, v in values.items() if k not in self.knobs})

    @property
    def request_args(self) -> dict[str, Any]:
        return ((self.loop.cfg.get("workload") or {}).get("args") or {}) if self.mode == "trial" else {}

    def _full(self) -> dict[str, Any]:
        """Every knob: this config's over PyTorch's defaults (for the appliers that need all)."""
        from autotune.knobs import pytorch_defaults

        return {**pytorch_defaults(None), **self.knobs}

    # --- the methods ----------------------------------------------------------------

    def dataloader_kwargs(self, **yours) -> dict[str, Any]:
        """Your DataLoader arguments with this config's loader knobs over them."""
        from autotune.knobs import loader_kwargs

        self.used.add("dataloader_kwargs")
        # its own loader arguments; the first loader's (the one it trains on, before an evaluation's)
        own = {name: yours[k.kwarg] for name, k in KNOBS.items() if k.stage == "loader" and k.kwarg in yours}
        self.found_own({k: v for k, v in own.items() if v is not None and k not in self.own})
        out = {**yours, **loader_kwargs(self.knobs)}
        if not out.get("num_workers"):  # without workers DataLoader refuses these
            for name in ("prefetch_factor", "persistent_workers"):
                if name not in yours:
                    out.pop(name, None)
        return out

    def prepare(self, model, optimizer=None):
        """The model with the set language-model knobs (float8, Liger, attention kernel, activation checkpointing:
        autotune.knobs._lm.prepare_lm), in the set memory format, compiled if set (on its own device); the
        optimizer fused if set (use the one returned). Returns (model, optimizer)."""
        import torch

        from autotune.knobs import prepare_optimizer
        from autotune.knobs._lm import prepare_lm

        self.used.add("prepare")
        self.loop.watch(model)
        self.found(model)
        prepare_lm(model, self.knobs, self.blocks)
        if self.knobs.get("channels_last"):
            model = model.to(memory_format=torch.channels_last)
        if self.knobs.get("compile", "none") != "none":
            mode = None if self.knobs["compile"] == "default" else self.knobs["compile"]
            model = torch.compile(model, mode=mode)
        return model, None if optimizer is None else prepare_optimizer(optimizer, self.knobs)

    def wrap(self, model):
        """As `TunedConfig.wrap`: checkpointing, device, layout, compile, then DDP/FSDP with ranks."""
        import torch
        import torch.distributed as dist

        from autotune.knobs import wrap

        self.used.add("wrap")
        self.loop.watch(model)
        self.found(model)
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        device = (
            torch.device(self.device_type, int(os.environ.get("LOCAL_RANK", 0)))
            if self.device_type == "cuda"
            else torch.device("cpu")
        )
        # the language-model knobs where this config sets them (else the model's own, as it came)
        knobs = {k: v for k, v in self._full().items() if k not in LM_MODEL or k in self.knobs}
        return wrap(model, knobs, device, world, self.blocks)

    def watch(self, model):
        """Hand autotune your model where you call neither `prepare` nor `wrap`: loss parity's noise runs
        perturb its weights (without it, a numerics knob's parity is "not judged"). Returns the model."""
        self.loop.watch(model)
        return model

    def autocast(self):
        """The set precision's autocast (none set: a no-op, your own autocast stays)."""
        import contextlib

        from autotune.knobs import autocast

        self.used.add("autocast")
        if "precision" not in self.knobs:
            return contextlib.nullcontext()
        return autocast(self.knobs, self.device_type)

    def grad_scaler(self, yours=None):
        """A GradScaler enabled for fp16 when a precision is set; else `yours`
        (default: a disabled one, whose calls pass through)."""
        import torch

        self.used.add("grad_scaler")
        if "precision" in self.knobs:
            return torch.amp.GradScaler(self.device_type, enabled=self.knobs["precision"] == "16-mixed")
        return yours if yours is not None else torch.amp.GradScaler(self.device_type, enabled=False)

    def to_device(self, batch, device=None, preprocess=None):
        """A batch on `device` (default: the config's), non_blocking when pinned, your
        `preprocess`, then channels_last 4-D inputs when set."""
        from autotune.knobs import to_channels_last, to_device

        self.used.add("to_device")
        batch = to_device(batch, device or self.device_type, non_blocking=bool(self.knobs.get("pin_memory")))
        if preprocess is not None:
            batch = preprocess(batch)
        return to_channels_last(batch) if self.knobs.get("channels_last") else batch

    def zero_grad(self, optimizer, set_to_none: bool = True) -> None:
        self.used.add("zero_grad")
        optimizer.zero_grad(set_to_none=self.knobs.get("set_to_none", set_to_none))

    def training_arguments(self, **yours) -> dict[str, Any]:
        """`TrainingArguments(**cfg.training_arguments(output_dir=..., ...))`, for a script that builds them
        without HfArgumentParser: your arguments with this config's knobs over them (autotune.export.hf_args),
        and in a trial its side-effect settings (`hf_fields`; the instrumentation appends the same to a script's
        own flags, autotune.instrument)."""
        from autotune.export import hf_args

        self.used.update(HF_REACHES)
        self.found_own(hf_args.knobs_of(yours))
        return {**yours, **hf_fields(self)}

    # --- the measured loop (autotune.trial.loop) ------------------------------------------

    def steps(self, iterable, *, online: bool | None = None):
        """`for batch in cfg.steps(loader):` each batch; in a trial, the measured loop. In production with
        `online` on (the config's, or this loader's own `online=`), a DataLoader is re-tuned while it runs: the
        same `OnlineLoader` (autotune.online) for this loader across epochs."""
        self.used.add("steps")
        if self.mode == "production" and (self.online if online is None else online):
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

    def step(self, samples: int | None = None, loss=None, *, tokens=None) -> None:
        """At the end of each optimizer step of a loop without `steps` (or to report its samples and loss). A
        language model's loop says the `tokens` the step trained on (its non-padding tokens, an int or a device
        tensor: it is read at the window's end): its throughput is then tokens/s, and its MFU is counted. Left
        out in a `steps` loop: the batches' own (autotune.trial.tokens: `input_ids` and an attention mask)."""
        self.used.add("step")
        self.loop.step(samples, loss, tokens)

    def data(self):
        """`with cfg.data(): batch = get_batch()`: the time inside is data wait."""
        self.used.add("data")
        return self.loop.data()


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
    trial = os.environ.get(TRIAL_ENV)
    if trial:
        request = json.loads(Path(trial).read_text())
        return Config(
            "trial",
            canonical(request.get("knobs") or {}),
            _device(request.get("device", "auto")),
            trial_dir=Path(trial).resolve().parent,
            request=request,
        )
    path = path or os.environ.get(CONFIG_ENV)
    if path:
        from autotune.export import load

        data = load.read(path)
        if online is None:
            online = bool(data.get("online")) or os.environ.get(ONLINE_ENV) == "1"  # `online: {cpu_budget: ..}` too
        device = (data.get("device") or {}).get("type", "cpu")
        return Config(
            "production", _set_knobs(data), _device("auto") if device == "cuda" else device, data=data, online=online
        )
    return Config("plain", {}, _device("auto"), online=bool(online))
