"""A character-level transformer trained with its own loop, as nanoGPT's
train.py does: batches sampled by `get_batch` from a uint16 memmap (no
DataLoader), gradient accumulation, gradient clipping, a cosine learning-rate
schedule with warm-up and a GradScaler. autotune's instrumentation measures its
steps, tokens and loss with no line changed; the three lines marked `# autotune`
say one thing more, the time `get_batch` takes (its data wait: with no DataLoader
it is otherwise "unknown"). Its throughput is tokens/s (its inputs are token ids).

    python memmap_loop.py --data data.bin --batch_size 8 --max_iters 500
"""

import argparse
import math

import numpy as np
import torch
from torch import nn

import autotune  # autotune

p = argparse.ArgumentParser()
p.add_argument("--data", default="data.bin")
p.add_argument("--batch_size", type=int, default=4)
p.add_argument("--block_size", type=int, default=16)
p.add_argument("--grad_accum", type=int, default=2)
p.add_argument("--max_iters", type=int, default=500)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--warmup_iters", type=int, default=20)
p.add_argument("--grad_clip", type=float, default=1.0)
p.add_argument("--dtype", default="float32")
args = p.parse_args()
torch.manual_seed(1337)
cfg = autotune.config()  # autotune
data = np.memmap(args.data, dtype=np.uint16, mode="r")
vocab = int(data.max()) + 1


def get_batch():
    ix = torch.randint(len(data) - args.block_size - 1, (args.batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + args.block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + args.block_size].astype(np.int64)) for i in ix])
    return x, y


class CharModel(nn.Module):
    def __init__(self, vocab, d=32, layers=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(args.block_size, d)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        t = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t)
        h = self.tok(x) + self.pos(torch.arange(t))
        return self.head(self.blocks(h, mask=mask, is_causal=True))


def get_lr(it):
    if it < args.warmup_iters:
        return args.lr * (it + 1) / args.warmup_iters
    progress = (it - args.warmup_iters) / max(1, args.max_iters - args.warmup_iters)
    return 0.1 * args.lr + 0.45 * args.lr * (1 + math.cos(math.pi * min(progress, 1.0)))


model = CharModel(vocab)
decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
optimizer = torch.optim.AdamW(
    [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95)
)
scaler = torch.amp.GradScaler("cpu", enabled=args.dtype == "float16")
for it in range(args.max_iters):
    for group in optimizer.param_groups:
        group["lr"] = get_lr(it)
    for micro in range(args.grad_accum):
        with cfg.data():  # autotune: the time inside is data wait
            X, Y = get_batch()
        logits = model(X)
        loss = nn.functional.cross_entropy(logits.view(-1, vocab), Y.view(-1)) / args.grad_accum
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if it % 100 == 0:
        print(f"iter {it}: loss {loss.item() * args.grad_accum:.4f}")
torch.save(model.state_dict(), "ckpt.pt")
