"""A built-in workload written as a user's program (`bench_overhead.py --program`): the same model, data,
loss and optimizer as the built-in trial, in the program's own DataLoader loop through `autotune.config()`,
so a program trial and a built-in trial of the same size can be compared.

    python scripts/bench/builtin_program.py --workload tiny_cnn
"""

import argparse

import torch
from torch.utils.data import DataLoader

import autotune
from autotune.workload import load

p = argparse.ArgumentParser()
p.add_argument("--workload", default="tiny_cnn")
args = p.parse_args()
workload = load(args.workload)
cfg = autotune.config()
loader = DataLoader(
    workload.dataset, **cfg.dataloader_kwargs(batch_size=workload.batch_size, shuffle=True, drop_last=True)
)
model = workload.model()
params = model.parameters()
opt = workload.optimizer(params) if workload.optimizer else torch.optim.SGD(params, lr=0.01, momentum=0.9)
while True:  # epochs until the trial's window ends it
    for batch in cfg.steps(loader):
        loss = workload.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
