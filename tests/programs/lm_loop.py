"""A language model's own training loop, as nanoGPT's train.py writes one: the tiny random-init Llama of
tests/workloads.py on texts of 4 to 24 tokens, padded per batch (the attention mask marks the padding). Two ways to
report a step, `--mode`:
- `steps`: `for batch in cfg.steps(loader)`: its tokens counted from each batch's attention mask;
- `step`: batches drawn by `get_batch` inside `cfg.data()`, each step reported with `cfg.step(samples=...,
  tokens=..., loss=...)`, the tokens the mask's sum (on the device: no host sync).

    python lm_loop.py --mode step --batch_size 4
"""

import argparse

import torch
from torch.utils.data import DataLoader

import autotune
from tests.workloads import Texts, pad_texts, tiny_llama

p = argparse.ArgumentParser()
p.add_argument("--mode", default="steps", choices=["steps", "step"])
p.add_argument("--batch_size", type=int, default=4)
p.add_argument("--max_iters", type=int, default=100000)
args = p.parse_args()
cfg = autotune.config()
model, optimizer = cfg.prepare(tiny_llama(), None)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = Texts()


def train_step(batch):
    with cfg.autocast():
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


if args.mode == "steps":
    loader = DataLoader(data, **cfg.dataloader_kwargs(batch_size=args.batch_size, shuffle=True, collate_fn=pad_texts))
    for it, batch in zip(range(args.max_iters), cfg.steps(loader)):
        train_step(batch)
else:
    g = torch.Generator().manual_seed(0)
    for it in range(args.max_iters):
        with cfg.data():
            ix = torch.randint(len(data), (args.batch_size,), generator=g)
            batch = pad_texts([data[int(i)] for i in ix])
        loss = train_step(batch)
        cfg.step(samples=args.batch_size, tokens=batch["attention_mask"].sum(), loss=loss)
