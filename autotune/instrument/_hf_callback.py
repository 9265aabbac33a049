"""A `transformers.Trainer` measured with no line of its script changed: the callback that
`autotune.instrument.sitecustomize` attaches to every Trainer when the process is a trial (or runs under
`autotune run`).

- data wait: the Trainer takes an optimizer step's batches with `get_batch_samples` (its `next()` on the
  train dataloader's iterator); that call runs inside `cfg.data()`, and its batches are counted (samples: a
  batch's rows, or its sequences where a padding-free collator flattened them into one row, `count_samples`);
- the step: `on_step_end` (after the optimizer step and the LR scheduler) reports `cfg.step(samples=...,
  tokens=..., loss=...)`, the tokens being the batches' non-padding ones (autotune.trial.tokens.count), the loss
  the sum of the step's micro-batch losses that `training_step` returned (tensors: no host sync per step);
- the model: `on_train_begin` hands it over (`cfg.watch`: loss parity's noise runs perturb it);
- the end: the measured loop writes result.json and ends the process once its windows are done, so the
  Trainer's final save and eval never run;
- the language-model knobs the script's flags do not carry (`apply_lm`): the attention kernel set on its model,
  float8 Linear layers, and padding-free batches: its collator wrapped, each padded batch flattened into one row
  with position ids (autotune.knobs._lm.flatten), for any Trainer whose model is a causal language model (TRL's
  own `padding_free` refuses a `max_length` without packing; this keeps the script's truncation).

    trainer = Trainer(...)            # the script's own line; the patched __init__ then calls
    attach(trainer, autotune.config())
    apply_lm(trainer, autotune.config())
"""

from __future__ import annotations


from transformers import TrainerCallback

from autotune.trial.tokens import count as count_tokens
from autotune.trial.tokens import padded
from autotune.trial.tokens import count_samples  # noqa: F401  (this module's name for it, the tests')


class AutotuneCallback(TrainerCallback):
    """Reports each optimizer step of the Trainer it is attached to (`attach`) to the measured loop."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.samples, self.tokens, self.slots = 0, 0, 0
        self.loss = None

    def fetched(self, batches: list) -> None:
        self.samples = self.samples + sum(count_samples(b) or 0 for b in batches)  # an int, or a device tensor
        counted = [count_tokens(b) for b in batches]
        if self.tokens is not None:  # a language model's batches (`input_ids`): their tokens too
            self.tokens = None if None in counted else self.tokens + sum(c[0] for c in counted)
        slots = [padded(b) for b in batches]  # ... and their token slots, padding included
        self.slots = None if self.slots is None or None in slots else self.slots + sum(slots)

    def micro_step(self, loss) -> None:
        self.loss = loss if self.loss is None else self.loss + loss

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:  # loss parity's noise runs perturb it (autotune.safety.program_parity)
            self.cfg.watch(model)

    def on_step_end(self, args, state, control, **kwargs):
        samples, tokens, slots, loss = self.samples, self.tokens, self.slots, self.loss
        self.samples, self.tokens, self.slots, self.loss = 0, 0, 0, None
        self.cfg.step(samples=samples, tokens=tokens, loss=loss, slots=slots if tokens is not None else None)


def apply_lm(trainer, cfg) -> None:
    """The language-model knobs no flag of the script sets (`cfg.flag_knobs`), on the Trainer as its __init__
    left it (its optimizer is built in train(), after them); first, what its model cannot take and runs with
    on its own is recorded (`cfg.record_model`: the probe's), and `flatten` as a way in (padding-free batches reach any
    Trainer; whether its model can take them is in `cfg.cannot`)."""
    from autotune.knobs import _lm

    model = trainer.model
    cfg.record_model(model)
    cfg.record_reach("flatten")
    cfg.load_compiled()  # production: the search's compiled artifacts, before the Trainer compiles (torch_compile)
    knobs = cfg.knobs
    if knobs.get("float8") not in (None, "off"):
        _lm.to_float8(model, knobs["float8"])
    if knobs.get("attention") is not None and "attention" not in cfg.flag_knobs:
        _lm.set_attention(model, knobs["attention"])
    if knobs.get("padding_free") and not getattr(trainer.data_collator, "padding_free", False):
        why = _lm.padding_free_cannot(model)
        if why:
            raise _lm.LMKnobError(f"padding_free: {why}")
        trainer.data_collator = _lm.Flattening(trainer.data_collator)


def attach(trainer, cfg) -> AutotuneCallback:
    """`trainer` reports to `cfg`: its batch fetch timed as data wait, its micro-batch losses summed per step,
    the callback added (wrapping the instance's own methods, so a subclass's overrides still run)."""
    callback = AutotuneCallback(cfg)
    cfg.claim("transformers")  # its callback reports the steps: torch's hooks stand down
    get_batch_samples, training_step = trainer.get_batch_samples, trainer.training_step

    def timed_get_batch_samples(*args, **kwargs):
        with cfg.data():
            out = get_batch_samples(*args, **kwargs)
        callback.fetched(out[0])
        return out

    def reported_training_step(*args, **kwargs):
        loss = training_step(*args, **kwargs)
        callback.micro_step(loss)
        return loss

    trainer.get_batch_samples = timed_get_batch_samples
    trainer.training_step = reported_training_step
    trainer.add_callback(callback)
    return callback
