"""A GPT trained the way nanoGPT's train.py trains one, with no autotune line: settings as module globals that
`--key=value` arguments override (its configurator), batches drawn by `get_batch` from a uint16 memmap opened
anew each time (no DataLoader), a model whose forward takes (idx, targets) and returns (logits, loss), gradient
accumulation, a GradScaler (enabled for float16), gradient clipping, a cosine learning rate with warm-up, and an
optional `torch.compile`.

    python -c "import numpy as np; np.random.default_rng(0).integers(0, 65, 200000, dtype=np.uint16).tofile('train.bin')"
    python nanogpt_loop.py --batch_size=8 --max_iters=2000
"""

import math
import sys
from contextlib import nullcontext

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

# -- settings (nanoGPT's: globals, overridden by --key=value) --
data_path = "train.bin"
batch_size = 8
block_size = 32
gradient_accumulation_steps = 2
n_layer, n_head, n_embd = 2, 4, 64
learning_rate = 1e-3
max_iters = 2000
warmup_iters = 20
min_lr = 1e-4
grad_clip = 1.0
dtype = "float32"
compile = False
log_interval = 100
for arg in sys.argv[1:]:
    key, _, value = arg[2:].partition("=")
    if key not in globals():
        raise ValueError(f"unknown config key: {key}")
    kind = type(globals()[key])
    globals()[key] = (value == "True") if kind is bool else kind(value)

device = "cuda" if torch.cuda.is_available() else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device == "cpu" else torch.amp.autocast(device_type=device, dtype=ptdtype)
torch.manual_seed(1337)


def get_batch():
    data = np.memmap(data_path, dtype=np.uint16, mode="r")  # anew each batch, as nanoGPT does (no memory leak)
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    return x.to(device), y.to(device)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn(self.ln1(x)).split(n_embd, dim=2)
        q, k, v = (z.view(b, t, n_head, c // n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block() for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = min(1.0, (it - warmup_iters) / max(1, max_iters - warmup_iters))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


vocab = int(np.memmap(data_path, dtype=np.uint16, mode="r").max()) + 1
model = GPT(vocab).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.1, betas=(0.9, 0.95))
scaler = torch.amp.GradScaler(device, enabled=(dtype == "float16"))
if compile:
    model = torch.compile(model)
X, Y = get_batch()
for it in range(max_iters):
    for group in optimizer.param_groups:
        group["lr"] = get_lr(it)
    for micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        X, Y = get_batch()  # the next batch, fetched while the device works on this one
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if it % log_interval == 0:
        print(f"iter {it}: loss {loss.item() * gradient_accumulation_steps:.4f}")
torch.save(model.state_dict(), "ckpt.pt")
