"""What both adapters need: the optional package, fresh copies of a model, the
checks on what the user passed."""

from __future__ import annotations

import copy
import importlib
import weakref
from typing import Any

from autotune.workload import WorkloadError


def require(module: str, extra: str, adapter: str):
    """Import an optional package, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"autotune.adapters.{adapter} needs `{module}`, which is not installed: "
            f"pip install 'autotune[{extra}]' ({e})"
        ) from e


def fresh_copy(template):
    """A copy of the user's module in training mode (as a Trainer puts it): every
    trial and every parity run starts from the same weights."""
    model = copy.deepcopy(template)
    model.train()
    return model


class Copies:
    """The fresh copies of a template module, each found again from its
    parameters (what a workload's optimizer(params) is given)."""

    def __init__(self, template, adapter: str):
        self.template, self.adapter = template, adapter
        self.by_param: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # id(first param) -> copy

    def new(self):
        module = fresh_copy(self.template)
        self.by_param[id(next(module.parameters()))] = module
        return module

    def owner(self, params):
        params = list(params)
        module = self.by_param.get(id(params[0])) if params else None
        if module is None:
            raise WorkloadError(
                f"autotune.adapters.{self.adapter}: the optimizer was asked for parameters of a module "
                "the workload's model() did not build (or one no longer referenced)"
            )
        return module


def check_batch_size(batch_size: Any, adapter: str, where: str) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise WorkloadError(
            f"autotune.adapters.{adapter}: the batch size ({where}) must be a positive int, got {batch_size!r}"
        )
    return batch_size


def check_map_style(dataset: Any, adapter: str, what: str) -> None:
    """A map-style dataset: len() and integer indexing (samples are read in random order)."""
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise WorkloadError(
            f"autotune.adapters.{adapter}: {what} ({type(dataset).__name__}) must be a map-style "
            "dataset (len() and dataset[i]: a torch Dataset, a list, a datasets.Dataset); "
            "an IterableDataset or a generator cannot be sampled in random order"
        )
    if len(dataset) == 0:
        raise WorkloadError(f"autotune.adapters.{adapter}: {what} is empty; nothing to train on")
