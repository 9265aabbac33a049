"""A language model's plain training loop whose Dataset is not safe in a loader worker: its windows are read
through a cache that a loader thread, started in `__init__`, fills a chunk at a time when a read misses (as a
prefetching client does). In the process that made it a miss waits a moment for the thread; in a loader worker
forked from it the thread is not there, and the first miss waits forever. Nothing in it knows of autotune.

    python hang_loop.py --steps 2000 --batch_size 16 [--num_workers 1]   # with workers: hangs at its first batch
"""

import argparse
import threading

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

CHUNK = 4096  # windows the loader thread reads at a time


class Windows(Dataset):
    """Windows of `block + 1` tokens from a generated corpus, each a sample of (input, target)."""

    def __init__(self, tokens: int, block: int, vocab: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (tokens,), generator=g)
        self.block, self.cache, self.wanted = block, {}, None
        self.filled = threading.Condition()
        threading.Thread(target=self._load, daemon=True).start()

    def _load(self) -> None:
        with self.filled:
            while True:
                self.filled.wait_for(lambda: self.wanted is not None)
                start = self.wanted // CHUNK * CHUNK
                for i in range(start, min(start + CHUNK, len(self))):
                    self.cache[i] = self.data[i : i + self.block + 1]
                self.wanted = None
                self.filled.notify_all()

    def __len__(self):
        return len(self.data) - self.block - 1

    def __getitem__(self, i):
        if i not in self.cache:
            with self.filled:
                self.wanted = i
                self.filled.notify_all()
                self.filled.wait_for(lambda: i in self.cache)  # in a forked worker: no thread fills it
        chunk = self.cache[i]
        return chunk[:-1], chunk[1:]


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block: int, d: int = 64, heads: int = 4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        return self.head(self.blocks(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)), mask=mask))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--block_size", type=int, default=32)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--num_workers", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(0)
    data = Windows(100_000, args.block_size, args.vocab)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers, drop_last=True)
    model = TinyGPT(args.vocab, args.block_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % 100 == 0:
                print(f"step {step} loss {loss.item():.4f}")
            step += 1
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
