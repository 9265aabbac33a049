"""What the API and cache tests share: a cheap spec and the pieces of a tiny CNN
workload (factories themselves are defined where a test needs them: inside the
test, or by reference here)."""

import torch
from torch import nn
from torch.utils.data import TensorDataset

from autotune import Workload

TRIAL = {
    "warmup_steps": 2,
    "measure_steps": 5,
    "min_window_s": 0.2,
    "max_window_s": 1.0,
    "profile_steps": 0,
    "diagnose": False,
    "timeout_s": 120,
    "prune_margin": 0,
}


def spec(output_dir, n_trials: int = 2, confirm_rounds: int = 0, **overrides) -> dict:
    """A search of 2 cheap trials on the CPU (the baseline and one more), not re-measured."""
    return {
        "search_space": {"preset": None, "knobs": {"batch_size": [16, 64]}},
        "trial": TRIAL,
        "search": {"n_trials": n_trials, "seed": 1, "confirm_rounds": confirm_rounds},
        "safety": {"level": "dynamics"},
        "resources": {"device": "cpu"},
        "output_dir": str(output_dir),
        **overrides,
    }


def cnn(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 4)
    )


def images(n: int = 512) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g))


def classify(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def make_cnn(width: int = 8, batch_size: int = 16) -> Workload:
    """A factory by reference (`tests.api_workloads:make_cnn`)."""
    return Workload(model=lambda: cnn(width), dataset=images(), loss=classify, batch_size=batch_size)
