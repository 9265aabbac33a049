"""A Workload from a `transformers.Trainer`, or from a Hugging Face model and a
map-style dataset of dict samples.

From a Trainer (`huggingface(trainer)`), the trial steps as the Trainer does,
with its own code: its model and `train_dataset`, its `data_collator`, its
`compute_loss`, the optimizer and LR scheduler its `create_optimizer` /
`create_scheduler` build from its args (`optim`, learning rate, weight decay,
`lr_scheduler_type`, warmup), and its gradient clipping (`max_grad_norm`, by its
own `_clip_grad_norm`). Its args are the baseline: `per_device_train_batch_size`,
`dataloader_num_workers`, `dataloader_pin_memory` (where CUDA is), persistent
workers and prefetch, `bf16`/`fp16`/`tf32`, `torch_compile`, and a fused `optim`
(transformers 5's default `adamw_torch_fused`) as `fused_optimizer: true`. Not
run: `gradient_accumulation_steps` (a trial steps every batch), callbacks,
`gradient_checkpointing`.

From a model and a dataset (`huggingface(model, dataset, ...)`):

- The model: a fresh deep copy of `model` for every trial and parity run, in
  training mode (`from_pretrained` returns one in eval mode; the Trainer trains in
  training mode). Load it before: trials never download.
- The batches: dicts of tensors, the model's keyword arguments. The default
  collate is transformers' `default_data_collator` (the Trainer's without a
  tokenizer): it stacks each key, renames `label`/`label_ids` to `labels` and
  drops string fields. Samples of different lengths need your padding collate_fn
  (e.g. `DataCollatorWithPadding(tokenizer)`).
- The loss: the model's own, `model(**batch).loss` (the batch needs `labels`);
  for a model that returns none, pass `loss=lambda model, batch: ...`.
- The optimizer: `optimizer(params)`, default `torch.optim.AdamW(params, lr=5e-5)`
  (the Trainer's learning rate and weight decay; not its fused kernel).
- The dataset: anything with len() and dataset[i] -> dict: a torch Dataset, a
  list of dicts, a `datasets.Dataset` (`datasets` is not required).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from autotune.adapters._common import Copies, check_batch_size, check_map_style, fresh_copy, require
from autotune.workload import Workload, WorkloadError


def huggingface(
    model,
    dataset=None,
    collate_fn: Callable | None = None,
    *,
    batch_size: int = 8,
    optimizer: Callable[[Any], Any] | None = None,
    loss: Callable[[Any, Any], Any] | None = None,
    count_samples: Callable[[Any], int] | None = None,
) -> Workload:
    """A Workload that trains as `model`, a `transformers.Trainer`, trains; or
    that trains `model` (a transformers model, or any nn.Module taking the
    batch's keys) on `dataset`, `batch_size` samples a batch (default: the
    Trainer's 8)."""
    transformers = require("transformers", "hf", "huggingface")
    import torch

    if isinstance(model, transformers.Trainer):
        return _from_trainer(model, count_samples)
    if dataset is None:
        raise WorkloadError(
            f"autotune.adapters.huggingface: pass a transformers.Trainer, or a model and its "
            f"dataset; got a {type(model).__name__} and no dataset"
        )
    if not isinstance(model, torch.nn.Module):
        raise WorkloadError(
            f"autotune.adapters.huggingface: `model` must be a torch.nn.Module (a transformers "
            f"model), got {type(model).__name__}"
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise WorkloadError(f"autotune.adapters.huggingface: {type(model).__name__} has no trainable parameters")
    check_map_style(dataset, "huggingface", "`dataset`")
    check_batch_size(batch_size, "huggingface", "batch_size=")
    for name, fn in (
        ("collate_fn", collate_fn),
        ("optimizer", optimizer),
        ("loss", loss),
        ("count_samples", count_samples),
    ):
        if fn is not None and not callable(fn):
            raise WorkloadError(
                f"autotune.adapters.huggingface: `{name}` must be callable or None, got {type(fn).__name__}"
            )
    if collate_fn is None:
        sample = dataset[0]
        if not isinstance(sample, Mapping):
            raise WorkloadError(
                f"autotune.adapters.huggingface: dataset[0] is a {type(sample).__name__}; the "
                "default collate_fn batches dict samples (the model's keyword arguments): "
                "return dicts, or pass collate_fn="
            )
        stack_dicts([dataset[i] for i in range(min(2, len(dataset)))])  # fails here, in one line, if they do not stack
    return Workload(
        model=lambda: fresh_copy(model),
        dataset=dataset,
        loss=loss or model_loss,
        batch_size=batch_size,
        optimizer=optimizer or default_optimizer,
        collate_fn=collate_fn or stack_dicts,
        count_samples=count_samples,
    )


def stack_dicts(samples: list) -> dict:
    """transformers' default_data_collator, with a one-line error when samples do not stack."""
    from transformers import default_data_collator

    try:
        return default_data_collator(samples)
    except (RuntimeError, ValueError, TypeError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WorkloadError(
            f"autotune.adapters.huggingface: the samples do not stack into a batch ({why}); pad "
            "them to one length, or pass collate_fn= (e.g. transformers.DataCollatorWithPadding"
            "(tokenizer))"
        ) from e


def model_loss(model, batch):
    """The model's own loss: `model(**batch).loss`."""
    if not isinstance(batch, Mapping):
        raise WorkloadError(
            f"autotune.adapters.huggingface: a batch is a {type(batch).__name__}; the model's own "
            "loss needs dict batches (model(**batch)): make collate_fn return a dict, or pass loss="
        )
    out = model(**batch)
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    if loss is None:
        raise WorkloadError(
            f"autotune.adapters.huggingface: {type(getattr(model, '_orig_mod', model)).__name__} "
            f"returned no loss for a batch with keys {sorted(batch)} (a model computes its loss when "
            "the batch has `labels`); add labels, or pass loss=lambda model, batch: ..."
        )
    return loss


def default_optimizer(params):
    import torch

    return torch.optim.AdamW(params, lr=5e-5)


def _from_trainer(trainer, count_samples) -> Workload:
    """The Trainer's own pieces, as its training loop uses them (see the module doc)."""
    import math

    import torch

    args = trainer.args
    if trainer.train_dataset is None:
        raise WorkloadError(
            "autotune.adapters.huggingface: the Trainer has no train_dataset; pass Trainer(train_dataset=...)"
        )
    if trainer.optimizer is not None or trainer.lr_scheduler is not None:
        raise WorkloadError(
            "autotune.adapters.huggingface: the Trainer was given its optimizer or scheduler "
            "(Trainer(optimizers=...)), built over its own model; autotune builds them for every "
            "trial's copy: pass optimizer_cls_and_kwargs=, or set them through TrainingArguments"
        )
    check_map_style(trainer.train_dataset, "huggingface", "the Trainer's train_dataset")
    size = check_batch_size(args.per_device_train_batch_size, "huggingface", "per_device_train_batch_size")
    steps = (
        args.max_steps
        if args.max_steps > 0
        else math.ceil(len(trainer.train_dataset) / size / args.gradient_accumulation_steps)
        * math.ceil(args.num_train_epochs)
    )
    copies = Copies(trainer.model, "huggingface")

    def optimizer(params):
        """The Trainer's create_optimizer over the copy that owns `params`, unfused
        (a fused `optim` is the baseline's `fused_optimizer: true`)."""
        built = trainer.create_optimizer(copies.owner(params))
        trainer.optimizer = None  # create_optimizer builds only where none is set: the user's Trainer as it was
        return unfused(built)

    def scheduler(opt):
        built = trainer.create_scheduler(steps, optimizer=opt)
        trainer.lr_scheduler = None
        return built

    def clip(model, opt, precision):
        trainer._clip_grad_norm(model)  # the Trainer's own clipping: accelerate's clip_grad_norm_

    def loss(model, batch):
        return trainer.compute_loss(model, batch)

    built = trainer.create_optimizer(copies.new())
    trainer.optimizer = None
    baseline = {
        "num_workers": args.dataloader_num_workers,
        "pin_memory": bool(args.dataloader_pin_memory and torch.cuda.is_available()),  # pins only for CUDA
        "precision": "bf16-mixed" if args.bf16 else "16-mixed" if args.fp16 else "tf32" if args.tf32 else "32-true",
        "compile": (args.torch_compile_mode or "default") if args.torch_compile else "none",
        "fused_optimizer": all(g.get("fused") for g in built.param_groups),
    }
    if args.dataloader_num_workers:
        baseline.update(
            persistent_workers=args.dataloader_persistent_workers, prefetch_factor=args.dataloader_prefetch_factor
        )
    return Workload(
        model=copies.new,
        dataset=trainer.train_dataset,
        loss=loss,
        batch_size=size,
        optimizer=optimizer,
        collate_fn=trainer.data_collator,
        count_samples=count_samples,
        clip=clip if args.max_grad_norm and args.max_grad_norm > 0 else None,
        scheduler=scheduler,
        baseline=baseline,
    )


def unfused(optimizer):
    """`optimizer` (fresh, no state) rebuilt with torch's default implementation;
    every group carries all its hyper-parameters."""
    if not any(g.get("fused") for g in optimizer.param_groups):
        return optimizer
    return type(optimizer)([{**g, "fused": None, "foreach": None} for g in optimizer.param_groups])
