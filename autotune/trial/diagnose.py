"""What bounds a step: input, overhead, memory bandwidth or compute, with the
evidence and the moves a performance engineer makes next (PLAYBOOK.md). The
playbook is data (`PLAYBOOK`): the diagnosis returns moves (knob, value or
direction, why); the search strategy takes its moves from there, and the advice
text in MLflow, the report and best_config.yaml is rendered from the same moves
(`render`). Pure functions of a trial's metrics.

Which window each number comes from (the evidence says so):
- timed: the timed window, profiler off (`data_wait_frac`: the share of the
  window spent waiting on the loader). Input-boundness is judged here: the
  profiler slows small-batch steps by 50-65%, so under profiling the loader
  keeps up and the profiled reader ratio under-reports the wait.
- profiled: the separate profiled window (`dataloader_frac`, GPU busy,
  kernel mix): supporting evidence, and the only source of the kernel mix.
- two sides apart (`measure.compute_ceiling`, `measure.loader_rate`): the step
  on a cached batch already on the device (no loader), and the loader alone
  (no model, one worker). Their ratio sizes the loader: workers needed is
  about ceiling / per-worker rate, within the host's CPUs per GPU.
"""

from __future__ import annotations

import math
from typing import Any

READER_RATIO_LIMIT = 0.05  # waiting on data > 5% of the step: input-bound
GPU_UTIL_LOW = 0.5  # GPU busy < 50% of the step: grow the batch
BATCH2X_OVERHEAD = 1.5  # 2x the batch costs < 1.5x the step time: a fixed per-step cost dominates
COMPUTE_SHARE = 0.5  # matmul/conv >= 50% of device time: compute-bound, else memory-bound
MEMORY_HIGH = 0.9  # peak memory > 90% of the device
COMM_SHARE = 0.2  # gradient synchronization exposed > 20% of a multi-rank step: communication-bound
LOADER_HEADROOM = 1.2  # size the loader for 20% above the compute ceiling (workers are not perfectly parallel)
# what a diagnosis measures apart from the timed window: the compute side on a cached batch (its ceiling, the
# 2x-batch probe, the profiled op mix) and one loader worker's rate. None of it depends on the loader knobs
# (workers, pinning, prefetch, persistence), so a config that differs from a diagnosed one in those alone is
# diagnosed from that trial's numbers (`carried`) and its own timed window
APART = (
    "compute_ceiling_samples_per_s",
    "compute_ceiling_step_ms",
    "loader_samples_per_s_per_worker",
    "host_cpus_per_gpu",
    "batch2x_step_ratio",
    "batch2x_oom",
    "cpu_compute_op_frac",
    "gpu_compute_kernel_frac",
    "tensor_core_frac",
)

# The playbook, as data: per bottleneck, the moves in the order a performance
# engineer tries them. `to`: "up" / "down" (the next value of a ladder), a value,
# or a list of values in order of preference; `cuda`: only on a CUDA device;
# `when`: the knob value the move starts from (None: any); `sharding`: only with
# that sharding (a DDP or an FSDP argument); `batch`: only for
# batches of this kind (images: 4-D float/uint8 tensors; tokens: integer ids;
# see autotune.workload.batch_kind; unknown: every move). A move with knob None
# is advice no knob can follow (it is rendered, never searched).
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
    ],
    # multi-rank trials (autotune.ranks): the all-reduce / reduce-scatter the step waits for
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
    # the batch cannot grow (2x the batch, or the ladder's next batch, ran out of memory)
    "capacity": [
        {
            "knob": "activation_checkpointing",
            "to": True,
            "when": False,
            "why": "activation checkpointing per repeated block: recompute in backward, keep less (a larger batch fits)",
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
# process's threads capped so each worker keeps a core (PLAYBOOK.md: on a CPU-only host often
# the first lever). On jpeg_pipeline, 2 cores, 1 worker, 1 thread instead of 2 measured 1.126x and
# 1.027x with channels_last (two searches), 0.81x without it: a move the climb measures, not a rule
OVERSUBSCRIBED = {"knob": "num_threads", "why": "fewer intra-op threads, so the loader workers keep cores of their own"}
# knobs that change what a step costs on the device: after one of them moves, the
# batch ladder is worth climbing again (the step got cheaper, so overhead is back)
STEP_COST_KNOBS = ("precision", "channels_last", "compile")


def playbook_moves(
    bottleneck: str | None, knobs: dict[str, Any], cuda: bool, batch_kind: str | None = None
) -> list[dict[str, Any]]:
    """The playbook's moves for a bottleneck, from `knobs`, on a device with or
    without CUDA, for batches of `batch_kind` (moves whose `when` does not hold,
    or meant for another kind of batch, are left out); then the user knobs
    declared with a stage that can relieve this bottleneck."""
    out = []
    for move in PLAYBOOK.get(bottleneck or "", []):
        if move.get("cuda") is not None and move["cuda"] != cuda:
            continue
        if batch_kind is not None and move.get("batch") not in (None, batch_kind):
            continue
        if move.get("sharding") not in (None, knobs.get("sharding", "ddp")):  # a DDP or an FSDP setting
            continue
        when = move.get("when")
        if when is not None and move["knob"] in knobs:
            if knobs[move["knob"]] not in (when if isinstance(when, tuple) else (when,)):
                continue
        out.append({k: v for k, v in move.items() if k in ("knob", "to", "why")})
    return out + user_moves(bottleneck)


def user_moves(bottleneck: str | None) -> list[dict[str, Any]]:
    """Moves for the user knobs (workload arguments) declared with a stage that
    relieves `bottleneck` (e.g. `gpu_normalize` at stage loader, when input-bound)."""
    from autotune.knobs import USER

    return [
        {
            "knob": name,
            "to": "other",
            "why": f"your workload argument `{knob.kwarg}` (declared to act on what bounds a {bottleneck}-bound step)",
        }
        for name, knob in USER.items()
        if bottleneck in knob.bottlenecks
    ]


def render(move: dict[str, Any], knobs: dict[str, Any] | None = None) -> str:
    """A move as the advice line a user reads."""
    knob, to, why = move.get("knob"), move.get("to"), move["why"]
    if knob is None or knobs is None or knob not in knobs:
        return why
    if isinstance(to, int) and not isinstance(to, bool):
        now = "torch's default" if knobs[knob] is None else knobs[knob]
        return f"{why} ({knob}={now} now, about {to} needed)"
    if to in ("up", "down") and knob == "num_workers":
        return f"{why} ({knob}={knobs[knob]} now)"
    return why


def diagnose(m: dict[str, float], knobs: dict[str, Any], device, batch_kind: str | None = None) -> dict[str, Any]:
    """`m`: a trial's metrics; `device`: autotune.knobs.Device. Returns the
    bottleneck class, the evidence for it (each number with its window), the
    moves (knob, to, why) and the recommendations rendered from them."""
    cuda = device.type == "cuda"
    evidence: list[str] = []
    wait = m.get("data_wait_frac")  # timed window
    reader = m.get("dataloader_frac")  # profiled window
    util = m.get("gpu_util_frac")
    ratio = m.get("batch2x_step_ratio")
    compute = m.get("gpu_compute_kernel_frac" if cuda else "cpu_compute_op_frac")
    ceiling = m.get("compute_ceiling_samples_per_s")
    per_worker = m.get("loader_samples_per_s_per_worker")

    judged = wait if wait is not None else reader
    if m.get("apart_from_trial") is not None:
        evidence.append(
            f"two sides, 2x probe and op mix: trial #{int(m['apart_from_trial'])}'s, which differs from "
            "this config in loader knobs alone (not measured again)"
        )
    input_bound = judged is not None and judged > READER_RATIO_LIMIT
    if wait is not None:
        evidence.append(
            f"timed window: waiting on data {wait:.1%} of the step"
            f" ({'>' if input_bound else '<='} {READER_RATIO_LIMIT:.0%})"
        )
    if reader is not None:
        line = f"profiled window: data loading {reader:.1%} of the step"
        if wait is not None and wait > READER_RATIO_LIMIT >= reader:
            line += " (the profiler slows each step, so there the loader keeps up)"
        evidence.append(line)
    need = None
    workers, cores = knobs.get("num_workers") or 0, int(m.get("host_cpus_per_gpu") or device.cpus)
    if ceiling and per_worker:
        capacity = per_worker * max(workers, 1)
        need = min(cores, max(1, math.ceil(ceiling * LOADER_HEADROOM / per_worker)))
        evidence.append(
            f"two sides apart: compute ceiling {ceiling:.0f} samples/s on a cached batch; the loader "
            f"{per_worker:.0f} samples/s per worker, {capacity:.0f} with {max(workers, 1)} "
            f"(about {need} {'worker' if need == 1 else 'workers'} needed, of {cores} CPUs per GPU)"
        )
        if wait is None and capacity < ceiling / LOADER_HEADROOM:
            input_bound = True  # no timed wait to read: the two rates decide
    overhead_bound = False
    if ratio is not None:
        evidence.append(f"2x the batch takes {ratio:.2f}x the compute step (cached batches, no loader)")
        overhead_bound = ratio < BATCH2X_OVERHEAD
    if m.get("batch2x_oom"):
        evidence.append("2x the batch runs out of memory: the batch is at the memory limit")
    if util is not None:
        evidence.append(f"profiled window: GPU busy {util:.0%} of the step")
        if util < GPU_UTIL_LOW and not input_bound:
            overhead_bound = True
    if compute is not None:
        evidence.append(
            f"profiled window: matmul/convolution {compute:.0%} of {'GPU kernel' if cuda else 'CPU op'} time"
        )
    if "mfu" in m:
        evidence.append(f"MFU {m['mfu']:.1%}")
    comm = m.get("comm_frac")
    if comm is not None:
        evidence.append(
            f"timed windows: gradient synchronization exposed {comm:.0%} of the step "
            f"({m['step_ms_mean']:.1f} ms synced, {m['step_ms_unsynced']:.1f} ms without)"
        )

    if input_bound:
        bottleneck = "input"
    elif comm is not None and comm > COMM_SHARE:
        bottleneck = "communication"
    elif overhead_bound:
        bottleneck = "overhead"
    elif compute is not None and compute < COMPUTE_SHARE:
        bottleneck = "memory"
    else:
        bottleneck = "compute"
        tc = m.get("tensor_core_frac")
        cc = device.capability or (0, 0)
        if cuda and cc >= (7, 0) and knobs.get("precision") in ("32-true", "tf32") and (tc is None or tc < 0.05):
            evidence.append("no tensor-core kernels" if tc is not None else "tensor-core use unknown")
    moves = playbook_moves(bottleneck, knobs, cuda, batch_kind)
    if bottleneck == "input" and need is not None:
        for move in moves:
            if move["knob"] == "num_workers":
                move["to"] = need  # sized from the two rates, not one step of the ladder
    if m.get("batch2x_oom"):  # capacity-bound too: the moves that let the batch grow again
        moves = [mv for mv in moves if not (mv["knob"] == "batch_size" and mv["to"] == "up")]
        moves += playbook_moves("capacity", knobs, cuda, batch_kind)
    threads = knobs.get("num_threads") or cores  # torch's default: every core
    if not cuda and workers and threads > (spare := max(1, cores - workers)):  # more threads than cores left
        evidence.append(
            f"host: {workers} loader worker{'s' if workers > 1 else ''} beside {threads} intra-op "
            f"threads on {cores} CPUs (oversubscribed)"
        )
        moves.insert(0, {**OVERSUBSCRIBED, "to": spare})
    peak, total = m.get("mem_peak_reserved_gib"), m.get("mem_device_gib")
    if peak and total and peak / total > MEMORY_HIGH:
        evidence.append(f"peak memory {peak:.1f} of {total:.1f} GiB (> {MEMORY_HIGH:.0%})")
        moves = [mv for mv in moves if not (mv["knob"] == "batch_size" and mv["to"] == "up")] + [dict(NEAR_FULL)]
    return {
        "bottleneck": bottleneck,
        "evidence": evidence,
        "moves": moves,
        "recommendations": [render(mv, knobs) for mv in moves],
    }
