"""A DataLoader training loop, written as its author would, with no line for autotune. Its dataset does real work
per sample (a random crop and a spectral blur of each image, in numpy), after
waiting `--read_ms` on storage (a network file system), so loader workers have
something to take off the training process: on 2 cores the CPU work alone
leaves them ~1.2x, the wait on storage more.

    python loader_loop.py --steps 200 --batch_size 32 --read_ms 3
"""

import argparse
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Blurred(Dataset):
    """Generated 32x32 crops of 40x40 images, each read from storage (`read_ms`: a network file system's
    latency), cropped and low-pass filtered."""

    def __init__(self, n: int, seed: int = 0, read_ms: float = 0.0):
        self.read_s = read_ms / 1000
        rng = np.random.default_rng(seed)
        self.images = rng.standard_normal((n, 3, 40, 40), dtype=np.float32)
        self.labels = rng.integers(0, 10, n)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        time.sleep(self.read_s)
        rng = np.random.default_rng(i)
        y, x = rng.integers(0, 8, 2)
        img = self.images[i, :, y : y + 32, x : x + 32]
        for _ in range(16):  # the expensive part: a blur in the frequency domain
            f = np.fft.rfft2(img)
            f[:, 8:-8, :] = 0
            img = np.fft.irfft2(f, s=img.shape[1:]).astype(np.float32)
        return torch.from_numpy(img), int(self.labels[i])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument("--read_ms", type=float, default=0.0, help="storage latency of each sample, ms")
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    torch.manual_seed(0)
    data = Blurred(args.batch_size * args.steps, read_ms=args.read_ms)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers, drop_last=True)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(1024, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3f}")
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
