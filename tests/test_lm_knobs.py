"""A language model's knobs (issue 52): each a registry entry with its safety class, "not run" with the reason
where this device or install cannot run it, and applied for real on a tiny random-init Llama (transformers'
LlamaConfig, no hub): the attention kernel set on the model, checkpointing of every block or every second one
with the same loss and gradients, padding-free rows with the padded batch's per-token loss; and the
HF/TRL flags a trial hands a Trainer script (autotune.export.hf_args)."""

from pathlib import Path

import pytest
import torch
import yaml

import autotune
from autotune import knobs as K
from autotune.export import hf_args
from autotune.knobs import _lm

ROOT = Path(__file__).resolve().parents[1]
CPU = K.Device("cpu", 2)
H100 = K.Device("cuda", 16, "NVIDIA H100", (9, 0))
LM = (
    "attention",
    "padding_free",
    "packing",
    "liger_kernels",
    "activation_checkpointing",
    "float8",
    "expandable_segments",
)


def tiny_llama(layers=2, **config):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **{
            "initializer_range": 0.5,  # far from uniform attention: a document that sees another shows it
            "use_cache": False,  # as a Trainer sets it (TrainingArguments.use_cache)
            **config,
        },
    )
    return LlamaForCausalLM(cfg)


def padded_batch():
    torch.manual_seed(1)
    ids = torch.randint(1, 64, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    mask[2, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def production(tmp_path, knobs):
    path = tmp_path / "best_config.yaml"
    path.write_text(yaml.safe_dump({"knobs": knobs, "device": {"type": "cpu"}}))
    return autotune.config(path)


# --- the registry ------------------------------------------------------------------------------------------


def test_each_lm_knob_is_a_registry_entry_with_its_safety_class_and_reason():
    classes = {name: K.KNOBS[name].safety for name in LM}
    assert classes == {
        "attention": "numerics",
        "padding_free": "numerics",
        "packing": "dynamics",
        "liger_kernels": "numerics",
        "activation_checkpointing": "safe",
        "float8": "numerics",
        "expandable_segments": "safe",
    }
    assert all(K.KNOBS[name].safety_reason for name in LM)
    assert K.KNOBS["attention"].choices == K.ATTENTIONS and K.KNOBS["float8"].choices == (
        "off",
        "tensorwise",
        "rowwise",
    )
    assert K.KNOBS["expandable_segments"].stage == "environment"


def test_what_this_cpu_cannot_run_is_not_run_with_the_reason():
    lists = yaml.safe_load((ROOT / "search_spaces" / "lm.yaml").read_text())
    space = K.resolve_space({k: lists[k] for k in LM}, K.pytorch_defaults(8), CPU)
    assert space.search["attention"] == [None, "eager", "sdpa"]  # null: the model's own (the probe finds it)
    assert space.search["activation_checkpointing"] == ["off", "full", "selective"]
    assert space.search["padding_free"] == [False, True] and space.search["packing"] == [False, True]
    for knob in ("liger_kernels", "float8", "expandable_segments"):
        assert "CUDA only" in space.fixed[knob], space.fixed[knob]
    dropped = "\n".join(space.dropped)
    assert "attention='flash_attention_2': FlashAttention is CUDA only; no CUDA device" in dropped
    assert "attention='flex_attention': FlexAttention has no backward pass on the CPU" in dropped


def test_on_a_gpu_a_package_not_installed_is_the_reason():
    """None of flash-attn, liger-kernel or torchao is installed here (autotune installs nothing)."""
    assert not any(K.installed(m) for m in ("flash_attn", "liger_kernel", "torchao"))
    assert "flash-attn is not installed" in K.KNOBS["attention"].unavailable("flash_attention_2", H100)
    assert "liger-kernel is not installed" in K.KNOBS["liger_kernels"].unavailable(True, H100)
    assert "torchao is not installed" in K.KNOBS["float8"].unavailable("rowwise", H100)
    a100 = K.Device("cuda", 16, "NVIDIA A100", (8, 0))
    assert "compute capability >= 8.9" in K.KNOBS["float8"].unavailable("tensorwise", a100)
    assert K.KNOBS["expandable_segments"].unavailable(True, H100) is None
    assert K.KNOBS["attention"].unavailable("flex_attention", H100) is None


def test_checkpointing_true_and_false_still_read_as_full_and_off():
    from autotune import spec as S

    ck = K.KNOBS["activation_checkpointing"]
    assert (ck.canonical(True), ck.canonical(False), ck.check(True), ck.check("some")) == (
        "full",
        "off",
        None,
        "expected one of off | full | selective",
    )
    plan = S.parse(
        {
            "workload": {"name": "tiny_cnn"},
            "baseline": {"activation_checkpointing": True},
            "search_space": {"preset": None, "knobs": {"activation_checkpointing": [False, True, "selective"]}},
        },
        "s.yaml",
    )
    assert plan.baseline.activation_checkpointing == "full"
    assert plan.search_space.lists()["activation_checkpointing"] == ["off", "full", "selective"]
    assert [K.from_cell("activation_checkpointing", c) for c in ("True", False, "selective", "")] == [
        "full",
        "off",
        "selective",
        "off",
    ]


def test_the_allocator_knob_is_an_environment_variable_joining_the_users():
    assert K.environment({"expandable_segments": False}) == {}
    assert K.environment({"expandable_segments": True}, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}) == {
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"
    }


# --- applied on a tiny Llama -------------------------------------------------------------------------------


def test_the_attention_kernel_is_set_on_the_model_through_prepare(tmp_path):
    model = tiny_llama()
    assert model.config._attn_implementation == "sdpa"  # transformers' default
    cfg = production(tmp_path, {"attention": "eager"})
    model, _ = cfg.prepare(model)
    assert model.config._attn_implementation == "eager"
    assert cfg.own == {} and cfg.cannot == {}  # a knob this config sets is not the program's own
    plain = production(tmp_path, {"num_workers": 0})
    plain.prepare(tiny_llama())
    assert plain.own == {"attention": "sdpa"}  # what the probe (no knob set) reads as the baseline
    with pytest.raises(_lm.LMKnobError, match="not a transformers model"):
        _lm.set_attention(torch.nn.Linear(2, 2), "eager")


def loss_and_grads(model, batch):
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_selective_checkpointing_wraps_every_second_block_with_the_same_loss_and_gradients(tmp_path):
    batch = padded_batch()
    loss, grads = loss_and_grads(tiny_llama(layers=4), batch)
    for mode, wrapped in (("full", [0, 1, 2, 3]), ("selective", [0, 2])):
        model = tiny_llama(layers=4)
        chosen = _lm.checkpoint(model, mode)
        assert [list(model.model.layers).index(b) for b in chosen] == wrapped
        assert all(("forward" in vars(b)) == (i in wrapped) for i, b in enumerate(model.model.layers))
        got, got_grads = loss_and_grads(model, batch)
        assert torch.allclose(got, loss, atol=1e-6)
        assert all(torch.allclose(got_grads[n], g, atol=1e-6) for n, g in grads.items())
    # through cfg.prepare, as a custom loop applies it; a plain module without repeated blocks cannot take it
    model, _ = production(tmp_path, {"activation_checkpointing": "selective"}).prepare(tiny_llama(layers=4))
    assert ["forward" in vars(b) for b in model.model.layers] == [True, False, True, False]
    cannot, _ = _lm.what_it_takes(torch.nn.Linear(4, 4))
    assert "no repeated block" in cannot["activation_checkpointing"]


def test_a_padding_free_row_has_the_padded_batchs_per_token_loss():
    batch = padded_batch()
    flat = _lm.flatten(batch)
    assert flat["input_ids"].shape == (1, 21) and "attention_mask" not in flat
    # each document's positions restart at 0; its first token is no target of the document before
    assert flat["position_ids"].tolist() == [[0, 1, 2, 3, 4, *range(9), *range(7)]]
    assert [i for i, label in enumerate(flat["labels"][0].tolist()) if label == -100] == [0, 5, 14]
    model = tiny_llama()
    for impl in ("eager", "sdpa"):
        model.set_attn_implementation(impl)
        padded, flattened = model(**batch).loss, model(**flat).loss
        assert torch.allclose(flattened, padded, atol=1e-5), (impl, padded, flattened)
    # the planted fault: positions that do not restart let attention cross documents, and the loss moves
    crossing = {**flat, "position_ids": torch.arange(21)[None]}
    assert not torch.allclose(model(**crossing).loss, model(**batch).loss, atol=1e-2)


def test_what_a_model_cannot_take_is_said_for_the_probe():
    from transformers import BertConfig, BertForSequenceClassification

    assert _lm.what_it_takes(tiny_llama()) == ({}, {"attention": "sdpa"})
    bert = BertForSequenceClassification(
        BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    )
    cannot, own = _lm.what_it_takes(bert)
    assert cannot["padding_free"].startswith("BertForSequenceClassification is not a causal language model")
    assert not [k for k in cannot if k.startswith("attention")]  # its kernels switch as a Llama's do
    cached = tiny_llama(use_cache=True)  # outside a Trainer: transformers looks for packed rows only without a cache
    assert "KV cache" in _lm.what_it_takes(cached)[0]["padding_free"]
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
    cannot, own = _lm.what_it_takes(mlp)
    assert {"attention", "padding_free", "liger_kernels", "float8"} <= set(cannot) and own == {}


def test_a_batch_that_is_not_one_value_per_token_is_not_flattened():
    batch = {**padded_batch(), "labels": torch.tensor([0, 1, 1])}  # a classifier's
    with pytest.raises(_lm.LMKnobError, match="`labels` is not one value per token"):
        _lm.flatten(batch)
    one_row = _lm.flatten(padded_batch())
    assert _lm.flatten(one_row) is one_row  # already padding-free


def test_the_probes_findings_shape_the_space():
    from autotune.execution.program import fix_unused

    space = K.resolve_space(
        {"attention": ["eager", "sdpa", "flex_attention"], "padding_free": [False, True], "packing": [False, True]},
        {**K.pytorch_defaults(8), "attention": "sdpa"},
        H100,
    )
    fix_unused(
        space,
        ["prepare", "flatten"],
        {"attention=flex_attention": "MyLM has no flex_attention implementation in transformers"},
    )
    assert space.search == {"attention": ["eager", "sdpa"], "padding_free": [False, True]}
    assert "attention='flex_attention': MyLM has no flex_attention" in space.dropped[-1]
    assert space.fixed["packing"] == "not used by your program: it has no `packing` argument (TRL's SFTConfig has one)"
    fix_unused(space, ["prepare"], {"padding_free": "BertForSequenceClassification is not a causal language model"})
    assert space.fixed["padding_free"].startswith("not used by your program: it iterates no padded batches")


# --- the HF/TRL flags ----------------------------------------------------------------------------------------


def test_the_lm_knobs_become_the_scripts_own_flags():
    trl = {
        "attn_implementation",
        "packing",
        "padding_free",
        "use_liger_kernel",
        "activation_checkpointing",
        "activation_checkpointing_kwargs",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
    }
    knobs = {
        "attention": "eager",
        "packing": True,
        "liger_kernels": True,
        "activation_checkpointing": "selective",
        "batch_size": 4,
        "padding_free": True,
    }
    assert hf_args.fields(knobs, accum=4, known=trl) == {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4,  # the micro-batch, accumulated to the effective batch
        "use_liger_kernel": True,
        "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"every_n_layers": 2},
        "attn_implementation": "eager",
        "packing": True,
    }  # padding-free: the Trainer's batches flattened (TRL's own refuses a max_length without packing)
    plain = hf_args.fields(
        knobs,
        known={
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "use_liger_kernel",
            "activation_checkpointing",
            "activation_checkpointing_kwargs",
        },
    )
    assert "attn_implementation" not in plain and "packing" not in plain  # the Trainer's model gets the attention
    assert hf_args.carried(knobs, trl) == {"attention", "packing"} and hf_args.carried(knobs, set()) == set()
    # full after a script's own every-n: every layer, its other checkpointing kwargs kept
    assert hf_args.checkpointing("full", {"every_n_layers": 3, "use_reentrant": False}) == {
        "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"every_n_layers": 1, "use_reentrant": False},
    }
    assert hf_args.checkpointing("off") == {"activation_checkpointing": False}
    assert hf_args.flags({"activation_checkpointing_kwargs": {"every_n_layers": 2}}) == [
        "--activation_checkpointing_kwargs",
        '{"every_n_layers": 2}',
    ]
    old = hf_args.fields({"activation_checkpointing": "full"}, known={"gradient_checkpointing"})
    assert old == {"gradient_checkpointing": True}  # transformers before 5


def test_a_batch_only_a_plain_loops_dataloader_carries_is_not_searched_where_the_effective_batch_is_kept():
    from autotune.execution.program import NO_ACCUMULATION, fix_unused

    lists = {"batch_size": [4, 8], "num_workers": [0, 1]}
    space = K.resolve_space(lists, K.pytorch_defaults(8), K.Device("cpu", 2))
    fix_unused(space, ["torch:loader", "torch:model"], {}, keep_effective_batch=True)
    assert space.fixed["batch_size"] == NO_ACCUMULATION and "num_workers" in space.search
    space = K.resolve_space(lists, K.pytorch_defaults(8), K.Device("cpu", 2))
    fix_unused(space, ["torch:loader", "torch:model"], {}, keep_effective_batch=False)  # dynamics: its DataLoader's
    assert space.search["batch_size"] == [4, 8]
