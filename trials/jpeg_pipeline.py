"""A data-pipeline-heavy workload (PLAYBOOK.md's input-pipeline case): per sample,
JPEG decode of a generated image -> random crop -> random mask with 4-neighbour
dilation -> RGB to YUV (3x3 matmul) -> scale to [0, 1], feeding a toy CNN. The CPU
transforms, not the model, bound the step: the case where loader workers matter.
"""

import io

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

from autotune.workload import Workload

RGB_TO_YUV = torch.tensor([[0.299, 0.587, 0.114], [-0.14713, -0.28886, 0.436], [0.615, -0.51499, -0.10001]])


def generated_jpeg(size: int, seed: int) -> bytes:
    g = torch.Generator().manual_seed(seed)
    # smooth gradients plus noise compress like a photo, not like white noise
    ramp = torch.linspace(0, 255, size)
    rgb = torch.stack(
        [
            ramp.view(1, -1).expand(size, size),
            ramp.view(-1, 1).expand(size, size),
            ramp.flip(0).view(1, -1).expand(size, size),
        ]
    )
    rgb = (rgb + 40 * torch.randn(3, size, size, generator=g)).clamp(0, 255).to(torch.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb.permute(1, 2, 0).numpy()).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def dilate4(mask: torch.Tensor) -> torch.Tensor:
    """4-neighbour dilation of a bool mask (a 3x3 cross convolution)."""
    kernel = torch.tensor([[0.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 0.0]]).view(1, 1, 3, 3)
    return nn.functional.conv2d(mask.float()[None, None], kernel, padding=1)[0, 0] > 0


class JpegCrops(Dataset):
    def __init__(self, length: int, image_size: int = 512, crop: int = 256, mask_p: float = 0.05, seed: int = 0):
        self.jpeg = generated_jpeg(image_size, seed)
        self.length, self.crop, self.mask_p, self.seed = length, crop, mask_p, seed

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        image = torch.from_numpy(np.array(Image.open(io.BytesIO(self.jpeg)).convert("RGB"))).permute(2, 0, 1)
        _, h, w = image.shape
        top = int(torch.randint(0, h - self.crop + 1, (1,), generator=g))
        left = int(torch.randint(0, w - self.crop + 1, (1,), generator=g))
        image = image[:, top : top + self.crop, left : left + self.crop].float()
        mask = dilate4(torch.rand(self.crop, self.crop, generator=g) < self.mask_p)
        image = image.masked_fill(mask, 0)
        yuv = torch.einsum("ij,jhw->ihw", RGB_TO_YUV, image)
        return yuv / 255.0, int(torch.randint(0, 10, (1,), generator=g))


def toy_cnn(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=2, padding=2),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )


def loss(model, batch):
    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)


def make_workload(batch_size: int = 64, crop: int = 256, length: int = 1_000_000) -> Workload:
    return Workload(model=toy_cnn, dataset=JpegCrops(length, crop=crop), loss=loss, batch_size=batch_size)
