"""The playbook: the moves a performance engineer makes next for each bottleneck, as data (`PLAYBOOK`), and the
advice a diagnosis turns into. The trial diagnoses (`autotune.trial.diagnose`: the bottleneck, its evidence and
the facts measured: workers needed, 2x the batch out of memory, threads oversubscribed, memory near full, the kind
of batch); `advise` turns that into moves (knob, value or direction, why) and the advice lines rendered from them
(`render`), where the trial's result reaches the search (`autotune.execution.trials`), before result.json,
trials.csv, MLflow, the report and best_config.yaml show them. The climb (`autotune.decide.climb`) moves from an
incumbent by the same moves. Pure functions of a diagnosis and the knobs.
"""

from __future__ import annotations

from typing import Any

from autotune import knobs as K
from autotune.trial.diagnose import MEMORY_HEADROOM, MEMORY_HIGH

# The playbook, as data: per bottleneck, the moves in the order a performance
# engineer tries them. `to`: "up" / "down" (the next value of a ladder), a value,
# or a list of values in order of preference; `cuda`: only on a CUDA device;
# `when`: the knob value the move starts from (None: any); `sharding`: only with
# that sharding (a DDP or an FSDP argument); `batch`: only for
# batches of this kind (images: 4-D float/uint8 tensors; tokens: integer ids;
# see autotune.workload.batch_kind; unknown: every move); `with`: other knobs
# moved in the same point (the capacity moves: {"batch_size": "up"}, the batch that
# did not fit, tried with the memory the knob frees; the knob alone is tried after).
# A move with knob None is advice no knob can follow (it is rendered, never searched).
# The knobs that trade speed for memory (checkpointing, Liger's fused loss,
# padding-free rows, the allocator, the micro-batch) are the capacity moves: which
# of them lets a larger micro-batch fit, and whether that is faster, is measured by
# the climb, never assumed.
PLAYBOOK: dict[str, list[dict[str, Any]]] = {
    "input": [
        {"knob": "num_workers", "to": "up", "why": "more DataLoader workers"},
        {
            "knob": "pin_memory",
            "to": True,
            "when": False,
            "cuda": True,
            "why": "pin_memory=True with non_blocking copies",
        },
        {
            "knob": None,
            "batch": "images",
            "why": "cheaper per-sample transforms, or ship uint8 and normalize on the device",
        },
        {
            "knob": None,
            "batch": "tokens",
            "why": "cheaper per-sample work: tokenize ahead of time, pad per batch (collate_fn)",
        },
    ],
    "overhead": [
        {
            "knob": "batch_size",
            "to": "up",
            "why": "a larger batch (changes optimization: scale the learning rate or accumulate gradients)",
        },
        {
            "knob": "compile",
            "to": ["reduce-overhead", "default"],
            "when": "none",
            "cuda": True,
            "why": "torch.compile with mode reduce-overhead (CUDA graphs) to cut per-op overhead",
        },
        {
            "knob": "compile",
            "to": ["default"],
            "when": "none",
            "cuda": False,
            "why": "torch.compile to cut per-op overhead",
        },
        {
            "knob": "fused_optimizer",
            "to": True,
            "when": False,
            "why": "a fused optimizer step (a few kernels for all parameters instead of a few per tensor)",
        },
    ],
    "compute": [
        {
            "knob": "precision",
            "to": ["bf16-mixed", "16-mixed", "tf32"],
            "when": ("32-true", "tf32"),
            "why": "mixed precision (bf16-mixed, or 16-mixed with a GradScaler) for tensor cores",
        },
        {
            "knob": "channels_last",
            "to": True,
            "when": False,
            "batch": "images",
            "why": "channels_last for convolutions (with mixed precision on a GPU)",
        },
        {
            "knob": "cudnn_benchmark",
            "to": True,
            "when": False,
            "cuda": True,
            "why": "cudnn.benchmark to pick the fastest convolution algorithms (fixed shapes)",
        },
        {"knob": "compile", "to": ["default", "max-autotune"], "when": "none", "why": "torch.compile to fuse kernels"},
        {
            "knob": "padding_free",
            "to": True,
            "when": False,
            "batch": "tokens",
            "why": "padding-free rows: no compute spent on padding tokens",
        },
        {
            "knob": "attention",
            "to": ["flash_attention_3", "flash_attention_2", "sdpa", "flex_attention"],
            "when": (None, "eager"),
            "batch": "tokens",
            "why": "a fused attention kernel (FlashAttention, or sdpa's)",
        },
        {
            "knob": "float8",
            "to": ["rowwise", "tensorwise"],
            "when": "off",
            "cuda": True,
            "batch": "tokens",
            "why": "float8 matmuls for the Linear layers (torchao; compute capability 8.9 and up)",
        },
    ],
    "memory": [
        {
            "knob": "compile",
            "to": ["default", "max-autotune"],
            "when": "none",
            "why": "torch.compile to fuse pointwise ops (fewer round trips to memory)",
        },
        {
            "knob": "precision",
            "to": ["bf16-mixed", "16-mixed"],
            "when": ("32-true", "tf32"),
            "why": "mixed precision: half the bytes per activation",
        },
        {
            "knob": "channels_last",
            "to": True,
            "when": False,
            "batch": "images",
            "why": "channels_last: no layout transposes around convolutions",
        },
        {
            "knob": "fused_optimizer",
            "to": True,
            "when": False,
            "why": "a fused optimizer step: one pass over weights, gradients and optimizer state",
        },
        {
            "knob": "liger_kernels",
            "to": True,
            "when": False,
            "cuda": True,
            "batch": "tokens",
            "why": "Liger's fused kernels (RMSNorm, RoPE, SwiGLU, cross-entropy): fewer round trips to memory",
        },
        {
            "knob": "attention",
            "to": ["flash_attention_3", "flash_attention_2", "sdpa"],
            "when": (None, "eager"),
            "batch": "tokens",
            "why": "a fused attention kernel: the attention matrix never written to memory",
        },
        {
            "knob": "padding_free",
            "to": True,
            "when": False,
            "batch": "tokens",
            "why": "padding-free rows: no memory traffic for padding tokens",
        },
    ],
    # multi-rank trials (autotune.trial.ranks): the all-reduce / reduce-scatter the step waits for
    "communication": [
        {
            "knob": "ddp_bucket_cap_mb",
            "to": [100, 50, 5],
            "when": 25,
            "sharding": "ddp",
            "why": "another DDP bucket size (larger: fewer all-reduce calls; smaller: earlier overlap with backward)",
        },
        {
            "knob": "ddp_gradient_as_bucket_view",
            "to": True,
            "when": False,
            "sharding": "ddp",
            "why": "gradients as views into the buckets (no copy into them)",
        },
        {
            "knob": "ddp_static_graph",
            "to": True,
            "when": False,
            "sharding": "ddp",
            "why": "static_graph: DDP plans the buckets once (the same parameters used every step)",
        },
        {
            "knob": "fsdp_reshard_after_forward",
            "to": False,
            "when": True,
            "sharding": "fsdp",
            "why": "keep the gathered parameters from forward to backward (one all-gather fewer per block)",
        },
        {"knob": "batch_size", "to": "up", "why": "a larger per-rank batch: more compute per gradient exchange"},
    ],
    # the batch cannot grow (2x the batch, or the ladder's next batch, ran out of memory): each move frees memory,
    # tried with the batch that did not fit (`with`), then alone
    "capacity": [
        {
            "knob": "activation_checkpointing",
            "to": ["selective", "full"],
            "when": "off",
            "with": {"batch_size": "up"},
            "why": "activation checkpointing (every second repeated block, or every one): recompute in backward, "
            "keep less (a larger batch fits)",
        },
        {
            "knob": "activation_checkpointing",
            "to": ["full"],
            "when": "selective",
            "with": {"batch_size": "up"},
            "why": "activation checkpointing of every repeated block, not every second one (a larger batch fits)",
        },
        {
            "knob": "liger_kernels",
            "to": True,
            "when": False,
            "cuda": True,
            "batch": "tokens",
            "with": {"batch_size": "up"},
            "why": "Liger's fused linear cross-entropy: the logits never held whole (a larger micro-batch fits)",
        },
        {
            "knob": "padding_free",
            "to": True,
            "when": False,
            "batch": "tokens",
            "with": {"batch_size": "up"},
            "why": "padding-free rows: no activations kept for padding (a larger micro-batch fits)",
        },
        {
            "knob": "attention",
            "to": ["flash_attention_3", "flash_attention_2", "sdpa"],
            "when": (None, "eager"),
            "batch": "tokens",
            "with": {"batch_size": "up"},
            "why": "a fused attention kernel: no attention matrix kept for backward (a larger micro-batch fits)",
        },
        {
            "knob": "expandable_segments",
            "to": True,
            "when": False,
            "cuda": True,
            "with": {"batch_size": "up"},
            "why": "expandable allocator segments: less memory lost to fragmentation (a larger batch may fit)",
        },
        {
            "knob": "sharding",
            "to": "fsdp",
            "when": "ddp",
            "why": "FSDP: parameters, gradients and optimizer state sharded over the ranks",
        },
    ],
}
NEAR_FULL = {
    "knob": "batch_size",
    "to": "down",
    "why": "a smaller batch, activation checkpointing or mixed precision to free memory",
}
# a CPU device whose loader workers and intra-op threads outnumber its cores: the training
# process's threads capped so each worker keeps a core (on a CPU-only host often the first
# lever). On jpeg_pipeline, 2 cores, 1 worker, 1 thread instead of 2 measured 1.126x and
# 1.027x with channels_last (two searches), 0.81x without it: a move the climb measures, not a rule
OVERSUBSCRIBED = {"knob": "num_threads", "why": "fewer intra-op threads, so the loader workers keep cores of their own"}
# knobs that change what a step costs on the device, or the memory it holds: after one of them moves, the
# batch ladder is worth climbing again (the step got cheaper, so overhead is back; memory was freed, so a larger
# batch may fit)
STEP_COST_KNOBS = (
    "precision",
    "channels_last",
    "compile",
    "attention",
    "padding_free",
    "liger_kernels",
    "float8",
    "activation_checkpointing",
    "expandable_segments",
)


# A language model's first moves, from what its probe and baseline measured (autotune.trial.diagnose.lm_facts):
# each names the measurement that chose it (`by`, which the live view and the report show) and what it may gain
# (`gain`, the step's throughput ratio the measurement bounds: the rate model's prior where it cannot predict the
# knob, so the climb runs the largest predicted gain per second of trial first: autotune.decide.strategy).
PADDING_FIRST = 0.25  # padding at least this share of the padded token slots: padding-free rows first
SHARE_HIGH = 0.15  # a share of the step at least this large: its kernel's move early
EAGER_ATTENTION = ("eager", "math", None)


def lm_moves(facts: dict[str, Any], knobs: dict[str, Any], cuda: bool) -> list[dict[str, Any]]:
    """A language model's first moves from its measured facts (see above), in the order of their expected gain:
    padding at PADDING_FIRST or more: padding-free rows (and packing, where the space allows it), gaining up to
    the padding's share of the step; an eager (or math) attention: a fused kernel (flash on CUDA, sdpa);
    memory headroom (under half the device's): a larger micro-batch, lighter checkpointing; memory pressure
    (over 90%): Liger's fused loss, selective checkpointing; the LM head's loss or the optimizer a large share
    of the step: Liger's fused loss, a fused optimizer."""
    moves: list[dict[str, Any]] = []
    pad, shares = facts.get("padding_frac"), facts.get("shares") or {}
    if pad is not None and pad >= PADDING_FIRST and not knobs.get("padding_free"):
        by = f"padding {pad:.0%} of the batches' token slots"
        for knob, how in (("padding_free", "padding-free rows"), ("packing", "packed rows")):
            moves.append({"knob": knob, "to": True, "why": f"{how}: no compute spent on padding", "by": by,
                          "gain": 1 / max(1 - pad, 0.2)})  # fmt: skip
    if "attention" in facts and facts["attention"] in EAGER_ATTENTION:
        share = shares.get("attention")
        moves.append({
            "knob": "attention",
            "to": ["flash_attention_3", "flash_attention_2", "sdpa"] if cuda else ["sdpa"],
            "why": "a fused attention kernel (FlashAttention, or sdpa's)",
            "by": f"attention kernel {facts['attention']}" + (f", {share:.0%} of the step" if share else ""),
            "gain": 1 + (share / 2 if share else 0.1),
        })  # fmt: skip
    memory = facts.get("memory_frac")
    if memory is not None and memory < MEMORY_HEADROOM:
        by = f"peak memory {memory:.0%} of the device's"
        moves.append({"knob": "batch_size", "to": "up", "why": "a larger micro-batch: memory to spare", "by": by,
                      "gain": 1.2})  # fmt: skip
        moves.append({"knob": "activation_checkpointing", "to": ["selective", "off"], "why": "lighter activation "
                      "checkpointing: less recomputed in backward", "by": by, "gain": 1.15})  # fmt: skip
    elif memory is not None and memory > MEMORY_HIGH:
        by = f"peak memory {memory:.0%} of the device's"
        moves.append({"knob": "liger_kernels", "to": True, "why": "Liger's fused linear cross-entropy: the logits "
                      "never held whole", "by": by, "gain": 1.1})  # fmt: skip
        moves.append({"knob": "activation_checkpointing", "to": ["selective"], "why": "selective activation "
                      "checkpointing: keep less", "by": by, "gain": 1.05})  # fmt: skip
    if shares.get("lm_head_loss", 0) >= SHARE_HIGH and cuda:
        moves.append({"knob": "liger_kernels", "to": True, "why": "Liger's fused linear cross-entropy",
                      "by": f"the LM head's loss {shares['lm_head_loss']:.0%} of the step",
                      "gain": 1 + shares["lm_head_loss"] / 2})  # fmt: skip
    if shares.get("optimizer", 0) >= SHARE_HIGH:
        moves.append({"knob": "fused_optimizer", "to": True, "why": "a fused optimizer step",
                      "by": f"the optimizer {shares['optimizer']:.0%} of the step",
                      "gain": 1 + shares["optimizer"] / 2})  # fmt: skip
    return sorted(moves, key=lambda mv: -mv["gain"])


def playbook_moves(
    bottleneck: str | None,
    knobs: dict[str, Any],
    cuda: bool,
    batch_kind: str | None = None,
    user_knobs: K.UserKnobs | None = None,
) -> list[dict[str, Any]]:
    """The playbook's moves for a bottleneck, from `knobs`, on a device with or
    without CUDA, for batches of `batch_kind` (moves whose `when` does not hold,
    or meant for another kind of batch, are left out); then the user knobs
    (the search's `user_knobs`) declared with a stage that can relieve this bottleneck."""
    return _moves(bottleneck, knobs, cuda, batch_kind) + user_moves(bottleneck, user_knobs)


def _moves(bottleneck: str | None, knobs: dict[str, Any], cuda: bool, batch_kind: str | None) -> list[dict[str, Any]]:
    """The playbook's own moves for a bottleneck (`playbook_moves` without the user knobs)."""
    out = []
    for move in PLAYBOOK.get(bottleneck or "", []):
        if move.get("cuda") is not None and move["cuda"] != cuda:
            continue
        if batch_kind is not None and move.get("batch") not in (None, batch_kind):
            continue
        if move.get("sharding") not in (None, knobs.get("sharding", "ddp")):  # a DDP or an FSDP setting
            continue
        when = move.get("when")
        if "when" in move and move["knob"] in knobs:
            if knobs[move["knob"]] not in (when if isinstance(when, tuple) else (when,)):
                continue
        out.append({k: v for k, v in move.items() if k in ("knob", "to", "why", "with")})
    return out


def user_moves(bottleneck: str | None, user_knobs: K.UserKnobs | None) -> list[dict[str, Any]]:
    """Moves for the user knobs (workload arguments: the search's `user_knobs`) declared with a stage that
    relieves `bottleneck` (e.g. `gpu_normalize` at stage loader, when input-bound)."""
    return [
        {
            "knob": name,
            "to": "other",
            "why": f"your workload argument `{knob.kwarg}` (declared to act on what bounds a {bottleneck}-bound step)",
        }
        for name, knob in (user_knobs or K.UserKnobs()).items()
        if bottleneck in knob.bottlenecks
    ]


def render(move: dict[str, Any], knobs: dict[str, Any] | None = None) -> str:
    """A move as the advice line a user reads (with the measurement that chose it, a language model's)."""
    line = _render(move, knobs)
    by = move.get("by")
    return f"{line} ({by})" if by and not by.endswith("-bound") else line


def _render(move: dict[str, Any], knobs: dict[str, Any] | None) -> str:
    knob, to, why = move.get("knob"), move.get("to"), move["why"]
    if knob is None or knobs is None or knob not in knobs:
        return why
    if isinstance(to, int) and not isinstance(to, bool):
        now = "torch's default" if knobs[knob] is None else knobs[knob]
        return f"{why} ({knob}={now} now, about {to} needed)"
    if to in ("up", "down") and knob == "num_workers":
        return f"{why} ({knob}={knobs[knob]} now)"
    return why


def advise(diagnosis: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
    """`diagnosis` (a trial's, `autotune.trial.diagnose`) with the moves for it from `knobs` (the trial's, as run)
    and the recommendations rendered from them. The moves are the playbook's for the bottleneck, on the trial's
    device and for its kind of batch, then what the facts measured change: loader workers sized from the two
    rates; capacity-bound too where 2x the batch ran out of memory (no larger batch, the moves that let it
    grow); the intra-op threads first where loader workers and threads oversubscribe the cores; a smaller batch
    last where memory is near full. The user knobs are not advice (the climb adds those declared)."""
    facts = diagnosis.get("facts") or {}
    bottleneck, cuda, batch_kind = diagnosis["bottleneck"], bool(facts.get("cuda")), facts.get("batch_kind")
    moves = _moves(bottleneck, knobs, cuda, batch_kind)
    need = facts.get("workers_needed")
    if bottleneck == "input" and need is not None:
        for move in moves:
            if move["knob"] == "num_workers":
                move["to"] = need  # sized from the two rates, not one step of the ladder
    if facts.get("batch2x_oom"):  # capacity-bound too: the moves that let the batch grow again
        moves = [mv for mv in moves if not _batch_up(mv)] + _moves("capacity", knobs, cuda, batch_kind)
    if facts.get("threads_spare") is not None:
        moves.insert(0, {**OVERSUBSCRIBED, "to": facts["threads_spare"]})
    if facts.get("memory_near_full"):
        moves = [mv for mv in moves if not _batch_up(mv)] + [dict(NEAR_FULL)]
    first = lm_moves(facts, knobs, cuda)  # a language model's: what its padding, kernel, memory and profile say
    moves = first + [
        mv for mv in moves if (mv["knob"], str(mv.get("to"))) not in {(f["knob"], str(f["to"])) for f in first}
    ]
    return {**diagnosis, "moves": moves, "recommendations": [render(mv, knobs) for mv in moves]}


def _batch_up(move: dict[str, Any]) -> bool:
    return move["knob"] == "batch_size" and move["to"] == "up"
