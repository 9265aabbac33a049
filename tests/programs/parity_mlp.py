"""A small regression program for loss parity (tests/test_program_parity.py), written as its author would: seeded,
an MLP on its own synthetic data, a plain loop with no autotune line (autotune's instrumentation reads its loss
from `backward()` and finds its model at its first forward). `--cancel`: the model's output passes through
(y_hat + 1e4) - 1e4, a cancellation that bf16 rounds away (a planted numerics fault: it trains in fp32 and not
in bf16). `--lr`: a large one makes training chaotic. `--functional`: the same MLP as bare tensors, no module (no
model for autotune to find). `--no_loss`: backward runs on the per-sample errors (no scalar loss to read).
`--fp32_ms`: each step sleeps this long unless the trial sets bf16 (`autotune.config().knobs`, the one line of
autotune here), a stand-in for a GPU's bf16 speedup, so that a search on this CPU picks bf16."""

import argparse
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--cancel", action="store_true")
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--fp32_ms", type=float, default=0.0)
p.add_argument("--functional", action="store_true")
p.add_argument("--no_loss", action="store_true")
args = p.parse_args()


class Cancel(torch.nn.Module):
    def forward(self, x):
        return (x + 1e4) - 1e4 if args.cancel else x


torch.manual_seed(0)
torch.set_num_threads(1)  # a tiny model: a second thread only waits (on a loaded host, ~20 ms a step)
w_true = torch.randn(32, 1)
if args.functional:
    weights = [torch.randn(32, 64) * 0.2, torch.zeros(64), torch.randn(64, 1) * 0.2, torch.zeros(1)]
    params = [w.requires_grad_() for w in weights]

    def model(x):
        return torch.tanh(x @ params[0] + params[1]) @ params[2] + params[3]

else:
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1), Cancel())
    params = list(model.parameters())
opt = torch.optim.SGD(params, lr=args.lr)
bf16 = False
if args.fp32_ms:
    import autotune

    bf16 = autotune.config().knobs.get("precision") == "bf16-mixed"
for step in range(args.steps):
    x = torch.randn(64, 32)
    y = x @ w_true
    errors = (model(x).float() - y).pow(2)
    opt.zero_grad()
    if args.no_loss:
        errors.backward(torch.full_like(errors, 1 / len(errors)))
    else:
        errors.mean().backward()
    opt.step()
    if not bf16:
        time.sleep(args.fp32_ms / 1e3)
