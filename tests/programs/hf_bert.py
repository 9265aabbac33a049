"""Train a small BERT classifier with the Hugging Face Trainer, the way transformers' example scripts do
(`run_glue.py`): HfArgumentParser for the arguments, TrainingArguments, a padding data collator.

The data is generated: sentences of random words (variable lengths), tokenized by a word-hash tokenizer
written here, labelled by whether an even number of their words are "positive". No download.

    python hf_bert.py --output_dir out --max_steps 200 --per_device_train_batch_size 16
"""

import hashlib
import random
from dataclasses import dataclass, field

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)

WORDS = [f"w{i}" for i in range(5000)]


@dataclass
class ModelArguments:
    hidden_size: int = field(default=64, metadata={"help": "BERT's hidden size"})
    num_layers: int = field(default=2, metadata={"help": "transformer layers"})
    num_heads: int = field(default=4, metadata={"help": "attention heads"})


@dataclass
class DataArguments:
    num_samples: int = field(default=4096, metadata={"help": "sentences in the training set"})
    min_words: int = field(default=8, metadata={"help": "shortest sentence"})
    max_words: int = field(default=96, metadata={"help": "longest sentence"})
    vocab_size: int = field(default=2048, metadata={"help": "token ids (hashed words)"})


def tokenize(text: str, vocab_size: int) -> list[int]:
    """[CLS] + one id per word (a stable hash) + [SEP]; 0 is padding."""
    ids = [int(hashlib.sha256(w.encode()).hexdigest()[:8], 16) % (vocab_size - 3) + 3 for w in text.split()]
    return [1, *ids, 2]


class SentenceDataset(torch.utils.data.Dataset):
    def __init__(self, args: DataArguments, seed: int):
        self.args, self.seed = args, seed

    def __len__(self):
        return self.args.num_samples

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(i)  # `for x in dataset` (the Trainer's length-grouped sampler) stops here
        rng = random.Random(self.seed * 1_000_003 + i)
        words = rng.choices(WORDS, k=rng.randint(self.args.min_words, self.args.max_words))
        label = sum(int(w[1:]) % 7 == 0 for w in words) % 2
        return {"input_ids": tokenize(" ".join(words), self.args.vocab_size), "labels": label}


def pad_collate(features):
    """Pads each batch to its longest sentence (DataCollatorWithPadding's job, without a tokenizer)."""
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), longest, dtype=torch.long)
    mask = torch.zeros(len(features), longest, dtype=torch.long)
    for row, f in enumerate(features):
        ids[row, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[row, : len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([f["labels"] for f in features])}


def main():
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    set_seed(training_args.seed)

    config = BertConfig(
        vocab_size=data_args.vocab_size,
        hidden_size=model_args.hidden_size,
        num_hidden_layers=model_args.num_layers,
        num_attention_heads=model_args.num_heads,
        intermediate_size=4 * model_args.hidden_size,
        max_position_embeddings=data_args.max_words + 2,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    train_dataset = SentenceDataset(data_args, training_args.seed)

    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset, data_collator=pad_collate)
    result = trainer.train()
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)


if __name__ == "__main__":
    main()
