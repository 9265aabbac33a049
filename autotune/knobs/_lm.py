"""The language-model knobs applied to a model and its batches (torch, transformers and the optional packages
imported on call). One set of functions for `cfg.prepare(model)` in a custom loop, the instrumented
`transformers.Trainer` and the Lightning callback, so each path applies a knob the same way:

- `set_attention`: transformers' `set_attn_implementation` on the model (or the first transformers model inside
  it), checked: a model whose class cannot switch kernels only warns in transformers, and fails here;
- `apply_liger`: Liger's kernels patched into the model instance (`_apply_liger_kernel_to_instance`, what
  transformers' `use_liger_kernel` calls);
- `checkpoint`: `torch.utils.checkpoint` around each repeated block (full) or every `SELECTIVE_EVERY`-th one
  from the first (selective: transformers' `every_n_layers`, torchtitan's selective layer AC);
- `to_float8`: torchao's `convert_to_float8_training` on the Linear layers whose dimensions are multiples of 16,
  the output head left out (torchtitan's filter);
- `flatten`: a padded batch as one row (padding-free), see its doc;
- `prepare_lm`: the set ones in torchtitan's order (parallelize_llama): float8 and Liger change the modules,
  then the attention kernel, then checkpointing around the blocks as they now are; compile stays last (the
  caller's);
- `what_it_takes`: why a model cannot take a knob or one of its values (the probe's `Config.cannot`) and the
  values it runs with on its own (`Config.own`).
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

from autotune.knobs._blocks import BlockError, find_blocks
from autotune.knobs._registry import SELECTIVE_EVERY

# attention kernels whose masks transformers 5.24 builds from packed position ids (masking_utils: without an
# attention mask, `find_packed_sequence_indices` splits a row where the positions restart; the flash kernels take
# the same boundaries as varlen sequences): a padding-free row keeps its documents apart under these only
PACKED_ATTENTION = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4")
IGNORE = -100  # transformers' ignored label


class LMKnobError(ValueError):
    """A language-model knob this model or batch cannot take; says why."""


def hf_model(model):
    """The transformers model inside `model` (itself, a compiled / DDP / PEFT wrapper's, a LightningModule's
    attribute), or None."""
    seen = model
    for attr in ("_orig_mod", "module"):
        seen = getattr(seen, attr, seen)
    if hasattr(seen, "get_base_model"):  # PEFT
        seen = seen.get_base_model()
    if hasattr(seen, "set_attn_implementation") and hasattr(seen, "config"):
        return seen
    for module in getattr(seen, "modules", lambda: [])():
        if hasattr(module, "set_attn_implementation") and hasattr(module, "config"):
            return module
    return None


# --- what a model takes ---------------------------------------------------------------------------------------


def _attention_cannot(model) -> dict[str, str]:
    hf = hf_model(model)
    if hf is None:
        return {
            "attention": f"{type(model).__name__} is not a transformers model (no set_attn_implementation): "
            "its attention is its own code"
        }
    name = type(hf).__name__
    if not type(hf)._can_set_attn_implementation():
        return {"attention": f"{name}'s attention does not go through transformers' AttentionInterface"}
    out = {}
    supports = {
        "sdpa": hf._supports_sdpa,
        "flex_attention": hf._supports_flex_attn,
        "flash_attention_2": hf._supports_flash_attn,
        "flash_attention_3": hf._supports_flash_attn,
    }
    for value, ok in supports.items():
        if not ok:
            out[f"attention={value}"] = f"{name} has no {value} implementation in transformers"
    return out


def padding_free_cannot(model) -> str | None:
    """Why a padding-free row of `model`'s batches would not train on what the padded batch does, or None:
    it must be a causal language model (a token-level loss; a classifier's is per row), take position ids, run an
    attention kernel that keeps packed documents apart (`PACKED_ATTENTION`), keep no KV cache in training
    (transformers 5.24 looks for packed sequences only without one: measured on a tiny Llama, a second document's
    logits off by 14 with the cache, 1e-5 without), and build its mask from the position ids (its modeling code
    passes them to masking_utils; a state-space layer would carry state across documents)."""
    hf = hf_model(model)
    if hf is None:
        return f"{type(model).__name__} is not a transformers model: nothing says how it reads a flattened row"
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = type(hf).__name__
    if name not in set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()):
        return (
            f"{name} is not a causal language model (transformers' MODEL_FOR_CAUSAL_LM_MAPPING): its loss is not "
            "per token, so a row of several texts is not the same batch"
        )
    if "position_ids" not in inspect.signature(hf.forward).parameters:
        return f"{name}.forward takes no position_ids: a flattened row's documents cannot restart their positions"
    if getattr(hf.config, "use_cache", False):
        return (
            f"{name} keeps a KV cache in training (config.use_cache; a Trainer turns it off): transformers builds no "
            "packed mask beside a cache, so attention would cross documents"
        )
    impl = hf.config._attn_implementation
    if impl not in PACKED_ATTENTION:
        return f"its attention `{impl}` builds no mask from packed position ids: attention would cross documents"
    try:
        code = inspect.getsource(sys.modules[type(hf).__module__])
    except (OSError, TypeError, KeyError):
        code = ""
    if "position_ids=position_ids" not in code or "masking_utils" not in code:
        return f"{name}'s modeling code builds its mask without the position ids: attention would cross documents"
    return None


def _float8_cannot(model) -> str | None:
    if not [n for n, m in model.named_modules() if _float8_eligible(m, n)]:
        return "no Linear layer with both dimensions multiples of 16 (torch._scaled_mm's) to run in float8"
    return None


def what_it_takes(model, blocks: list[str] | None = None) -> tuple[dict[str, str], dict[str, Any]]:
    """(cannot, own) for `model`: why it cannot take a language-model knob ("knob") or one value of it
    ("knob=value"); and the values it runs with on its own (its attention kernel, transformers' own activation
    checkpointing)."""
    cannot = _attention_cannot(model)
    why = padding_free_cannot(model)
    if why:
        cannot["padding_free"] = why
    hf = hf_model(model)
    if hf is None:
        cannot["liger_kernels"] = f"{type(model).__name__} is not a transformers model: Liger patches those"
    else:
        from autotune._imports import installed

        if installed("liger_kernel"):
            from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

            if hf.config.model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
                cannot["liger_kernels"] = f"Liger has no kernels for model type `{hf.config.model_type}`"
    if not find_blocks(model, blocks):
        cannot["activation_checkpointing"] = (
            "no repeated block to checkpoint (a module class with two or more instances holding parameters); "
            "name one in the spec's resources.blocks"
        )
    why = _float8_cannot(model)
    if why:
        cannot["float8"] = why
    own: dict[str, Any] = {}
    if hf is not None:
        own["attention"] = hf.config._attn_implementation
        if _hf_checkpointing(hf):
            own["activation_checkpointing"] = "full"
    return cannot, own


def _hf_checkpointing(hf) -> bool:
    """Whether a transformers model checkpoints its layers itself (`activation_checkpointing_enable`)."""
    return bool(getattr(hf, "is_activation_checkpointing", False))


# --- applying them --------------------------------------------------------------------------------------------


def set_attention(model, impl: str) -> None:
    """`model`'s attention kernel (transformers' attn_implementation), checked."""
    hf = hf_model(model)
    if hf is None:
        raise LMKnobError(_attention_cannot(model)["attention"])
    hf.set_attn_implementation(impl)
    if hf.config._attn_implementation != impl:  # a class that cannot switch only warns in transformers
        raise LMKnobError(
            f"attention={impl}: {type(hf).__name__} kept `{hf.config._attn_implementation}` "
            "(its attention does not go through transformers' AttentionInterface)"
        )


def apply_liger(model) -> None:
    """Liger's kernels patched into the model instance, as transformers' `use_liger_kernel` does."""
    hf = hf_model(model)
    if hf is None:
        raise LMKnobError(f"liger_kernels: {type(model).__name__} is not a transformers model")
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    _apply_liger_kernel_to_instance(model=hf)


def checkpointed(blocks: list, mode: str) -> list:
    """The blocks `mode` checkpoints: all (full), every SELECTIVE_EVERY-th from the first (selective), none (off)."""
    if mode == "full":
        return list(blocks)
    if mode == "selective":
        return [b for i, b in enumerate(blocks) if i % SELECTIVE_EVERY == 0]
    return []


def checkpoint(model, mode: str, blocks: list[str] | None = None) -> list:
    """Activation checkpointing per repeated block as `mode` says (`checkpointed`): each chosen block's forward
    runs under torch.utils.checkpoint (non-reentrant), its activations recomputed in backward. A transformers
    model's own checkpointing is turned off first (one mechanism, the one measured). The module and its state
    dict are unchanged. Returns the blocks wrapped."""
    from torch.utils.checkpoint import checkpoint as run_checkpointed

    hf = hf_model(model)
    if hf is not None and _hf_checkpointing(hf):
        hf.activation_checkpointing_disable()
    if mode == "off":
        return []
    found = find_blocks(model, blocks)
    if not found:
        raise BlockError(
            "activation_checkpointing needs a repeated block (a module class with two or more "
            "instances holding parameters); name one in the spec's resources.blocks"
        )
    chosen = checkpointed(found, mode)
    for block in chosen:
        block.forward = functools.partial(run_checkpointed, block.forward, use_reentrant=False)
    return chosen


def _float8_eligible(module, name: str) -> bool:
    import torch

    return (
        isinstance(module, torch.nn.Linear)
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
        and name.rsplit(".", 1)[-1] not in ("lm_head", "output")
    )


def to_float8(model, recipe: str) -> None:
    """torchao's float8 training on the eligible Linear layers (`_float8_eligible`), recipe tensorwise or rowwise."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    convert_to_float8_training(
        model,
        config=Float8LinearConfig.from_recipe_name(recipe),
        module_filter_fn=lambda module, fqn: _float8_eligible(module, fqn),
    )


def prepare_lm(model, knobs: dict[str, Any], blocks: list[str] | None = None):
    """The language-model knobs `knobs` sets, applied in place (see the module doc for the order); a knob
    absent (or None) is left as the model has it. Returns the model."""
    if knobs.get("float8") not in (None, "off"):
        to_float8(model, knobs["float8"])
    if knobs.get("liger_kernels"):
        apply_liger(model)
    if knobs.get("attention") is not None:
        set_attention(model, knobs["attention"])
    if knobs.get("activation_checkpointing") is not None:
        checkpoint(model, knobs["activation_checkpointing"], blocks)
    return model


# --- padding-free batches -------------------------------------------------------------------------------------


def flatten(batch):
    """A padded batch (input_ids, attention_mask, labels, other per-token tensors of the same shape) as one row
    of its tokens alone, as transformers' DataCollatorWithFlattening makes one from the texts: `position_ids`
    restarting at 0 for each row's tokens (its document), no attention mask (the model keeps documents apart by
    the positions), and the label of each document's first token ignored (-100: it would be predicted from the
    document before; in the padded batch no token predicts it either), so the loss sees the same (context,
    target) pairs. A batch without an attention mask (already one row, or no padding) is returned as it is."""
    import torch

    mask = batch.get("attention_mask") if hasattr(batch, "get") else None
    if mask is None:
        return batch
    ids = batch["input_ids"]
    if mask.dim() != 2 or mask.shape != ids.shape:
        raise LMKnobError(
            f"padding_free: an attention mask of shape {tuple(mask.shape)} beside input_ids {tuple(ids.shape)}; "
            "a padded batch has one of the same 2-D shape"
        )
    keep = mask.bool()
    lengths = keep.sum(1)
    lengths = lengths[lengths > 0]
    starts = torch.cumsum(lengths, 0) - lengths
    total = int(lengths.sum())
    out = {}
    for key, value in batch.items():
        if key in ("attention_mask", "position_ids"):
            continue
        if not isinstance(value, torch.Tensor) or value.shape != ids.shape:
            raise LMKnobError(
                f"padding_free: the batch's `{key}` is not one value per token (shape "
                f"{tuple(getattr(value, 'shape', ()))}, input_ids {tuple(ids.shape)}): it cannot be flattened"
            )
        out[key] = value[keep][None]
    if "labels" in out:
        out["labels"] = out["labels"].clone()
        out["labels"][0, starts] = IGNORE
    positions = torch.arange(total, device=ids.device) - torch.repeat_interleave(starts, lengths)
    out["position_ids"] = positions[None]
    return out


class Flattening:
    """A collator whose padded batches come out padding-free (`flatten`): what the instrumented Trainer sets
    as its data collator. Picklable (loader workers) when the collator it wraps is."""

    def __init__(self, collator):
        self.collator = collator

    def __call__(self, features):
        return flatten(self.collator(features))
