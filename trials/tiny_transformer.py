"""A small transformer on dict batches: a 2-layer pre-norm encoder classifying
random token sequences, trained with AdamW. Tiny enough for the CPU; the built-in
with dict batches ({"input_ids", "labels"}) and an Adam-style optimizer state."""

import torch
from torch import nn
from torch.utils.data import Dataset

from autotune.workload import Workload


class RandomTokens(Dataset):
    """`length` samples drawn from a fixed pool of random token sequences."""

    def __init__(
        self, length: int, seq_len: int = 32, vocab: int = 128, classes: int = 8, pool: int = 512, seed: int = 0
    ):
        g = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, vocab, (pool, seq_len), generator=g)
        self.labels = torch.randint(0, classes, (pool,), generator=g)
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        j = i % len(self.tokens)
        return {"input_ids": self.tokens[j], "labels": self.labels[j]}


class TinyTransformer(nn.Module):
    def __init__(
        self,
        vocab: int = 128,
        seq_len: int = 32,
        dim: int = 64,
        heads: int = 4,
        layers: int = 2,
        classes: int = 8,
        dropout: float = 0.0,
    ):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq_len, dim) * 0.02)
        # dropout 0 by default (as before); with dropout, compile's parity runs on eager randomness
        # (autotune.stepping.take_step)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=dropout, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, input_ids):
        x = self.embed(input_ids) + self.pos[: input_ids.shape[1]]
        return self.head(self.norm(self.encoder(x)).mean(1))


def loss(model, batch):
    return nn.functional.cross_entropy(model(batch["input_ids"]), batch["labels"])


def make_workload(
    batch_size: int = 16,
    seq_len: int = 32,
    dim: int = 64,
    layers: int = 2,
    lr: float = 1e-3,
    length: int = 1_000_000,
    dropout: float = 0.0,
) -> Workload:
    return Workload(
        model=lambda: TinyTransformer(seq_len=seq_len, dim=dim, layers=layers, dropout=dropout),
        dataset=RandomTokens(length, seq_len),
        loss=loss,
        batch_size=batch_size,
        optimizer=lambda params: torch.optim.AdamW(params, lr=lr),
    )
