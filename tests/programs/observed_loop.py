"""A plain training loop with no autotune line that writes down, at each step, what it ran with: its loader's
workers, batch and pinning, its optimizer's fused flag, whether its model's forward ran under autocast and on
channels_last inputs, the dtype its loss saw, whether zero_grad left the gradients None, and whether the model is
compiled. A trial's instrumentation (autotune.instrument._torch) applies the knobs; this shows each one arrived.
One JSON line a step to `observed.jsonl` (in its working directory).

- `--scaler`: a GradScaler enabled around the step; with `--inf_every N` every N-th step's gradients hold an
  inf, so the scaler skips that optimizer step (a step all the same);
- `--critic`: a second, smaller model and optimizer stepped each iteration too (a GAN's): its steps are not the
  program's;
- `--accumulate K`: K micro-batches a step.

    python observed_loop.py --steps 50 --batch_size 8
"""

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--batch_size", type=int, default=8)
p.add_argument("--scaler", action="store_true")
p.add_argument("--inf_every", type=int, default=0)
p.add_argument("--critic", action="store_true")
p.add_argument("--accumulate", type=int, default=1)
args = p.parse_args()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)
        self.seen = {}

    def forward(self, x):
        if not torch.compiler.is_compiling():
            self.seen = {
                "autocast": torch.is_autocast_enabled("cpu"),
                "channels_last_input": x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous(),
            }
        return self.head(self.conv(x).mean((2, 3)))


torch.manual_seed(0)
data = TensorDataset(torch.randn(4096, 3, 8, 8), torch.randint(0, 4, (4096,)))
loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
critic = nn.Linear(4, 1) if args.critic else None
critic_opt = torch.optim.SGD(critic.parameters(), lr=1e-3) if critic else None
# a skip halves the scale, two steps in a row double it: with an inf every 3rd step it stays where it is
scaler = torch.amp.GradScaler("cpu", enabled=args.scaler, growth_interval=2)
step = 0
with open("observed.jsonl", "w") as log:
    while step < args.steps:
        for micro, (x, y) in enumerate(loader):
            out = model(x)
            loss = nn.functional.cross_entropy(out, y) / args.accumulate
            scaler.scale(loss).backward()
            if (micro + 1) % args.accumulate:
                continue
            if args.inf_every and step % args.inf_every == args.inf_every - 1:
                model.head.bias.grad.fill_(float("inf"))
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            if critic is not None:
                critic_loss = critic(out.detach()).pow(2).mean()
                critic_loss.backward()
                critic_opt.step()
                critic_opt.zero_grad()
            seen = {
                "step": step,
                "workers": loader.num_workers,
                "batch": loader.batch_size,
                "pin": loader.pin_memory,
                "fused": optimizer.param_groups[0].get("fused"),
                "loss_dtype": str(out.dtype),
                "grads_none": all(p.grad is None for p in model.parameters()),
                "weights_channels_last": model.conv.weight.is_contiguous(memory_format=torch.channels_last),
                "compiled": getattr(model, "_compiled_call_impl", None) is not None,
                **model.seen,
            }
            log.write(json.dumps(seen) + "\n")
            log.flush()
            step += 1
            if step >= args.steps:
                break
