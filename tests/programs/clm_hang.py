"""A causal language model trained by transformers' Trainer, its flags read by HfArgumentParser, whose Dataset is
not safe in a loader worker: it tokenizes its texts a chunk at a time on a thread pool made in `__init__` (as a
tokenizer client does). In the process that made it, a chunk comes back; in a loader worker forked from it the
pool's thread is not there, and the first chunk never comes (`--dataloader_num_workers 1`: it hangs at its first
batch, its progress bar at 0%). Nothing in it knows of autotune.

    python clm_hang.py --output_dir out --max_steps 100000 --per_device_train_batch_size 4 --report_to none
"""

from concurrent.futures import ThreadPoolExecutor

import torch
from torch.utils.data import Dataset
from transformers import HfArgumentParser, Trainer, TrainingArguments

from tests.workloads import LLAMA, pad_texts, tiny_llama

CHUNK = 1024  # texts tokenized at a time


def tokenize(start: int) -> list[list[int]]:
    """Texts `start` .. `start + CHUNK` as token ids: 4 to 24 ids each (1..vocab-1; 0 pads), seeded by index."""
    out = []
    for i in range(start, start + CHUNK):
        g = torch.Generator().manual_seed(i)
        n = int(torch.randint(4, 25, (1,), generator=g))
        out.append(torch.randint(1, LLAMA["vocab_size"], (n,), generator=g).tolist())
    return out


class Corpus(Dataset):
    def __init__(self, texts: int = 10_240):
        self.texts = texts
        self.pool = ThreadPoolExecutor(max_workers=1)  # the tokenizer's thread
        self.chunks = {0: self.pool.submit(tokenize, 0).result()}  # the first chunk at once (the thread starts)

    def __len__(self):
        return self.texts

    def __getitem__(self, i):
        start = i // CHUNK * CHUNK
        if start not in self.chunks:  # in a forked worker: the pool has no thread, and the chunk never comes
            self.chunks[start] = self.pool.submit(tokenize, start).result()
        return {"input_ids": self.chunks[start][i - start]}


(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
trainer = Trainer(model=tiny_llama(), args=args, train_dataset=Corpus(), data_collator=pad_texts)
trainer.train()
