"""A language model trained by transformers' Trainer, as a script that is not TRL's writes one: the tiny
random-init Llama of tests/workloads.py on texts of 4 to 24 tokens, its own collator padding each batch, its flags
read by HfArgumentParser (so a trial's batch size reaches it, and the instrumented Trainer applies the attention
kernel and padding-free rows). For loss parity (tests/test_program_parity.py), `--fault` plants what a padding-free
row must not do, after the Trainer is built (past the instrumented Trainer's own checks):
- `positions`: a collator that drops the position ids (a padding-free row's documents then attend across each
  other, their positions running on);
- `cache`: the KV cache turned on again after the Trainer turned it off (transformers builds no packed mask beside
  a cache, so the documents attend across each other too).
A padded batch has no position ids and needs no packed mask, so the baseline trains the same with either fault.

    python lm_trainer.py --output_dir out --per_device_train_batch_size 4 --report_to none [--fault positions]
"""

from dataclasses import dataclass, field

from transformers import HfArgumentParser, Trainer, TrainingArguments

from tests.workloads import Texts, pad_texts, tiny_llama


@dataclass
class Plant:
    fault: str = field(default="none", metadata={"choices": ["none", "positions", "cache"]})


class DropPositions:
    """A collator whose batches come out without position ids (the planted fault `positions`)."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features):
        batch = self.collator(features)
        batch.pop("position_ids", None)
        return batch


args, plant = HfArgumentParser((TrainingArguments, Plant)).parse_args_into_dataclasses()
model = tiny_llama()
trainer = Trainer(model=model, args=args, train_dataset=Texts(), data_collator=pad_texts)
if plant.fault == "positions":
    trainer.data_collator = DropPositions(trainer.data_collator)
elif plant.fault == "cache":
    model.config.use_cache = True
trainer.train()
