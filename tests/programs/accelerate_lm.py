"""A causal language model trained with Accelerate, in the shape of transformers' `*_no_trainer.py` examples: a
random-init Llama (no hub here), texts of 4 to 48 tokens padded per batch by a collator (the attention mask marks
the padding, labels -100 there), `accelerator.prepare`, `accelerator.backward`, a linear warm-up and decay, and a
checkpoint at the end. Nothing in it knows of autotune.

    python accelerate_lm.py --max_train_steps 500 --per_device_train_batch_size 8
    accelerate launch --num_processes 2 --cpu accelerate_lm.py ...
"""

import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset
from transformers import LlamaConfig, LlamaForCausalLM


class Texts(Dataset):
    """Token sequences of 4 to 48 ids (1..vocab-1; 0 pads), each its own length, seeded by its index."""

    def __init__(self, n: int, vocab: int):
        self.n, self.vocab = n, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        length = int(torch.randint(4, 49, (1,), generator=g))
        return {"input_ids": torch.randint(1, self.vocab, (length,), generator=g)}


def collate(samples):
    """Right-padded ids, the attention mask, labels -100 on the padding: a tokenizer's padding collator's batch."""
    width = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(samples):
        ids[row, : len(s["input_ids"])] = s["input_ids"]
        mask[row, : len(s["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--learning_rate", type=float, default=1e-3)
    p.add_argument("--max_train_steps", type=int, default=500)
    p.add_argument("--num_warmup_steps", type=int, default=20)
    p.add_argument("--output_dir", default="out")
    args = p.parse_args()
    accelerator = Accelerator()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,
    )
    model = LlamaForCausalLM(config)
    loader = DataLoader(
        Texts(20_000, config.vocab_size), batch_size=args.per_device_train_batch_size, shuffle=True, collate_fn=collate
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.01)

    def schedule(step):
        if step < args.num_warmup_steps:
            return (step + 1) / args.num_warmup_steps
        return max(0.0, (args.max_train_steps - step) / max(1, args.max_train_steps - args.num_warmup_steps))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    model.train()
    step = 0
    while step < args.max_train_steps:
        for batch in loader:
            outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            if step % 100 == 0:
                accelerator.print(f"step {step} loss {loss.item():.4f}")
            step += 1
            if step >= args.max_train_steps:
                break
    accelerator.wait_for_everyone()
    accelerator.unwrap_model(model).save_pretrained(args.output_dir, is_main_process=accelerator.is_main_process)


if __name__ == "__main__":
    main()
