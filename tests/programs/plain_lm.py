"""A language model's plain training loop, as its author writes one: a DataLoader over token windows, a small
causal transformer, AdamW with weight decay, a cosine learning-rate schedule with warm-up, gradient clipping,
a log line every 100 steps and a checkpoint at the end. Nothing in it knows of autotune.

    python plain_lm.py --steps 2000 --batch_size 16
"""

import argparse
import math

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Windows(Dataset):
    """Windows of `block + 1` tokens from a generated corpus (ids 0..vocab-1), each a sample of (input, target)."""

    def __init__(self, tokens: int, block: int, vocab: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (tokens,), generator=g)
        self.block = block

    def __len__(self):
        return len(self.data) - self.block - 1

    def __getitem__(self, i):
        chunk = self.data[i : i + self.block + 1]
        return chunk[:-1], chunk[1:]


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block: int, d: int = 64, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        return self.head(self.norm(self.blocks(h, mask=mask, is_causal=True)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--block_size", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--num_workers", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=50)
    args = p.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = Windows(200_000, args.block_size, args.vocab)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers, drop_last=True)
    model = TinyGPT(args.vocab, args.block_size).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=args.lr
    )

    def lr_at(step):
        if step < args.warmup:
            return (step + 1) / args.warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    step = 0
    while step < args.steps:
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            if step % 100 == 0:
                print(f"step {step} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}")
            step += 1
            if step >= args.steps:
                break
    torch.save(model.state_dict(), "plain_lm.pt")


if __name__ == "__main__":
    main()
