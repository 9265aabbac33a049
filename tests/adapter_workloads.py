"""Workload factories through autotune.adapters, for tests: a LightningModule CNN
with a LightningDataModule, and a tiny BertForSequenceClassification, both built
here on generated data (nothing downloaded). Each records what its forward saw
(`SEEN`, and with `record=PATH` one JSON line per new state, for trials run in
another process)."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers loads: never the hub

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from autotune import adapters  # noqa: E402

SEEN: list[dict] = []


def note(x: torch.Tensor, record: str | None, **extra) -> None:
    """What a forward saw: compiled or eager, memory format, autocast."""
    _keep(
        {
            "compiling": torch.compiler.is_compiling(),
            "channels_last": x.dim() == 4
            and x.is_contiguous(memory_format=torch.channels_last)
            and not x.is_contiguous(),
            "autocast": str(torch.get_autocast_dtype(x.device.type))
            if torch.is_autocast_enabled(x.device.type)
            else None,
            **extra,
        },
        record,
    )


@torch.compiler.disable  # runs eagerly, with what the traced forward saw (no guard on SEEN, no recompiles)
def _keep(seen: dict, record: str | None) -> None:
    SEEN.append(seen)
    if record and seen not in SEEN[:-1]:
        with open(record, "a") as f:
            f.write(json.dumps(seen) + "\n")


class Images(Dataset):
    """Generated images, labelled by their mean brightness (learnable)."""

    def __init__(self, samples: int):
        self.samples = samples

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        image = torch.randn(3, 16, 16, generator=torch.Generator().manual_seed(i))
        return image, int(image.mean() > 0)


class ImageData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 16, samples: int = 512):
        super().__init__()
        self.batch_size, self.samples, self.train = batch_size, samples, None

    def setup(self, stage: str):
        self.train = Images(self.samples)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True)


class LitCNN(pl.LightningModule):
    """A small CNN whose training_step calls a submodule directly and logs."""

    def __init__(self, lr: float = 1e-2, optimizers: str = "dict", record: str | None = None):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        self.head = nn.Linear(8, 2)
        self.lr, self.optimizers_form, self.record = lr, optimizers, record

    def forward(self, x):
        note(x, self.record, weights_channels_last=self.net[0].weight.is_contiguous(memory_format=torch.channels_last))
        return self.head(self.net(x))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = nn.functional.cross_entropy(self(images), labels)
        self.log("train_loss", loss)  # no Trainer: must not break
        return {"loss": loss, "batch_idx": batch_idx}

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
        return {
            "optimizer": opt,
            "single": opt,
            "list": [opt],
            "pair": ([opt], [sched]),
            "dict": {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}},
            "list_of_dicts": [{"optimizer": opt, "lr_scheduler": sched}],
            "two": [opt, torch.optim.SGD(self.head.parameters(), lr=0.1)],
            "none": None,
        }[self.optimizers_form]


def make_lightning_cnn(batch_size: int = 16, record: str | None = None, optimizers: str = "dict"):
    return adapters.lightning(LitCNN(optimizers=optimizers, record=record), ImageData(batch_size=batch_size))


def tiny_bert(record: str | None = None, num_labels: int = 2):
    """A 2-layer BERT with a 64-token vocabulary, built from a config (no weights downloaded)."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=num_labels,
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    model.bert.embeddings.register_forward_hook(lambda module, args, out: note(out, record))
    return model


def token_samples(samples: int = 256, seq_len: int = 16, labels: bool = True) -> list[dict]:
    """Generated token ids; the label says whether token 1 is in the first half of the vocabulary."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 64, (samples, seq_len), generator=g)
    return [
        {
            "input_ids": row,
            "attention_mask": torch.ones(seq_len, dtype=torch.long),
            **({"label": int(row[1] < 32)} if labels else {}),
        }
        for row in ids
    ]


def make_bert(batch_size: int = 8, record: str | None = None, labels: bool = True):
    return adapters.huggingface(tiny_bert(record), token_samples(labels=labels), batch_size=batch_size)


def make_lightning_clipped(batch_size: int = 16, record: str | None = None, precision: str = "32-true"):
    """The CNN as a Trainer with gradient clipping trains it (the Trainer given as its arguments)."""
    return adapters.lightning(
        LitCNN(record=record),
        ImageData(batch_size=batch_size),
        trainer={"precision": precision, "gradient_clip_val": 1.0, "accelerator": "cpu"},
    )


def bert_trainer(batch_size: int = 8, record: str | None = None, **args):
    """A transformers.Trainer on the tiny BERT with transformers' default optim (adamw_torch_fused)."""
    import tempfile

    from transformers import Trainer, TrainingArguments

    out = tempfile.mkdtemp(prefix="hf-trainer-")
    targs = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=batch_size,
        use_cpu=True,
        report_to=[],
        max_grad_norm=1.0,
        learning_rate=1e-3,
        warmup_steps=2,
        max_steps=50,
        **args,
    )
    return Trainer(model=tiny_bert(record), args=targs, train_dataset=token_samples())


def make_bert_trainer(batch_size: int = 8, record: str | None = None):
    return adapters.huggingface(bert_trainer(batch_size, record))
