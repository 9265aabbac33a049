"""What bounds a step: input, overhead, memory bandwidth, compute or communication, with the evidence, and the
facts measured that decide what to try next (loader workers needed, 2x the batch out of memory, threads
oversubscribed, memory near full, the kind of batch). A pure function of a trial's metrics. The moves that
follow are the search's, not the trial's: `autotune.decide.playbook` turns a diagnosis into moves and advice.

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
# diagnosed from that trial's numbers (`Strategy.carry_for`) and its own timed window
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


def diagnose(m: dict[str, float], knobs: dict[str, Any], device, batch_kind: str | None = None) -> dict[str, Any]:
    """`m`: a trial's metrics; `device`: autotune.knobs.Device; `batch_kind`: what the model eats
    (`autotune.workload.batch_kind`). Returns the bottleneck class, the evidence for it (each number with its
    window), and the `facts` the playbook's moves need (`autotune.decide.playbook.advise`): `cuda`, `batch_kind`,
    `workers_needed` (input-bound, sized from the two rates), `batch2x_oom`, `threads_spare` (loader workers and
    intra-op threads oversubscribe a CPU host: the threads that leave each worker a core), `memory_near_full`."""
    cuda = device.type == "cuda"
    evidence: list[str] = []
    cores = int(m.get("host_cpus_per_gpu") or device.cpus)
    if m.get("apart_from_trial") is not None:
        evidence.append(
            f"two sides, 2x probe and op mix: trial #{int(m['apart_from_trial'])}'s, which differs from "
            "this config in loader knobs alone (not measured again)"
        )
    input_bound, need = _input_bound(m, knobs, cores, cuda, evidence)
    overhead_bound = _overhead_bound(m, input_bound, evidence)
    compute = m.get("gpu_compute_kernel_frac" if cuda else "cpu_compute_op_frac")
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
    facts: dict[str, Any] = {"cuda": cuda}
    if batch_kind is not None:
        facts["batch_kind"] = batch_kind
    if need is not None:
        facts["workers_needed"] = need  # the loader sized from the two rates
    if m.get("batch2x_oom"):
        facts["batch2x_oom"] = True  # capacity-bound too
    _host_and_memory(m, knobs, cores, cuda, evidence, facts)
    lm_facts(m, knobs, evidence, facts)
    return {"bottleneck": bottleneck, "evidence": evidence, "facts": facts}


def diagnose_program(m: dict[str, float], knobs: dict[str, Any], cuda: bool) -> dict[str, Any]:
    """A program's trial (its own loop: no two sides, no 2x probe, no profile): waiting on data is all it says of
    the bottleneck (input, else None: not measured); a language model's facts besides (`lm_facts`), which the
    playbook turns into its first moves. `knobs`: what it ran with, its own values included."""
    evidence: list[str] = []
    wait = m.get("data_wait_frac")
    bottleneck = "input" if wait is not None and wait > READER_RATIO_LIMIT else None
    if wait is not None:
        evidence.append(
            f"timed window: waiting on data {wait:.1%} of the step ({'>' if bottleneck else '<='} "
            f"{READER_RATIO_LIMIT:.0%})"
        )
    facts: dict[str, Any] = {"cuda": cuda}
    peak, total = m.get("mem_peak_reserved_gib"), m.get("mem_device_gib")
    if peak and total and peak / total > MEMORY_HIGH:
        facts["memory_near_full"] = True
    lm_facts(m, knobs, evidence, facts)
    return {"bottleneck": bottleneck, "evidence": evidence, "facts": facts}


def bound(diagnosis: dict[str, Any]) -> str:
    """A diagnosis's bottleneck as a reader reads it."""
    b = diagnosis.get("bottleneck")
    return f"{b}-bound" if b else "bottleneck not measured (a program's own loop: no two sides, no profile)"


# a language model's step: the facts its first moves come from (autotune.decide.playbook.lm_moves)
MEMORY_HEADROOM = 0.5  # peak memory under half the device's: room for a larger micro-batch, less checkpointing
SHARES = {"attention": "attention", "lm_head_loss": "the LM head's loss", "optimizer": "the optimizer step"}


def lm_facts(m: dict[str, float], knobs: dict[str, Any], evidence: list[str], facts: dict[str, Any]) -> None:
    """A language model's window (tokens counted): the padding its batches carry (`padding_frac`), the attention
    kernel it runs (`attention`: its own, or the knob's), its peak memory against the device's (CUDA:
    `memory_frac`), and where the profiler puts its step (`share_*`: attention, the LM head's loss, the
    optimizer); each with its evidence line. Nothing for another model."""
    if m.get("tokens_per_s") is None:
        return
    facts["batch_kind"] = "tokens"
    pad = m.get("padding_frac")
    if pad is not None:
        facts["padding_frac"] = round(pad, 4)
        evidence.append(f"timed window: {pad:.0%} of the padded batches' token slots are padding")
    if knobs.get("attention") is not None:
        facts["attention"] = knobs["attention"]
        evidence.append(f"model: attention kernel {knobs['attention']}")
    peak, total = m.get("mem_peak_reserved_gib"), m.get("mem_device_gib")
    if peak and total:
        facts["memory_frac"] = round(peak / total, 4)
        evidence.append(f"peak memory {peak:.1f} of {total:.1f} GiB ({peak / total:.0%})")
    shares = {name: m[f"share_{name}_frac"] for name in SHARES if m.get(f"share_{name}_frac") is not None}
    if shares:
        facts["shares"] = {k: round(v, 4) for k, v in shares.items()}
        evidence.append("profiled window: " + ", ".join(f"{SHARES[k]} {v:.0%}" for k, v in shares.items()))


def _input_bound(m: dict[str, float], knobs: dict[str, Any], cores: int, cuda: bool, evidence: list[str]):
    """Whether the loader bounds the step (the timed window's wait; without one, the two sides' rates), and the
    loader workers the two rates say are needed (None: not measured); the evidence for both appended."""
    wait = m.get("data_wait_frac")  # timed window
    reader = m.get("dataloader_frac")  # profiled window
    judged = wait if wait is not None else reader
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
    ceiling = m.get("compute_ceiling_samples_per_s")
    per_worker = m.get("loader_samples_per_s_per_worker")
    workers = knobs.get("num_workers") or 0
    if ceiling and per_worker:
        capacity = per_worker * max(workers, 1)
        need = min(cores, max(1, math.ceil(ceiling * LOADER_HEADROOM / per_worker)))
        evidence.append(
            f"two sides apart: compute ceiling {ceiling:.0f} samples/s on a cached batch; the loader "
            f"{per_worker:.0f} samples/s per worker, {capacity:.0f} with {max(workers, 1)} "
            f"(about {need} {'worker' if need == 1 else 'workers'} needed, of {cores} CPUs{' per GPU' if cuda else ''})"
        )
        if wait is None and capacity < ceiling / LOADER_HEADROOM:
            input_bound = True  # no timed wait to read: the two rates decide
    return input_bound, need


def _overhead_bound(m: dict[str, float], input_bound: bool, evidence: list[str]) -> bool:
    """Whether a fixed per-step cost dominates (the 2x-batch probe; a GPU mostly idle with the loader keeping up);
    the evidence appended."""
    overhead_bound = False
    ratio = m.get("batch2x_step_ratio")
    if ratio is not None:
        evidence.append(f"2x the batch takes {ratio:.2f}x the compute step (cached batches, no loader)")
        overhead_bound = ratio < BATCH2X_OVERHEAD
    if m.get("batch2x_oom"):
        evidence.append("2x the batch runs out of memory: the batch is at the memory limit")
    util = m.get("gpu_util_frac")
    if util is not None:
        evidence.append(f"profiled window: GPU busy {util:.0%} of the step")
        if util < GPU_UTIL_LOW and not input_bound:
            overhead_bound = True
    return overhead_bound


def _host_and_memory(
    m: dict[str, float], knobs: dict[str, Any], cores: int, cuda: bool, evidence: list[str], facts: dict[str, Any]
) -> None:
    """A CPU host oversubscribed (loader workers beside more intra-op threads than the cores left) and memory near
    full: the evidence and the facts appended."""
    workers = knobs.get("num_workers") or 0
    threads = knobs.get("num_threads") or cores  # torch's default: every core
    if not cuda and workers and threads > (spare := max(1, cores - workers)):  # more threads than cores left
        evidence.append(
            f"host: {workers} loader worker{'s' if workers > 1 else ''} beside {threads} intra-op "
            f"threads on {cores} CPUs (oversubscribed)"
        )
        facts["threads_spare"] = spare
    peak, total = m.get("mem_peak_reserved_gib"), m.get("mem_device_gib")
    if peak and total and peak / total > MEMORY_HIGH:
        evidence.append(f"peak memory {peak:.1f} of {total:.1f} GiB (> {MEMORY_HIGH:.0%})")
        facts["memory_near_full"] = True
