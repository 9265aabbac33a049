"""autotune's knobs as a Hugging Face `TrainingArguments` script's own flags: what a zero-code trial appends
to the script's `HfArgumentParser` (autotune.instrument), and what
`autotune export RUN -f hf-args` prints for production (`render`). Plain data (no transformers imported).

A knob the config does not set (absent or None) adds no flag: the script keeps its own value. Fields that
switch together are written together (`--bf16 true --fp16 false`), so a flag the script's command already
carries cannot leave two precisions on. The batch is the micro-batch: `per_device_train_batch_size` comes with
`gradient_accumulation_steps` (the search's keep_effective_batch, else 1), so a step trains on what it says.
The language-model knobs: `use_liger_kernel`, `activation_checkpointing` (selective: every
`SELECTIVE_EVERY`-th layer, `activation_checkpointing_kwargs.every_n_layers`); `attn_implementation` and
`packing` where the script's parser has those fields (`known`: TRL's ModelConfig and SFTConfig), the
attention kernel otherwise set on the Trainer's model, and padding-free batches made from the Trainer's own,
by the instrumented Trainer (autotune.instrument).

    fields({"precision": "bf16-mixed", "num_workers": 2})  # {"bf16": True, "fp16": False, "dataloader_num_workers": 2}
    flags(fields(...))                                     # ["--bf16", "true", "--fp16", "false", ...]
    knobs_of(training_args)                                # the other way: the knob values a script runs with
    render(best_config)                                    # the flags that change the baseline, then how to apply the rest
    knobs_of(training_args)                                # the other way: the knob values a script runs with
"""

from __future__ import annotations

import json
from typing import Any

from autotune.knobs._registry import SELECTIVE_EVERY

PRECISION = {  # knob value -> the TrainingArguments fields that select it (tf32 left to the script unless asked)
    "32-true": {"bf16": False, "fp16": False},
    "bf16-mixed": {"bf16": True, "fp16": False},
    "16-mixed": {"fp16": True, "bf16": False},
    "tf32": {"tf32": True, "bf16": False, "fp16": False},
}
LOADER = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
    "batch_size": "per_device_train_batch_size",
    "liger_kernels": "use_liger_kernel",
    "ddp_bucket_cap_mb": "ddp_bucket_cap_mb",
    "ddp_static_graph": "ddp_static_graph",
}
# knobs with no TrainingArguments field, and how a script applies them
UNREACHABLE = {
    "num_threads": "OMP_NUM_THREADS={v} before the command (`autotune run` sets it as the trials did)",
    "cudnn_benchmark": "torch.backends.cudnn.benchmark = {v} (`autotune run` sets it as the trials did)",
    "channels_last": "in the script, `model, _ = cfg.prepare(model)` (cfg = autotune.config()) before Trainer(...)",
    "set_to_none": "the Trainer zeroes gradients with set_to_none=True; {v} cannot be set from outside",
    "ddp_gradient_as_bucket_view": "no TrainingArguments field: `model = cfg.wrap(model)` in the script",
    "sharding": "no flag here: `autotune export RUN -f hf` gives the fsdp and fsdp_config arguments",
    "fsdp_reshard_after_forward": "no flag here: `autotune export RUN -f hf` gives the fsdp_config argument",
    "attention": "`--attn_implementation {v}` where the script's parser has that field (TRL's ModelConfig); "
    "otherwise `autotune run` sets it on the Trainer's model (model.set_attn_implementation)",
    "packing": "`--packing {v}` (TRL's SFTConfig)",
    "padding_free": "`autotune run` flattens the Trainer's padded batches into one row with position ids (TRL's "
    "own `--padding_free true` needs packing, or no max_length)",
    "float8": "`autotune run` converts the Trainer's model (torchao's convert_to_float8_training, recipe {v})",
    "expandable_segments": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the command (`autotune run` "
    "sets it as the trials did)",
}
# knobs a script's own parser may carry (TRL's): knob -> field, written where the parser has the field (`known`)
SCRIPT_FIELDS = {"attention": "attn_implementation", "packing": "packing"}
# transformers before 5 knows activation checkpointing by its old names
OLD_NAMES = {
    "activation_checkpointing": "gradient_checkpointing",
    "activation_checkpointing_kwargs": "gradient_checkpointing_kwargs",
}
# what a trial sets so the script leaves nothing behind: no hub push, no tracker, no checkpoints, no eval
TRIAL_FIELDS = {"report_to": "none", "push_to_hub": False, "save_strategy": "no", "eval_strategy": "no"}


def checkpointing(mode: str, own: dict[str, Any] | None = None) -> dict[str, Any]:
    """The TrainingArguments fields of an activation checkpointing mode (off, full, selective); `own`: the
    script's own activation_checkpointing_kwargs, kept beside `every_n_layers`."""
    if mode == "off":
        return {"activation_checkpointing": False}
    out: dict[str, Any] = {"activation_checkpointing": True}
    own = dict(own or {})
    if mode == "selective":
        out["activation_checkpointing_kwargs"] = {**own, "every_n_layers": SELECTIVE_EVERY}
    elif own.get("every_n_layers", 1) != 1:  # full: every layer, whatever the script's own kwargs said
        out["activation_checkpointing_kwargs"] = {**own, "every_n_layers": 1}
    return out


def fields(
    knobs: dict[str, Any],
    device_type: str | None = None,
    accum: int | None = None,
    known: set[str] | None = None,
    own_kwargs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The TrainingArguments fields for the knobs `knobs` sets (absent or None: the script's own); on a
    `device_type` "cpu" a precision comes with `use_cpu` (TrainingArguments refuses bf16 on a host without
    a GPU otherwise); a batch with its `accum` micro-batches per step (default 1). `known`: the fields the
    script's parser has (None: TrainingArguments'): the script's own fields (`SCRIPT_FIELDS`) are written
    where it has them, and a field it lacks is left out (activation checkpointing by its old name where only
    that is known). `own_kwargs`: the script's own activation_checkpointing_kwargs."""
    k = {name: v for name, v in knobs.items() if v is not None}
    out: dict[str, Any] = {}
    for name, field in LOADER.items():
        if name in k:
            out[field] = k[name]
    if "batch_size" in k:
        out["gradient_accumulation_steps"] = accum or 1
    if "activation_checkpointing" in k:
        out.update(checkpointing(k["activation_checkpointing"], own_kwargs))
    for name, field in SCRIPT_FIELDS.items():
        if name in k and known is not None and field in known:
            out[field] = k[name]
    if k.get("padding_free") is False and known is not None and "padding_free" in known:
        out["padding_free"] = False  # TRL's own, off; on, the Trainer flattens (TRL's refuses a max_length)
    if not k.get("num_workers"):  # TrainingArguments refuses a prefetch factor without workers
        out.pop("dataloader_prefetch_factor", None)
    if "precision" in k:
        out.update(PRECISION[k["precision"]])
        if device_type == "cpu":
            out["use_cpu"] = True
    if "compile" in k:
        out["torch_compile"] = k["compile"] != "none"
        if k["compile"] not in ("none", "default"):
            out["torch_compile_mode"] = k["compile"]
    if "fused_optimizer" in k:  # off: the same AdamW unfused (transformers' default optimizer is the fused one)
        out["optim"] = "adamw_torch_fused" if k["fused_optimizer"] else "adamw_torch"
    if known is not None:
        for new, old in OLD_NAMES.items():
            if new in out and new not in known and old in known:
                out[old] = out.pop(new)
        out = {f: v for f, v in out.items() if f in known}
    return out


def carried(knobs: dict[str, Any], known: set[str]) -> set[str]:
    """The knobs among `knobs` that the script's own flags carry (its parser has their fields)."""
    out = set()
    for name, field in SCRIPT_FIELDS.items():
        if name in knobs and field in known:
            out.add(name)
    return out


def knobs_of(args: Any) -> dict[str, Any]:
    """The knob values a `TrainingArguments` (or a mapping of its fields) runs with: `fields` read the other way
    for the loader's, the batch, precision, compile and the fused optimizer (the language-model knobs:
    autotune.instrument._transformers.own_of), the script's own settings that a search takes as its baseline
    (autotune.execution.program). A field the arguments leave unset (None) gives no value: PyTorch's default
    stands."""
    get = args.get if isinstance(args, dict) else lambda name: getattr(args, name, None)
    out = {knob: get(field) for knob, field in LOADER.items()}
    precision = next((p for p, f in PRECISION.items() if p != "32-true" and get(next(iter(f))) is True), None)
    out["precision"] = precision or ("32-true" if get("bf16") is False and get("fp16") is False else None)
    if get("torch_compile") is not None:
        out["compile"] = (get("torch_compile_mode") or "default") if get("torch_compile") else "none"
    optim = str(getattr(get("optim"), "value", get("optim")))  # an OptimizerNames member, or its text
    if optim in ("adamw_torch", "adamw_torch_fused"):  # another optimizer: the knob cannot say it
        out["fused_optimizer"] = optim == "adamw_torch_fused"
    return {name: v for name, v in out.items() if v is not None}


def unreachable(knobs: dict[str, Any]) -> dict[str, str]:
    """knob -> how to apply it, for the set knobs no TrainingArguments flag carries."""
    return {
        name: how.format(v=to_flag(knobs[name])) for name, how in UNREACHABLE.items() if knobs.get(name) is not None
    }


def to_flag(value) -> str:
    """A value as HfArgumentParser reads it: booleans as true/false, dicts as JSON."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return json.dumps(value)
    return str(value)


def flags(values: dict[str, Any]) -> list[str]:
    """`--name value` pairs as HfArgumentParser reads them (booleans as true/false)."""
    out = []
    for name, value in values.items():
        out += [f"--{name}", to_flag(value)]
    return out


def changed(best: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """The fields of `best` that differ from `baseline`'s, with their pairs (both as `fields` returns them)."""
    out = {}
    for name, value in best.items():
        if baseline.get(name) != value:
            out[name] = value
    if out.keys() & {"bf16", "fp16", "tf32"}:  # a precision switches all its fields together
        out.update({f: best[f] for f in ("bf16", "fp16", "tf32", "use_cpu") if f in best})
    if "torch_compile_mode" in best and "torch_compile" in out:
        out["torch_compile_mode"] = best["torch_compile_mode"]
    return out


def render(data: dict[str, Any]) -> str:
    """best_config.yaml as the HF script's flags: the fields the best config changes from the baseline (its
    `safety` list: each changed knob's baseline and tuned value), on one line; then, as comments, the changed
    knobs no flag carries and how to apply them."""
    changes = [f for f in data.get("safety") or [] if isinstance(f, dict) and f.get("knob") in KNOWN]
    best = {f["knob"]: f["tuned"] for f in changes}
    device = (data.get("device") or {}).get("type")
    accum = int((data.get("batch") or {}).get("grad_accumulation_steps") or 1)
    base = {f["knob"]: f["baseline"] for f in changes}
    line = " ".join(flags(changed(fields(best, device, accum), fields(base, device))))
    out = [line or "# no flag to add: the best config changes no TrainingArguments field from the baseline"]
    rest = unreachable(best)
    if rest:
        out.append("# not carried by a TrainingArguments flag:")
        out += [f"#   {name}={best[name]}: {how}" for name, how in rest.items()]
    return "\n".join(out) + "\n"


KNOWN = {*LOADER, "precision", "compile", "fused_optimizer", "activation_checkpointing", *UNREACHABLE}
