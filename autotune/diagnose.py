"""What bounds a step: input, overhead, memory bandwidth or compute, with the
evidence and what to try, in the style of the profiler plugin's recommendations
(PLAYBOOK.md). Pure functions of a trial's metrics."""

from __future__ import annotations

from typing import Any

READER_RATIO_LIMIT = 0.05  # data loading > 5% of the step: input-bound
GPU_UTIL_LOW = 0.5  # GPU busy < 50% of the step: grow the batch
BATCH2X_OVERHEAD = 1.5  # 2x the batch costs < 1.5x the step time: a fixed per-step cost dominates
COMPUTE_SHARE = 0.5  # matmul/conv >= 50% of device time: compute-bound, else memory-bound
MEMORY_HIGH = 0.9  # peak memory > 90% of the device


def diagnose(m: dict[str, float], knobs: dict[str, Any], device) -> dict[str, Any]:
    """`m`: a trial's metrics; `device`: autotune.knobs.Device. Returns the
    bottleneck class, the evidence for it and recommendations."""
    cuda = device.type == "cuda"
    evidence, recs = [], []
    reader = m.get("dataloader_frac", m.get("data_wait_frac", 0.0))
    util = m.get("gpu_util_frac")
    ratio = m.get("batch2x_step_ratio")
    compute = m.get("gpu_compute_kernel_frac" if cuda else "cpu_compute_op_frac")

    input_bound = reader > READER_RATIO_LIMIT
    if input_bound:
        evidence.append(f"data loading takes {reader:.1%} of the step (> {READER_RATIO_LIMIT:.0%})")
        recs.append(f"more DataLoader workers (num_workers={knobs['num_workers']} now)")
        if cuda and not knobs["pin_memory"]:
            recs.append("pin_memory=True with non_blocking copies")
        recs.append("cheaper per-sample transforms, or ship uint8 and normalize on the device")
    overhead_bound = False
    if ratio is not None:
        evidence.append(f"2x the batch takes {ratio:.2f}x the step time")
        overhead_bound = ratio < BATCH2X_OVERHEAD
    if m.get("batch2x_oom"):
        evidence.append("2x the batch runs out of memory: the batch is at the memory limit")
    if util is not None:
        evidence.append(f"GPU busy {util:.0%} of the step")
        if util < GPU_UTIL_LOW and not input_bound:
            overhead_bound = True
    if overhead_bound and not input_bound:
        recs.append("a larger batch (changes optimization: scale the learning rate or accumulate gradients)")
        recs.append("torch.compile" + (" with mode reduce-overhead (CUDA graphs)" if cuda else "") + " to cut per-op overhead")
    if compute is not None:
        evidence.append(f"matmul/convolution {compute:.0%} of {'GPU kernel' if cuda else 'CPU op'} time")
    if "mfu" in m:
        evidence.append(f"MFU {m['mfu']:.1%}")

    if input_bound:
        bottleneck = "input"
    elif overhead_bound:
        bottleneck = "overhead"
    elif compute is not None and compute < COMPUTE_SHARE:
        bottleneck = "memory"
        recs.append("torch.compile to fuse pointwise ops (fewer round trips to memory)")
    else:
        bottleneck = "compute"
        tc = m.get("tensor_core_frac")
        cc = device.capability or (0, 0)
        if cuda and cc >= (7, 0) and knobs["precision"] in ("32-true", "tf32") and (tc is None or tc < 0.05):
            evidence.append("no tensor-core kernels" if tc is not None else "tensor-core use unknown")
            recs.append("mixed precision (bf16-mixed, or 16-mixed with a GradScaler) for tensor cores")
        if not knobs["channels_last"]:
            recs.append("channels_last for convolutions (with mixed precision on a GPU)")

    peak, total = m.get("mem_peak_reserved_gib"), m.get("mem_device_gib")
    if peak and total and peak / total > MEMORY_HIGH:
        evidence.append(f"peak memory {peak:.1f} of {total:.1f} GiB (> {MEMORY_HIGH:.0%})")
        recs.append("a smaller batch, activation checkpointing or mixed precision to free memory")
    return {"bottleneck": bottleneck, "evidence": evidence, "recommendations": recs}
