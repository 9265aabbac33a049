"""A `lightning.Trainer` script measured and tuned with no line changed: what
`autotune.instrument` does to every Trainer the script (or its `LightningCLI`) makes.

- `trainer_kwargs`: the Trainer's own arguments, with the `precision` knob (Lightning's own names; tf32 is
  "32-true" with TF32 matmuls), the batch's accumulation (`accumulate_grad_batches`: the micro-batches a step
  takes where the search keeps the effective batch, 1 otherwise) and the callback; in a trial its outputs go under the trial's dir, with no
  logger, checkpoints, progress bar or validation (an early stop never saves or evaluates);
- `AutotuneCallback.setup`: the loader knobs reach every DataLoader the script's `train_dataloader()` hook
  builds (its own arguments, the config's loader knobs over them: `cfg.dataloader_kwargs`); the
  language-model knobs reach the LightningModule (autotune.knobs._lm.prepare_lm: the attention kernel of the
  transformers model inside it, Liger, float8, activation checkpointing per repeated block); `channels_last`
  puts the LightningModule's weights in that format and `compile` compiles it in place (`nn.Module.compile`);
  `fused_optimizer` is not reached (the script's `configure_optimizers` builds its optimizer: not recorded as
  used, so not searched);
- the window: each optimizer step (`trainer.global_step` moved) reports `cfg.step(samples=..., tokens=..., loss=...)`
  at `on_train_batch_end`; the time from there to the next `on_train_batch_start` is the data wait
  (`cfg.data()`): Lightning fetches the next batch, and moves it to the device, in that gap (across an
  epoch's end too: a new epoch's loader workers start there).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback

from autotune.trial.loop import batch_samples
from autotune.trial.tokens import count as count_tokens

# the config's methods whose knobs reach a Lightning script (the usage record, autotune.instrument):
# precision here, the language-model knobs, channels_last and compile in `AutotuneCallback.setup` (the loaders
# call cfg.dataloader_kwargs)
REACHES = ("autocast", "wrap")
# what a trial sets on the Trainer so the script leaves nothing behind and runs training steps only
TRIAL_KWARGS = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "limit_val_batches": 0,
    "num_sanity_val_steps": 0,
}


def trainer_kwargs(kwargs: dict[str, Any], cfg, trial_dir: Path | None) -> dict[str, Any]:
    """The script's Trainer arguments with the knobs' and the callback (and a trial's settings)."""
    out = dict(kwargs)
    precision = cfg.knobs.get("precision")
    if precision == "tf32":
        import torch

        torch.set_float32_matmul_precision("high")
        precision = "32-true"
    if precision is not None:
        out["precision"] = precision
    if cfg.knobs.get("batch_size") is not None:  # the micro-batch: a step trains on what the knob says
        out["accumulate_grad_batches"] = cfg.grad_accumulation_steps
    if trial_dir is not None:
        out.update(TRIAL_KWARGS, default_root_dir=str(trial_dir / "output"))
    callbacks = out.get("callbacks") or []
    out["callbacks"] = [*(callbacks if isinstance(callbacks, (list, tuple)) else [callbacks]), AutotuneCallback(cfg)]
    return out


@contextlib.contextmanager
def tuned_loaders(cfg):
    """Within it, a DataLoader made with the script's arguments gets the config's loader knobs over them."""
    from torch.utils.data import DataLoader

    init = DataLoader.__init__
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        yours = {k: v for k, v in bound.arguments.items() if k != "self"}
        init(self, **cfg.dataloader_kwargs(**yours))

    DataLoader.__init__ = __init__
    try:
        yield
    finally:
        DataLoader.__init__ = init


class AutotuneCallback(Callback):
    """Applies the knobs a Trainer argument cannot carry and reports each optimizer step to the measured loop."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.samples, self.tokens, self.loss, self.global_step = 0, 0, None, None
        self.waiting = None  # the open `cfg.data()` between a batch's end and the next one's start

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        source = trainer.datamodule if trainer.datamodule is not None else pl_module
        build = source.train_dataloader

        @functools.wraps(build)
        def train_dataloader(*args, **kwargs):
            with tuned_loaders(self.cfg):
                return build(*args, **kwargs)

        source.train_dataloader = train_dataloader
        self.cfg.watch(pl_module)  # loss parity's noise runs perturb it (autotune.safety.program_parity)
        from autotune.knobs import prepare_model
        from autotune.knobs._lm import prepare_lm

        self.cfg.record_model(pl_module)
        prepare_lm(pl_module, self.cfg.knobs, self.cfg.blocks)
        prepare_model(pl_module, self.cfg.knobs, in_place=True)  # Lightning holds the module: compiled in place

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.waiting is not None:
            self.waiting.__exit__(None, None, None)
            self.waiting = None
        if self.global_step is None:
            self.global_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.samples += batch_samples(batch) or 0
        counted = count_tokens(batch)  # a language model's (`input_ids`): on the device, read at the window's end
        self.tokens = None if counted is None or self.tokens is None else self.tokens + counted[0]
        if loss is not None:
            self.loss = loss.detach() if self.loss is None else self.loss + loss.detach()
        if trainer.global_step != self.global_step:  # the optimizer stepped (accumulation: every N batches)
            self.global_step = trainer.global_step
            samples, tokens, loss = self.samples, self.tokens, self.loss
            self.samples, self.tokens, self.loss = 0, 0, None
            self.cfg.step(samples=samples, tokens=tokens, loss=loss)
        self.waiting = self.cfg.data()
        self.waiting.__enter__()
