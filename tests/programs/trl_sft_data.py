"""The model and the data TRL's own SFT script (`python -m trl.scripts.sft`, the installed package's, as it ships)
trains on here, made offline:

- `tiny_llama/`: a Llama causal LM at random init (2 layers, hidden 128; `--layers`, `--hidden`, `--heads` size it
  up, as scripts/bench/bench_llm.py does) and its tokenizer, a byte-level BPE trained here with the `tokenizers`
  library on the generated text, saved as a `PreTrainedTokenizerFast` with its pad and end-of-sequence tokens;
  `--model_name_or_path tiny_llama` loads both. `--model_vocab`: the model's vocabulary, larger than the
  tokenizer's (its rows past the tokenizer's never seen), so that its output layer costs what a real model's does
  (Llama 2's 32000);
- `tiny_text/train.jsonl`: rows with a `text` field, sentences of made-up words (a Zipf draw from a syllable
  vocabulary), 8 to 160 words long, most of them short (as an SFT set's are); `--dataset_name tiny_text`.

    python trl_sft_data.py [DIR]         # writes DIR/tiny_llama and DIR/tiny_text (DIR: here)
    python -m trl.scripts.sft --model_name_or_path tiny_llama --dataset_name tiny_text --output_dir out --max_steps 50 \\
        --per_device_train_batch_size 4 --max_length 256 --report_to none
"""

import argparse
import json
import random
from pathlib import Path

SYLLABLES = ["ka", "lo", "mi", "ren", "su", "ta", "vo", "ne", "pi", "dor", "al", "ush", "ri", "em", "zo", "ba"]


def words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choices(SYLLABLES, k=rng.randint(1, 3))) for _ in range(n)]


def texts(rows: int, seed: int) -> list[str]:
    """`rows` texts of 8 to 160 words (log-uniform lengths: most short), words drawn by Zipf's law."""
    rng = random.Random(seed)
    vocab = words(rng, 3000)
    weights = [1 / (rank + 1) for rank in range(len(vocab))]
    out = []
    for _ in range(rows):
        n = int(round(8 * 20 ** rng.random()))
        sentence = rng.choices(vocab, weights, k=n)
        out.append(" ".join(sentence).capitalize() + ".")
    return out


def tokenizer(corpus: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special = ["<|pad|>", "<|bos|>", "<|eos|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token="<|pad|>", bos_token="<|bos|>", eos_token="<|eos|>", model_max_length=512
    )


def model(tok, hidden: int, layers: int, heads: int = 4, vocab: int | None = None):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=max(len(tok), vocab or 0),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", nargs="?", default=".", help="where tiny_llama/ and tiny_text/ go")
    p.add_argument("--rows", type=int, default=4000, help="training texts")
    p.add_argument("--vocab_size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--model_vocab", type=int, default=None, help="the model's vocabulary (default: the tokenizer's)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    out = Path(a.dir)
    corpus = texts(a.rows, a.seed)
    data = out / "tiny_text"
    data.mkdir(parents=True, exist_ok=True)
    with open(data / "train.jsonl", "w") as f:
        for text in corpus:
            f.write(json.dumps({"text": text}) + "\n")
    tok = tokenizer(corpus, a.vocab_size)
    tok.save_pretrained(out / "tiny_llama")
    model(tok, a.hidden, a.layers, a.heads, a.model_vocab).save_pretrained(out / "tiny_llama")


if __name__ == "__main__":
    main()
