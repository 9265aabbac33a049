"""A language model's unit: the tokens a step trains on, counted in its batch, and the FLOPs a token costs.

- `padded(batch)`: the token slots of its `input_ids`, padding included; tokens over them is what a padded batch
  trains on (the window's `padding_frac`: what padding-free rows would not run).
- `count(batch)`: the tokens and sequences of a batch with `input_ids` (None: not a language model's batch). The
  tokens are the non-padding ones: the `attention_mask`'s ones; in a padding-free row (position ids and no mask:
  TRL's `padding_free`, transformers' `DataCollatorWithFlattening`) the lengths of the sequences flattened into it;
  else `labels != -100` where labels are per token; else every id. Counted on whatever device the tensors are on,
  with no host sync: on the host (the built-in trial counts a loader batch before it is moved) each count is an
  int; on the device a 0-d tensor the measured window sums and reads at its end, where the device is synchronized.
- `flops_per_token(model, seq_len)`: a training step's FLOPs per token, as nanoGPT's `estimate_mfu` and torchtitan's
  `get_nparams_and_flops` count them (derived at `flops_per_token`).

Needs torch on call only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

IGNORE_INDEX = -100  # the label of a token the loss leaves out (torch's cross_entropy default, HF's collators')


def count(batch) -> tuple[Any, Any] | None:
    """(tokens, sequences) the batch trains on, or None where it has no `input_ids` (not a language model's batch).
    Each an int for host tensors, a 0-d tensor on the device (see the module doc)."""
    if not isinstance(batch, Mapping) or getattr(batch.get("input_ids"), "shape", None) is None:
        return None
    ids = batch["input_ids"]
    rows = int(ids.shape[0]) if ids.dim() > 1 else 1
    mask, positions, labels = (_array(batch.get(k)) for k in ("attention_mask", "position_ids", "labels"))
    if mask is not None and tuple(mask.shape) == tuple(ids.shape):
        return _plain(mask.sum()), rows
    if positions is not None:  # a padding-free row: sequences restart their positions at 0
        # each sequence of two tokens or more has one position 1 and one position 0; padding to a multiple (TRL's
        # pad_to_multiple_of) is a run of position 0s, each alone: its tokens are not counted
        ones = (positions == 1).sum()
        return _plain((positions > 0).sum() + ones), _plain(ones)
    cu = batch.get("cu_seq_lens_q")
    if cu is not None:  # sequence boundaries alone (cumulative lengths, from 0)
        return _plain(cu[-1]), int(cu.numel()) - 1
    if labels is not None and tuple(labels.shape) == tuple(ids.shape):
        return _plain((labels != IGNORE_INDEX).sum()), rows
    return int(ids.numel()), rows


def padded(batch) -> int | None:
    """The token slots of a batch's `input_ids`, padding included (its numel: what a padded batch costs to run),
    None where it has none. Read off its shape: no sync. With `count`'s tokens, a window's padding fraction."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    return int(ids.numel()) if getattr(ids, "shape", None) is not None else None


def batch_samples(batch) -> int | None:
    """Samples in a batch: the first dimension of its first tensor (None: no tensor). A mapping may be no dict
    (transformers' `BatchEncoding`, what a tokenizer's padding collator returns, is a `UserDict`)."""
    first = batch
    while isinstance(first, (tuple, list, Mapping)) and len(first):
        first = next(iter(first.values())) if isinstance(first, Mapping) else first[0]
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else None


def count_samples(batch) -> int | None:
    """Samples in a batch: its rows (batch_samples); in a batch with position ids and no
    attention mask, its sequences of two tokens or more (one position 1 each). That is a padding-free batch
    (TRL's `packing`, transformers' `DataCollatorWithFlattening`), its sequences flattened into one row: counted
    as rows, it would be one sample whatever it holds. That count is a tensor on the batch's device: the measured
    loop reads it at the window's end, where the device is synchronized anyway (no host sync per step)."""
    if isinstance(batch, Mapping) and "position_ids" in batch and "attention_mask" not in batch:
        return (batch["position_ids"] == 1).sum()
    return batch_samples(batch)


def _array(x):
    """A host tensor as a numpy array (a view), counted in one thread: torch's sum spreads a 64 x 2048 mask over
    its intra-op threads, 6-17 ms a batch on a loaded 2-core host against numpy's 0.17 ms (measured), and the
    built-in trial counts inside its window. A device tensor (or no numpy) as it is."""
    if getattr(getattr(x, "device", None), "type", None) != "cpu":
        return x
    try:
        return x.numpy()
    except (RuntimeError, TypeError):  # no numpy, or a tensor numpy cannot view
        return x


def _plain(x):
    """A host count as an int (no sync: it is on the host); a device tensor as it is."""
    return x if getattr(getattr(x, "device", None), "type", "cpu") != "cpu" else int(x)  # numpy's device: "cpu"


# --- FLOPs per token -----------------------------------------------------------------------------------------------

# Linear layers that name an attention block's query projection (HF's q_proj, BERT's query, torchtitan's wq,
# DistilBERT's q_lin): the block's width is their output features; nanoGPT's c_attn projects q, k and v at once (3x)
QUERY_NAMES = {"q_proj": 1, "query": 1, "wq": 1, "q_lin": 1, "c_attn": 3}


def non_embedding_params(model) -> int:
    """Parameters a token's step multiplies by: all of the model's, less its embedding tables (a lookup, no
    FLOPs), unless a table is also another module's weight (a tied LM head, as nanoGPT's and GPT-2's: its matmul
    counts)."""
    import torch

    embeddings = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters(False)}
    elsewhere = {id(p) for m in model.modules() if not isinstance(m, torch.nn.Embedding) for p in m.parameters(False)}
    return sum(p.numel() for p in model.parameters() if id(p) not in embeddings or id(p) in elsewhere)


def attention_widths(model) -> list[int]:
    """The width (heads x head dim) of each self-attention block: torch's MultiheadAttention, or a module with a
    query projection (QUERY_NAMES). [] where none is found: counted as a model without attention."""
    import torch

    out = []
    for m in model.modules():
        if isinstance(m, torch.nn.MultiheadAttention):
            out.append(int(m.embed_dim))
            continue
        for name, per in QUERY_NAMES.items():
            q = getattr(m, name, None)
            features = getattr(q, "out_features", None) or getattr(q, "nf", None)  # nn.Linear, or GPT-2's Conv1D
            if isinstance(q, torch.nn.Module) and features:
                out.append(int(features) // per)
                break
    return out


def flops_per_token(model, seq_len: float) -> float:
    """A training step's FLOPs per token of `model` at sequence length `seq_len` (fwd + bwd).

    Per token, each weight of a matmul costs one multiply and one add forward (2 FLOPs) and twice that backward
    (the gradients of the input and of the weight: 4 FLOPs): 6 x N, N the non-embedding parameters
    (`non_embedding_params`; norms and biases are counted too, as nanoGPT and torchtitan do: a rounding).
    Attention adds what no parameter carries: a token's query against `seq_len` keys (q.k^T) and its weights over
    `seq_len` values (att.v), each 2 x width x seq_len FLOPs forward, so 4 x width x seq_len forward and 12 x width
    x seq_len with backward, per attention block: 12 x n_layers x d x seq_len summed over the blocks (PaLM's
    appendix B, nanoGPT's `estimate_mfu`: 12*L*H*Q*T; torchtitan: 12*l*h*q*t). A causal mask halves the useful
    part; like both, the full square is counted, so the MFU compares with theirs."""
    return 6.0 * non_embedding_params(model) + 12.0 * sum(attention_widths(model)) * seq_len


def unwrapped(model):
    """The module under torch.compile (`_orig_mod`) and DDP/FSDP1 (`module`) wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None) or (
            getattr(model, "module", None)
            if type(model).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel")
            else None
        )
        if inner is None:
            return model
        model = inner


def flop_metrics(model, metrics: dict[str, float], device_name: str, precision: str | None) -> dict[str, float]:
    """A language model's window (`metrics` with tokens_per_s): FLOPs per token at its mean sequence length,
    achieved TFLOP/s and MFU where the device's peak for `precision` is known (autotune.trial.trace.flop_metrics:
    none on a CPU). {} for a window without tokens or a program that never handed its model over."""
    if model is None or metrics.get("tokens_per_s") is None:
        return {}
    from autotune.trial.trace import flop_metrics as of_rate

    per_token = flops_per_token(unwrapped(model), metrics.get("seq_len_mean") or 0.0)
    return of_rate(per_token, metrics["tokens_per_s"], device_name, precision, unit="token")
