"""The smallest program a search can run (tests of bad programs): a linear
model on random data, `cfg.step` at each step. `--mode`: `ok`; `exit_early` (returns before its first step);
`fail_with_workers` (raises on its third step when the config sets loader
workers: one failing candidate); `oom` (its third step asks the allocator for a
petabyte, as a batch too large for the host would: the allocator refuses it)."""

import argparse
import sys

import torch

import autotune

p = argparse.ArgumentParser()
p.add_argument("--mode", default="ok")
p.add_argument("--steps", type=int, default=100000)
args = p.parse_args()
cfg = autotune.config()
if args.mode == "exit_early":
    sys.exit(0)
kwargs = cfg.dataloader_kwargs(batch_size=8)
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(args.steps):
    with cfg.data():
        x = torch.randn(kwargs["batch_size"], 16)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if args.mode == "fail_with_workers" and step == 2 and kwargs.get("num_workers"):
        raise RuntimeError("this program breaks with loader workers")
    if args.mode == "oom" and step == 2:
        torch.empty(2**50, dtype=torch.uint8)
    cfg.step(samples=len(x), loss=loss)
