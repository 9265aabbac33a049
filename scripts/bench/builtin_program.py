"""A built-in workload written as a user's program (`bench_overhead.py --program`): the same model, data,
loss and optimizer as the built-in trial, in the program's own DataLoader loop through `autotune.config()`,
so a program trial and a built-in trial of the same size can be compared. Under torchrun's environment (several
ranks: `bench_overhead.py --ranks 2`), data-parallel as the built-in trial is: a process group, a sampler per rank,
the model wrapped by `cfg.wrap` (DDP).

    python scripts/bench/builtin_program.py --workload tiny_cnn
    torchrun --nproc-per-node 2 scripts/bench/builtin_program.py --workload tiny_cnn
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

import autotune
from autotune.workload import load

p = argparse.ArgumentParser()
p.add_argument("--workload", default="tiny_cnn")
args = p.parse_args()
workload = load(args.workload)
ranks = int(os.environ.get("WORLD_SIZE", "1"))
if ranks > 1:
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
cfg = autotune.config()
sampler = DistributedSampler(workload.dataset, shuffle=True, drop_last=True) if ranks > 1 else None
loader = DataLoader(
    workload.dataset,
    **cfg.dataloader_kwargs(batch_size=workload.batch_size, shuffle=sampler is None, sampler=sampler, drop_last=True),
)
model = cfg.wrap(workload.model()) if ranks > 1 else workload.model()
params = model.parameters()
opt = workload.optimizer(params) if workload.optimizer else torch.optim.SGD(params, lr=0.01, momentum=0.9)
while True:  # epochs until the trial's window ends it
    for batch in cfg.steps(loader):
        loss = workload.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
