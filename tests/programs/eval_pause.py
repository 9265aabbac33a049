"""A training loop whose evaluation between two training steps takes minutes (here it waits `--eval_s`, as a
long validation pass over a large set does), then trains on and ends: a program that is slow, not hung. Nothing
in it knows of autotune.

    python eval_pause.py --steps 10 --eval_every 5 --eval_s 180 --done done.txt
"""

import argparse
import time
from pathlib import Path

import torch
from torch import nn


def evaluate(model: nn.Module, seconds: float) -> float:
    """A validation pass that takes `seconds`: the model's loss on a fixed batch, again and again."""
    x, ended = torch.randn(64, 16), time.monotonic() + seconds
    with torch.no_grad():
        while time.monotonic() < ended:
            loss = model(x).pow(2).mean()
            time.sleep(0.5)
    return float(loss)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--eval_every", type=int, default=5)
    p.add_argument("--eval_s", type=float, default=180.0)
    p.add_argument("--done", default="done.txt")
    args = p.parse_args()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, args.steps + 1):
        loss = model(torch.randn(32, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % args.eval_every == 0 and step < args.steps:
            print(f"step {step}: eval loss {evaluate(model, args.eval_s):.4f}", flush=True)
    Path(args.done).write_text(f"{args.steps} steps\n")


if __name__ == "__main__":
    main()
