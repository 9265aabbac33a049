"""A Workload from a Hugging Face model and a map-style dataset of dict samples.

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

from autotune.adapters._common import check_batch_size, check_map_style, fresh_copy, require
from autotune.workload import Workload, WorkloadError


def huggingface(model, dataset, collate_fn: Callable | None = None, *, batch_size: int = 8,
                optimizer: Callable[[Any], Any] | None = None, loss: Callable[[Any, Any], Any] | None = None,
                count_samples: Callable[[Any], int] | None = None) -> Workload:
    """A Workload that trains `model` (a transformers model, or any nn.Module
    taking the batch's keys) on `dataset`, `batch_size` samples a batch (default:
    the Trainer's 8)."""
    require("transformers", "hf", "huggingface")
    import torch

    if not isinstance(model, torch.nn.Module):
        raise WorkloadError(f"autotune.adapters.huggingface: `model` must be a torch.nn.Module (a transformers "
                            f"model), got {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise WorkloadError(f"autotune.adapters.huggingface: {type(model).__name__} has no trainable parameters")
    check_map_style(dataset, "huggingface", "`dataset`")
    check_batch_size(batch_size, "huggingface", "batch_size=")
    for name, fn in (("collate_fn", collate_fn), ("optimizer", optimizer), ("loss", loss),
                     ("count_samples", count_samples)):
        if fn is not None and not callable(fn):
            raise WorkloadError(f"autotune.adapters.huggingface: `{name}` must be callable or None, got "
                                f"{type(fn).__name__}")
    if collate_fn is None:
        sample = dataset[0]
        if not isinstance(sample, Mapping):
            raise WorkloadError(f"autotune.adapters.huggingface: dataset[0] is a {type(sample).__name__}; the "
                                "default collate_fn batches dict samples (the model's keyword arguments): "
                                "return dicts, or pass collate_fn=")
        stack_dicts([dataset[i] for i in range(min(2, len(dataset)))])  # fails here, in one line, if they do not stack
    return Workload(model=lambda: fresh_copy(model), dataset=dataset, loss=loss or model_loss, batch_size=batch_size,
                    optimizer=optimizer or default_optimizer, collate_fn=collate_fn or stack_dicts,
                    count_samples=count_samples)


def stack_dicts(samples: list) -> dict:
    """transformers' default_data_collator, with a one-line error when samples do not stack."""
    from transformers import default_data_collator

    try:
        return default_data_collator(samples)
    except (RuntimeError, ValueError, TypeError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise WorkloadError(f"autotune.adapters.huggingface: the samples do not stack into a batch ({why}); pad "
                            "them to one length, or pass collate_fn= (e.g. transformers.DataCollatorWithPadding"
                            "(tokenizer))") from e


def model_loss(model, batch):
    """The model's own loss: `model(**batch).loss`."""
    if not isinstance(batch, Mapping):
        raise WorkloadError(f"autotune.adapters.huggingface: a batch is a {type(batch).__name__}; the model's own "
                            "loss needs dict batches (model(**batch)): make collate_fn return a dict, or pass loss=")
    out = model(**batch)
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    if loss is None:
        raise WorkloadError(f"autotune.adapters.huggingface: {type(getattr(model, '_orig_mod', model)).__name__} "
                            f"returned no loss for a batch with keys {sorted(batch)} (a model computes its loss when "
                            "the batch has `labels`); add labels, or pass loss=lambda model, batch: ...")
    return loss


def default_optimizer(params):
    import torch

    return torch.optim.AdamW(params, lr=5e-5)
