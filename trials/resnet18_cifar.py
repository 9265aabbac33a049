"""The classic hand-tuned case (DESIGN.md): ResNet-18 on CIFAR-sized images resized
to 224, batch 32. Images are generated uint8 32x32 (no download), resized and
normalized on the host by the loader, as a default torchvision pipeline does.

`gpu_normalize=True` instead ships uint8 224x224 batches (4x fewer bytes) and
normalizes them on the device, the playbook's step 4.
"""

import torch
import torchvision
from torch import nn
from torch.utils.data import Dataset
from torchvision.transforms.v2 import functional as F

from autotune.workload import Workload

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


class FakeCIFAR(Dataset):
    def __init__(
        self, length: int = 50_000, size: int = 224, gpu_normalize: bool = False, pool: int = 1024, seed: int = 0
    ):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randint(0, 256, (pool, 3, 32, 32), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 10, (pool,), generator=g)
        self.length, self.size, self.gpu_normalize = length, size, gpu_normalize

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        j = i % len(self.images)
        image = F.resize(self.images[j], [self.size, self.size], antialias=True)
        if not self.gpu_normalize:
            image = F.normalize(image.float().div_(255), MEAN, STD)
        return image, self.labels[j]


def normalize_on_device(batch):
    images, labels = batch
    mean = torch.tensor(MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=images.device).view(1, 3, 1, 1)
    return (images.float().div_(255).sub_(mean).div_(std), labels)


def loss(model, batch):
    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)


def make_workload(
    batch_size: int = 32, image_size: int = 224, gpu_normalize: bool = False, length: int = 1_000_000
) -> Workload:
    return Workload(
        model=lambda: torchvision.models.resnet18(weights=None, num_classes=10),
        dataset=FakeCIFAR(length, image_size, gpu_normalize),
        loss=loss,
        batch_size=batch_size,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4),
        preprocess=normalize_on_device if gpu_normalize else None,
    )
