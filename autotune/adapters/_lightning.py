"""A Workload from a LightningModule and its LightningDataModule.

What a trial runs per step is what a Trainer runs for automatic optimization,
less the Trainer: the module's own `training_step(batch, batch_idx)` (its loss: a
tensor, or a dict with "loss"), backward, `optimizer.step()`, `zero_grad()`.

- The model: a fresh deep copy of the module for every trial and parity run, in
  training mode, after `prepare_data()`, `setup("fit")` and `configure_model()`
  ran once on the module (as a Trainer calls them).
- The data: the DataModule's `train_dataloader()` (after its `prepare_data()` and
  `setup("fit")`), or the module's own when no DataModule is given: its dataset,
  batch size and collate_fn. Its other settings (workers, pinning, shuffle) are
  knobs: your current ones go in the spec's `baseline`.
- The optimizer: the one `configure_optimizers()` returns (alone, in a list, or
  in a dict / pair of lists with LR schedulers); a scheduler with
  `"interval": "step"` steps every `frequency` optimizer steps, as the Trainer
  steps it (an epoch-interval one, Lightning's default, steps at an epoch's end,
  which a trial does not reach).
- The Trainer (`trainer=`: your `Trainer`, or the dict of its arguments): its
  `precision` is the baseline's, and its `gradient_clip_val` /
  `gradient_clip_algorithm` clip every step through Lightning's own precision
  plugin for the trial's precision (`clip_gradients`), so a config the Trainer
  refuses (a fused optimizer that unscales inside its step, clipping, a mixed
  precision) fails its trial as your program would, with Lightning's error, and
  is never the winner. Not run: `accumulate_grad_batches`, an overridden
  `configure_gradient_clipping`.
- Compile: autotune compiles the module (`torch.compile(module)`); a compiled
  module's `training_step` runs compiled, as Lightning runs one passed to
  `trainer.fit` (lightning.pytorch.utilities.compile.from_compiled compiles
  `forward` and `training_step` with the wrapper's own compiler context), so
  the whole step, whatever submodules it calls, runs through the compiler.
  channels_last moves the module's weights and the 4-D inputs, as for any workload.
- `on_after_batch_transfer` runs on the device batch before `training_step`,
  outside autocast (as Lightning runs it). `self.log` is a no-op outside a
  Trainer (its warning that no Trainer is attached is silenced in the process).

Not supported, each a clear error: manual optimization (`automatic_optimization
= False`), more than one optimizer, `configure_optimizers()` returning none or
needing `self.trainer` (pass `optimizer=`), an overridden
`on_before_batch_transfer` or `transfer_batch_to_device`, several or iterable
train loaders. Other Trainer-side hooks (`on_train_batch_start`,
`on_before_backward`, an overridden `optimizer_step` or `backward`) do not run:
they change what a step computes, little what it costs.
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections.abc import Mapping
from typing import Any, Callable

from autotune.adapters._common import Copies, check_batch_size, check_map_style, require
from autotune.workload import Workload, WorkloadError

NOT_RUN_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device")


def lightning(
    module,
    datamodule=None,
    *,
    trainer=None,
    batch_size: int | None = None,
    optimizer: Callable[[Any], Any] | None = None,
) -> Workload:
    """A Workload that trains `module` (a LightningModule) on `datamodule`'s
    train_dataloader() (default: the module's own), as `trainer` (a Trainer or
    the dict of its arguments) would: its precision, its gradient clipping.
    `batch_size` overrides the loader's; `optimizer(params)` replaces
    `configure_optimizers()`."""
    pl = _package_of(module)
    trainer = _trainer(trainer, pl)
    if not module.automatic_optimization:
        raise WorkloadError(
            "autotune.adapters.lightning: manual optimization (automatic_optimization = False) is "
            "not supported: autotune runs backward and the optimizer step itself"
        )
    overridden = [h for h in NOT_RUN_HOOKS if getattr(type(module), h) is not getattr(pl.LightningModule, h)]
    if overridden:
        raise WorkloadError(
            f"autotune.adapters.lightning: {', '.join(overridden)} is overridden, and autotune "
            "moves batches to the device itself; move that work into the dataset or collate_fn, "
            "or into on_after_batch_transfer (which runs)"
        )
    loader = _train_loader(module, datamodule, pl)
    size = check_batch_size(
        batch_size if batch_size is not None else loader.batch_size,
        "lightning",
        "batch_size= or the train_dataloader's",
    )
    check_map_style(loader.dataset, "lightning", "the train_dataloader's dataset")
    if not any(p.requires_grad for p in module.parameters()):
        raise WorkloadError(f"autotune.adapters.lightning: {type(module).__name__} has no trainable parameters")
    # the one warning a step outside a Trainer gives on every self.log call (under compile too): noise here
    warnings.filterwarnings("ignore", message=r".*self\.log\(\)` but the `self\.trainer` reference is not registered")
    step = _Steps(module, pl)
    clip = trainer is not None and (trainer.gradient_clip_val or 0) > 0
    return Workload(
        model=step.new_module,
        dataset=loader.dataset,
        loss=step.loss,
        batch_size=size,
        optimizer=optimizer or step.optimizer,
        collate_fn=_collate_fn(loader),
        clip=_Clip(pl, trainer) if clip else None,
        scheduler=None if optimizer else step.scheduler,
        baseline=None if trainer is None else {"precision": _precision(trainer.precision)},
    )


def _trainer(trainer, pl):
    """The user's Trainer; built from its arguments when given a dict."""
    if trainer is None or isinstance(trainer, pl.Trainer):
        return trainer
    if not isinstance(trainer, Mapping):
        raise WorkloadError(
            f"autotune.adapters.lightning: `trainer` must be a Trainer or the dict of its "
            f"arguments, got {type(trainer).__name__}"
        )
    quiet = {
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    try:
        return pl.Trainer(**{**quiet, **trainer})
    except (TypeError, ValueError) as e:
        raise WorkloadError(f"autotune.adapters.lightning: Trainer(**trainer) failed: {e}") from e


def _precision(precision: str) -> str:
    """The Trainer's precision as the `precision` knob's value."""
    from autotune.knobs import PRECISIONS

    if precision not in PRECISIONS or precision == "tf32":
        raise WorkloadError(
            f"autotune.adapters.lightning: the Trainer's precision {precision!r} is not one "
            "autotune runs; it runs 32-true, bf16-mixed and 16-mixed"
        )
    return precision


class _Clip:
    """The Trainer's gradient clipping, by Lightning's precision plugin for the
    trial's precision (its `clip_gradients`, as the Trainer calls it)."""

    def __init__(self, pl, trainer):
        self.pl = pl
        self.value = trainer.gradient_clip_val
        self.algorithm = pl.utilities.GradClipAlgorithmType(trainer.gradient_clip_algorithm or "norm")
        self.plugins: dict = {}

    def __call__(self, model, optimizer, precision: str) -> None:
        plugin = self.plugins.get(precision)
        if plugin is None:
            from importlib import import_module

            plugins = import_module(self.pl.__name__ + ".plugins.precision")
            device = next(model.parameters()).device.type
            plugin = self.plugins[precision] = (
                plugins.MixedPrecision(precision, device)
                if precision in ("16-mixed", "bf16-mixed")
                else plugins.Precision()
            )
        plugin.clip_gradients(optimizer, self.value, self.algorithm)


def _package_of(module):
    """`lightning.pytorch` or `pytorch_lightning`: whichever the module comes from."""
    found = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            pkg = require(name, "lightning", "lightning")
        except ImportError:
            continue
        found.append(pkg)
        if isinstance(module, pkg.LightningModule):
            return pkg
    if not found:
        require("lightning.pytorch", "lightning", "lightning")  # raises, naming the extra
    raise WorkloadError(f"autotune.adapters.lightning: `module` must be a LightningModule, got {type(module).__name__}")


def _train_loader(module, datamodule, pl):
    """The hooks a Trainer calls before training, in its order, then the loader."""
    from torch.utils.data import DataLoader

    if datamodule is not None and not callable(getattr(datamodule, "train_dataloader", None)):
        raise WorkloadError(
            f"autotune.adapters.lightning: `datamodule` ({type(datamodule).__name__}) has no "
            "train_dataloader(); pass a LightningDataModule"
        )
    if datamodule is None and type(module).train_dataloader is pl.LightningModule.train_dataloader:
        raise WorkloadError(
            "autotune.adapters.lightning: no datamodule given and "
            f"{type(module).__name__} defines no train_dataloader(); pass your LightningDataModule"
        )
    for obj in (datamodule, module):
        if obj is not None:
            obj.prepare_data()
            obj.setup("fit")
    module.configure_model()
    loader = (module if datamodule is None else datamodule).train_dataloader()
    if not isinstance(loader, DataLoader):
        raise WorkloadError(
            f"autotune.adapters.lightning: train_dataloader() returned {type(loader).__name__}; "
            "autotune tunes one torch DataLoader over a map-style dataset"
        )
    return loader


def _collate_fn(loader):
    """The loader's collate_fn; torch's own (batch_size=None: no batching) is left to torch."""
    from torch.utils.data._utils.collate import default_convert

    return None if loader.collate_fn is default_convert else loader.collate_fn


class _Steps:
    """The module's copies and their training step."""

    def __init__(self, module, pl):
        from importlib import import_module

        signature = import_module(pl.__name__ + ".utilities.signature_utils")
        self.copies = Copies(module, "lightning")
        self.takes_batch_idx = signature.is_param_in_hook_signature(module.training_step, "batch_idx", min_args=2)
        self.after_transfer = type(module).on_after_batch_transfer is not pl.LightningModule.on_after_batch_transfer
        self.schedulers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> (config, its params)
        self.batch_idx: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # copy -> its step counter
        self.compiled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # compiled wrapper -> its step

    def new_module(self):
        module = self.copies.new()
        self.batch_idx[module] = itertools.count()
        return module

    def optimizer(self, params):
        """The copy's own configure_optimizers(), for the copy that owns `params`."""
        import torch

        module = self.copies.owner(params)
        try:
            conf = module.configure_optimizers()
        except RuntimeError as e:  # e.g. self.trainer.estimated_stepping_batches: no Trainer here
            raise WorkloadError(
                f"autotune.adapters.lightning: configure_optimizers() failed outside a Trainer: {e}; "
                "pass optimizer=lambda params: ... to autotune.adapters.lightning"
            ) from e
        built = _one_optimizer(conf, torch.optim.Optimizer)
        self.schedulers[module] = _step_scheduler(conf)
        return built

    def scheduler(self, optimizer):
        """The copy's step-interval scheduler, over `optimizer` (the one the knobs
        made of the module's: fused, a new object); None without one."""
        module = self.copies.owner(p for g in optimizer.param_groups for p in g["params"])
        found = self.schedulers.get(module)
        if found is None:
            return None
        scheduler, frequency = found
        if scheduler.optimizer is not optimizer:  # rebound: the same schedule over the rebuilt optimizer
            warnings.filterwarnings("ignore", message=r"Seems like `optimizer\.step\(\)` has been overridden")
            scheduler.optimizer = optimizer
        return _Every(scheduler, frequency) if frequency > 1 else scheduler

    def loss(self, model, batch):
        """The module's training_step on a device batch; `model` is the copy, or
        the copy compiled by autotune (then the step runs compiled)."""
        import torch

        module = getattr(model, "_orig_mod", model)
        step = module.training_step
        if module is not model:  # torch.compile's wrapper: compile the step with its own context, as Lightning does
            step = self.compiled.get(model)
            if step is None:
                step = self.compiled[model] = model.dynamo_ctx(module.training_step)
        if self.after_transfer:
            with torch.autocast(next(module.parameters()).device.type, enabled=False):
                batch = module.on_after_batch_transfer(batch, 0)
        counter = self.batch_idx.setdefault(module, itertools.count())
        out = step(batch, next(counter)) if self.takes_batch_idx else step(batch)
        loss = out.get("loss") if isinstance(out, Mapping) else out
        if not isinstance(loss, torch.Tensor):
            raise WorkloadError(
                f"autotune.adapters.lightning: training_step returned {_what(out)}; it must return "
                'the loss (a tensor, or a dict with "loss") on every step'
            )
        return loss


def _one_optimizer(conf, optimizer_type):
    """The one optimizer of any form configure_optimizers() may return."""
    if isinstance(conf, (list, tuple)) and len(conf) == 2 and all(isinstance(c, (list, tuple)) for c in conf):
        conf = conf[0]  # ([optimizers], [schedulers])
    items = list(conf) if isinstance(conf, (list, tuple)) else [conf]
    found = [c.get("optimizer") if isinstance(c, Mapping) else c for c in items]
    if len(found) == 1 and isinstance(found[0], optimizer_type):
        return found[0]
    if len(found) > 1:
        raise WorkloadError(
            f"autotune.adapters.lightning: configure_optimizers() returned {len(found)} optimizers; "
            "autotune steps one (several need manual optimization, which it does not support)"
        )
    raise WorkloadError(
        f"autotune.adapters.lightning: configure_optimizers() returned {_what(conf)}; autotune needs "
        'one torch.optim.Optimizer (alone, in a list, or under "optimizer" in a dict), or pass '
        "optimizer=lambda params: ... to autotune.adapters.lightning"
    )


def _step_scheduler(conf):
    """(scheduler, frequency) of configure_optimizers()'s scheduler with
    interval "step"; None for none, or one stepped per epoch (the default)."""
    if isinstance(conf, (list, tuple)) and len(conf) == 2 and all(isinstance(c, (list, tuple)) for c in conf):
        found = list(conf[1])  # ([optimizers], [schedulers])
    else:
        items = list(conf) if isinstance(conf, (list, tuple)) else [conf]
        found = [c.get("lr_scheduler") for c in items if isinstance(c, Mapping) and c.get("lr_scheduler")]
    for sched in found:
        if isinstance(sched, Mapping) and sched.get("interval") == "step" and sched.get("scheduler") is not None:
            return sched["scheduler"], int(sched.get("frequency", 1))
    return None


class _Every:
    """A scheduler stepped every `frequency` optimizer steps."""

    def __init__(self, scheduler, frequency: int):
        self.scheduler, self.frequency, self.calls = scheduler, frequency, 0

    def step(self):
        self.calls += 1
        if self.calls % self.frequency == 0:
            self.scheduler.step()


def _what(obj) -> str:
    if isinstance(obj, Mapping):
        return f"a dict with keys {sorted(map(str, obj))}"
    return "None" if obj is None else f"a {type(obj).__name__}"
