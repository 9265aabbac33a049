"""Workloads from the training code people already have.

    from autotune import adapters

    def make_workload():                                            # pip install 'autotune[lightning]'
        return adapters.lightning(MyModule(), MyDataModule(), trainer={"gradient_clip_val": 1.0})

    def make_bert():                                                # pip install 'autotune[hf]'
        return adapters.huggingface(Trainer(model=model, args=args, train_dataset=dataset))

Each returns an `autotune.Workload`; a spec names the factory like any other
(`workload.factory: mypkg.train:make_workload`). Importing this package is cheap:
Lightning and transformers load when an adapter is called.

May import: `autotune.workload`, `autotune.knobs`.
"""

from autotune.adapters._huggingface import huggingface
from autotune.adapters._lightning import lightning

__all__ = ["huggingface", "lightning"]
