"""A tiny CNN on random 32x32 images: fast enough for CPU tests and the quickstart."""

import torch
from torch import nn
from torch.utils.data import Dataset

from autotune.workload import Workload


class RandomImages(Dataset):
    """`length` samples drawn from a fixed pool of random images (cheap to load)."""

    def __init__(self, length: int, pool: int = 256, size: int = 32, classes: int = 10, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(pool, 3, size, size, generator=g)
        self.labels = torch.randint(0, classes, (pool,), generator=g)
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        j = i % len(self.images)
        return self.images[j], self.labels[j]


def tiny_cnn(width: int = 16, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, classes),
    )


def classification_loss(model, batch):
    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)


def make_workload(batch_size: int = 32, width: int = 16, image_size: int = 32, length: int = 1_000_000) -> Workload:
    return Workload(
        model=lambda: tiny_cnn(width),
        dataset=RandomImages(length, size=image_size),
        loss=classification_loss,
        batch_size=batch_size,
    )
