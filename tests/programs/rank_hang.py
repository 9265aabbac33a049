"""A data-parallel training loop for torchrun in which rank 1 stops stepping after 20 steps: it waits for a
checkpoint's go-ahead that never comes, while rank 0 waits for it in the next step's all-reduce. Written as its
author would, with no line for autotune (gloo: it runs on CPUs).

    torchrun --nproc-per-node 2 rank_hang.py --steps 300 --batch_size 32
"""

import argparse
import threading

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CHECKPOINT_AT = 20  # rank 1's steps before it waits


def wait_for_checkpoint(go: threading.Event) -> None:
    go.wait()  # nothing ever sets it


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch_size", type=int, default=32)
    args = p.parse_args()
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from torchrun
    torch.manual_seed(0)
    data = TensorDataset(
        torch.randn(args.batch_size * args.steps, 32), torch.randint(0, 4, (args.batch_size * args.steps,))
    )
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data, drop_last=True))
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step, (x, y) in enumerate(loader):
        if step == CHECKPOINT_AT and dist.get_rank() == 1:
            wait_for_checkpoint(threading.Event())
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
