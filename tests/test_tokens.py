"""A language model's unit (autotune.trial.tokens and trial.result.unit_of): the tokens a batch trains on, FLOPs
per token and MFU, and tokens/s measured by a built-in trial and by a program's own loop. Real collators
(transformers', TRL's) and real training steps of a tiny random-init Llama (tests/workloads.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune.trial import tokens as T
from autotune.trial.result import SAMPLES, TOKENS, TrialResult, unit_of
from autotune.trial.runner import run_trial
from tests.workloads import Texts, pad_texts, tiny_llama

ROOT = Path(__file__).parent.parent
PROGRAMS = Path(__file__).parent / "programs"
TEXTS = [Texts()[i] for i in range(5)]
LENGTHS = [len(t["input_ids"]) for t in TEXTS]
QUICK = {"warmup_steps": 2, "measure_steps": 5, "min_window_s": 0.3, "max_window_s": 2.0, "profile_steps": 0}


# --- counting ---------------------------------------------------------------------------------------------------


def test_a_padded_batch_counts_its_attention_masks_tokens():
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    padded = pad_texts(TEXTS)
    assert padded["input_ids"].numel() > sum(LENGTHS)  # there is padding to leave out
    assert T.count(padded) == (sum(LENGTHS), 5)
    trl = DataCollatorForLanguageModeling(pad_token_id=0)(TEXTS)  # TRL's SFT collator, not padding-free
    assert T.count(trl) == (sum(LENGTHS), 5)


def test_without_a_mask_the_labels_that_are_not_ignored_are_counted():
    padded = pad_texts(TEXTS)
    assert T.count({"input_ids": padded["input_ids"], "labels": padded["labels"]}) == (sum(LENGTHS), 5)
    ids = torch.randint(0, 9, (3, 8))  # a classifier's batch (tiny_transformer's): a label per row, every id counts
    assert T.count({"input_ids": ids, "labels": torch.tensor([1, 2, 3])}) == (24, 3)


def test_a_padding_free_row_counts_its_sequences_lengths():
    from transformers import DataCollatorWithFlattening
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    flat = DataCollatorWithFlattening(return_tensors="pt")(TEXTS)  # transformers': one row, position ids
    assert flat["input_ids"].shape == (1, sum(LENGTHS)) and "attention_mask" not in flat
    assert T.count(flat) == (sum(LENGTHS), 5)
    # TRL's padding_free, padded to a multiple of 64: the padding (position 0s, each alone) is no token
    trl = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, pad_to_multiple_of=64)(TEXTS)
    assert trl["input_ids"].numel() == 128 > sum(LENGTHS)
    assert T.count(trl) == (sum(LENGTHS), 5)
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)  # boundaries alone
    assert T.count({"input_ids": flat["input_ids"], "cu_seq_lens_q": cu}) == (sum(LENGTHS), 5)


def test_a_batch_without_input_ids_is_no_language_models():
    assert T.count((torch.zeros(4, 3, 8, 8), torch.zeros(4))) is None
    assert T.count({"pixel_values": torch.zeros(2, 3, 8, 8)}) is None
    assert unit_of({"samples_per_s": 10.0}) is SAMPLES
    assert unit_of({"samples_per_s": 10.0, "tokens_per_s": 320.0}) is TOKENS


# --- FLOPs per token and MFU ------------------------------------------------------------------------------------


def test_flops_per_token_is_6n_and_the_attention_term_counted_by_hand():
    """LLAMA: hidden 32, 4 heads of 8 (q 32 wide), 2 KV heads (k, v 16 wide), MLP 64, 2 layers, vocab 64."""
    d, kv, ff, layers, vocab = 32, 16, 64, 2, 64
    per_layer = d * d + d * kv + d * kv + d * d + 3 * d * ff + 2 * d  # q, k, v, o, gate/up/down, two RMSNorms
    n = layers * per_layer + d + vocab * d  # the final norm, the LM head (not the embedding table: a lookup)
    assert n == 20640
    untied, tied = tiny_llama(), tiny_llama(tie_word_embeddings=True)
    assert T.non_embedding_params(untied) == n
    assert T.non_embedding_params(tied) == n  # the table is the head's weight: its matmul counts, once
    assert T.attention_widths(untied) == [d] * layers
    assert T.flops_per_token(untied, 16) == 6 * n + 12 * layers * d * 16  # 123,840 + 12,288


def test_mfu_is_computed_against_a_known_peak_and_unknown_on_a_cpu():
    model = tiny_llama()
    window = {"tokens_per_s": 1e9, "seq_len_mean": 16.0}
    per_token = T.flops_per_token(model, 16)
    gpu = T.flop_metrics(model, window, "NVIDIA H100 80GB HBM3", "bf16-mixed")
    assert gpu["flops_per_token"] == per_token
    assert gpu["achieved_tflops"] == pytest.approx(per_token * 1e9 / 1e12)
    assert gpu["mfu"] == pytest.approx(per_token * 1e9 / 989.4e12)
    cpu = T.flop_metrics(model, window, "cpu", "bf16-mixed")
    assert "mfu" not in cpu and cpu["flops_per_token"] == per_token  # no peak on a CPU: unknown, not a guess
    assert "mfu" not in T.flop_metrics(model, window, "NVIDIA H100 80GB HBM3", "32-true")  # no single fp32 peak
    assert T.flop_metrics(model, {"samples_per_s": 5.0}, "cpu", None) == {}  # no tokens: not a language model's


# --- measured: a built-in trial, a program's loop -----------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("padding_free", [False, True])
def test_a_built_in_trial_of_a_language_model_measures_tokens_per_s(padding_free):
    result = run_trial(
        {
            "workload": {"factory": "tests.workloads:make_tiny_llama", "args": {"padding_free": padding_free}},
            "knobs": {"batch_size": 4, "num_threads": 1},
            "diagnose": False,
            **QUICK,
        }
    )
    assert result.status == "ok", result.error
    m = result.metrics
    assert result.unit is TOKENS and result.rate == m["tokens_per_s"]
    assert 4 <= m["seq_len_mean"] <= 24  # a text's tokens, padding left out
    assert m["tokens_per_s"] == pytest.approx(m["tokens_per_step"] * m["steps_per_s"])
    # four texts a step, each counted once: padded, four rows; padding-free, four sequences in one row
    assert m["tokens_per_step"] / m["seq_len_mean"] == pytest.approx(4)
    assert m["samples_per_s"] == pytest.approx((1 if padding_free else 4) * m["steps_per_s"])
    assert m["flops_per_token"] == T.flops_per_token(tiny_llama(), m["seq_len_mean"])
    assert "mfu" not in m  # a CPU


@pytest.mark.timeout(300)
def test_a_built_in_classifier_on_token_ids_counts_every_id():
    result = run_trial({"workload": {"name": "tiny_transformer"}, "knobs": {"batch_size": 8}, **QUICK})
    assert result.status == "ok", result.error
    m = result.metrics
    assert m["tokens_per_s"] == pytest.approx(32 * m["samples_per_s"]) and m["seq_len_mean"] == 32
    assert m["flops_per_sample"] > 0 and "flops_per_token" in m  # counted by FlopCounterMode too, beside


def run_program(tmp_path, *args: str) -> TrialResult:
    """lm_loop.py as a trial's process runs it (the launcher sets AUTOTUNE_TRIAL)."""
    request = {"workload": {"command": ["python", "lm_loop.py"]}, "knobs": {"num_threads": 1}, **QUICK}
    request.pop("profile_steps")
    (tmp_path / "config.json").write_text(json.dumps(request))
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOTUNE_TRIAL", "AUTOTUNE_CONFIG")}
    env.update(PYTHONPATH=str(ROOT), AUTOTUNE_TRIAL=str(tmp_path / "config.json"))
    proc = subprocess.run(
        [sys.executable, str(PROGRAMS / "lm_loop.py"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return TrialResult.read(tmp_path / "result.json")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["steps", pytest.param("step", marks=pytest.mark.slow)])  # CI: cfg.steps's
def test_a_programs_own_loop_reports_tokens_per_s(tmp_path, mode):
    """`cfg.steps(loader)` counts each batch's tokens; `cfg.step(tokens=...)` is the program's own count."""
    result = run_program(tmp_path, "--mode", mode, "--batch_size", "4")
    assert result.status == "ok", result.error
    m = result.metrics
    assert result.unit is TOKENS
    assert m["samples_per_s"] == pytest.approx(4 * m["steps_per_s"])
    assert 4 <= m["seq_len_mean"] <= 24 and m["tokens_per_step"] / m["seq_len_mean"] == pytest.approx(4)
    assert m["flops_per_token"] == T.flops_per_token(tiny_llama(), m["seq_len_mean"])  # its model, from cfg.prepare
    assert "mfu" not in m and m["mem_rss_peak_gib"] > 0  # a CPU: no peak FLOPs; its peak memory, recorded
