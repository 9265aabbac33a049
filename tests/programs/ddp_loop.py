"""A data-parallel training loop for torchrun, written as its author would, with no
line for autotune (gloo: it runs on CPUs).

    torchrun --nproc-per-node 2 ddp_loop.py --steps 300 --batch_size 32
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--num_workers", type=int, default=0)
    args = p.parse_args()
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from torchrun
    torch.manual_seed(0)
    data = TensorDataset(
        torch.randn(args.batch_size * args.steps, 32), torch.randint(0, 4, (args.batch_size * args.steps,))
    )
    sampler = DistributedSampler(data, shuffle=True, drop_last=True)
    loader = DataLoader(
        data,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.num_workers,
    )
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 and dist.get_rank() == 0:
            print(f"step {step} loss {loss.item():.3f}")
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), "model.pt")
    dist.barrier()  # no rank leaves the group while another still uses it (gloo aborts on a closed peer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
