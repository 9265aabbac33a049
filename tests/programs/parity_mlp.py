"""A small regression program for loss parity (tests/test_program_parity.py), written as its author would:
seeded, an MLP on its own synthetic data, `cfg.prepare` and `cfg.autocast` around its model. `--cancel`: its
loss is computed as (y_hat + 1e4) - 1e4, a cancellation that bf16 rounds away (a planted numerics fault: it
trains in fp32 and not in bf16). `--lr`: a large one makes training chaotic. `--fp32_ms`: each step sleeps
this long unless bf16 is set, a stand-in for a GPU's bf16 speedup, so that a search on this CPU picks bf16."""

import argparse
import time

import torch

import autotune

p = argparse.ArgumentParser()
p.add_argument("--cancel", action="store_true")
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--fp32_ms", type=float, default=0.0)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)  # a tiny model: a second thread only waits (on a loaded host, ~20 ms a step)
cfg = autotune.config()
w_true = torch.randn(32, 1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=args.lr)
model, fused = cfg.prepare(model, opt)
opt = fused or opt
for step in range(args.steps):
    with cfg.data():
        x = torch.randn(64, 32)
        y = x @ w_true
    with cfg.autocast():
        out = model(x)
        if args.cancel:
            out = (out + 1e4) - 1e4
        loss = (out.float() - y).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if cfg.knobs.get("precision") != "bf16-mixed":
        time.sleep(args.fp32_ms / 1e3)
    cfg.step(samples=len(x), loss=loss)
