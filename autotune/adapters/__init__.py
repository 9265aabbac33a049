"""Workloads from the training code people already have.

    from autotune import adapters

    def make_workload():
        return adapters.lightning(MyModule(), MyDataModule())       # pip install 'autotune[lightning]'

    def make_bert():
        return adapters.huggingface(model, dataset, batch_size=32)  # pip install 'autotune[hf]'

Each returns an `autotune.Workload`; a spec names the factory like any other
(`workload.factory: mypkg.train:make_workload`). Importing this package is cheap:
Lightning and transformers load when an adapter is called.

May import: `autotune.workload`, `autotune.knobs`.
"""

from autotune.adapters._huggingface import huggingface
from autotune.adapters._lightning import lightning

__all__ = ["huggingface", "lightning"]
