"""Reading a profile the way a performance engineer does: trace analysis (GPU
utilization, step-time breakdown, reader ratio, H2D copies, tensor-core share),
FLOPs and MFU. Pure Python over a Chrome trace, so it is tested on synthetic
traces; the profiler itself runs in `autotune.trial.measure.profile_window`.
"""

from __future__ import annotations

import re
from typing import Iterable

Interval = tuple[float, float]

# the profiler plugin's order: each instant of a step counts once, for the first
# category active then
BREAKDOWN_ORDER = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec")

# kernel names of tensor-core GEMMs/convolutions (cuBLAS, cuDNN, CUTLASS families);
# a name heuristic, as in the profiler plugin
TENSOR_CORE_KERNEL = re.compile(r"884|1688|16816|hmma|wmma|xmma|gmma|tensorop|_tc_|bf16gemm|f16gemm", re.I)
# matmul/convolution work, on the GPU (kernel names) and the CPU (aten op names)
COMPUTE_KERNEL = re.compile(
    r"gemm|conv|cutlass|cublas|xmma|gmma|hmma|fprop|dgrad|wgrad|winograd|implicit|flash|fmha", re.I
)
COMPUTE_OP = re.compile(
    r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_?convolution(_backward)?|mkldnn_convolution|"
    r"cudnn_convolution|conv\dd|_scaled_dot_product_\w+|scaled_dot_product_attention)$"
)

# where a language model's step goes (torchtitan's and Megatron's MFU tables split it so): attention (its fused
# kernels, or the batched matmuls and softmax of an eager one), the LM head's loss (cross-entropy, its log-softmax:
# over the vocabulary, often the largest activation of the step) and the optimizer (its step's span on the host;
# on a GPU its kernels). Name heuristics, as the profiler plugin's; a share the trace does not show is absent
STEP_SHARES = {
    "attention": re.compile(
        r"scaled_dot_product|flash|fmha|_efficient_attention|flex_attention|^aten::_?softmax$|"
        r"^aten::(bmm|baddbmm)$|attention",
        re.I,
    ),
    "lm_head_loss": re.compile(r"cross_entropy|log_softmax|nll_loss", re.I),
    "optimizer": re.compile(r"^Optimizer\.step#|adam|multi_tensor_apply|_foreach_|sgd", re.I),
}


# --- interval sets (sorted, disjoint) ------------------------------------------


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[list[float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(u: list[Interval]) -> float:
    return sum(e - s for s, e in u)


def intersect(u: list[Interval], v: list[Interval]) -> list[Interval]:
    out, i, j = [], 0, 0
    while i < len(u) and j < len(v):
        s, e = max(u[i][0], v[j][0]), min(u[i][1], v[j][1])
        if s < e:
            out.append((s, e))
        if u[i][1] < v[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(u: list[Interval], v: list[Interval]) -> list[Interval]:
    out = []
    for s, e in u:
        for vs, ve in v:
            if ve <= s or vs >= e:
                continue
            if vs > s:
                out.append((s, vs))
            s = max(s, ve)
            if s >= e:
                break
        if s < e:
            out.append((s, e))
    return out


# --- the trace -------------------------------------------------------------------


def _category(event: dict) -> str | None:
    cat, name = event.get("cat", ""), event.get("name", "")
    if cat == "kernel":
        return "communication" if "nccl" in name.lower() else "kernel"
    if cat == "gpu_memcpy":
        return "memcpy"
    if cat == "gpu_memset":
        return "memset"
    if cat in ("cuda_runtime", "cuda_driver"):
        return "runtime"
    if cat == "user_annotation" and name.startswith("enumerate(DataLoader)"):
        return "dataloader"
    if cat == "cpu_op":
        return "cpu_exec"
    return None


def analyze_trace(trace: dict) -> dict:
    """Per-step figures from a torch.profiler Chrome trace (times in us).

    The window runs from the first `ProfilerStep#` span's start to the later of
    the last step's end and the last GPU activity (kernels of the last step run
    after the host has moved on). Returns fractions of that window, except
    `h2d_ms_per_step` and `step_ms`; GPU figures only when the trace has GPU
    activity (absent, not zero, on a CPU).
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = [
        (e["ts"], e["ts"] + e["dur"])
        for e in events  # the host's step spans (not their GPU-side marks)
        if e.get("name", "").startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"
    ]
    if not steps:
        raise ValueError("trace has no ProfilerStep# spans: profile with a schedule and call prof.step()")
    by_cat: dict[str, list[dict]] = {c: [] for c in BREAKDOWN_ORDER}
    for e in events:
        c = _category(e)
        if c:
            by_cat[c].append(e)
    gpu = by_cat["kernel"] + by_cat["memcpy"] + by_cat["memset"] + by_cat["communication"]
    start = min(s for s, _ in steps)
    end = max([e for _, e in steps] + [e["ts"] + e["dur"] for e in gpu if e["ts"] >= start])
    window = [(start, end)]
    total = end - start

    def union(evs):
        return intersect(merge((e["ts"], e["ts"] + e["dur"]) for e in evs), window)

    covered: list[Interval] = []
    breakdown = {}
    has_gpu = bool(gpu or by_cat["runtime"])
    for c in BREAKDOWN_ORDER if has_gpu else ("dataloader", "cpu_exec"):
        u = union(by_cat[c])
        breakdown[c] = length(subtract(u, covered)) / total
        covered = merge(covered + u)
    breakdown["other"] = length(subtract(window, covered)) / total
    out = {
        "profiled_steps": len(steps),
        "step_ms": total / len(steps) / 1e3,
        "breakdown": breakdown,
        "dataloader_frac": length(union(by_cat["dataloader"])) / total,  # the reader ratio
    }
    ops = by_cat["cpu_exec"]
    op_time = length(union(ops))
    if op_time:
        out["cpu_compute_op_frac"] = length(union(e for e in ops if COMPUTE_OP.match(e["name"]))) / op_time
    kernels = by_cat["kernel"] + by_cat["communication"]
    if kernels:
        kernel_time = sum(k["dur"] for k in kernels)
        out["gpu_util"] = length(union(kernels)) / total
        out["tensor_core_frac"] = sum(k["dur"] for k in kernels if TENSOR_CORE_KERNEL.search(k["name"])) / kernel_time
        out["gpu_compute_kernel_frac"] = (
            sum(k["dur"] for k in kernels if COMPUTE_KERNEL.search(k["name"])) / kernel_time
        )
    if by_cat["memcpy"]:
        h2d = sum(e["dur"] for e in by_cat["memcpy"] if "htod" in e["name"].lower().replace(" ", ""))
        out["h2d_ms_per_step"] = h2d / len(steps) / 1e3
    shares = _step_shares(events, kernels, union, total)
    if shares:
        out["shares"] = shares
    return out


def _step_shares(events: list[dict], kernels: list[dict], union, total: float) -> dict[str, float]:
    """Each of `STEP_SHARES` as a share of the step: of the GPU's kernel time where the trace has kernels, else
    of the profiled window on the host (its ops, and the optimizer step's span). Absent where none matched."""
    out = {}
    for name, pattern in STEP_SHARES.items():
        if kernels:
            busy = sum(k["dur"] for k in kernels)
            part = sum(k["dur"] for k in kernels if pattern.search(k["name"])) / busy
        else:
            host = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation") and pattern.search(e["name"])]
            part = length(union(host)) / total
        if part > 0:
            out[name] = part
    return out


# --- FLOPs and MFU ------------------------------------------------------------------

# Dense peak TFLOP/s per GPU from the vendors' datasheets (no sparsity), by the tensor-core precision a step runs
# in, as nanochat's get_peak_flops keeps them: the first name that matches. No entry (a CPU, an unknown GPU): no
# MFU, never a guess. 32-true has none on purpose: an "fp32" step runs cuDNN convolutions in TF32 and matmuls in
# FP32, no single peak.
PEAK_TFLOPS = (
    (re.compile(r"B200", re.I), {"tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0}),
    (re.compile(r"H100.*NVL", re.I), {"tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (re.compile(r"H100.*(PCIe)", re.I), {"tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    (re.compile(r"H200|H100", re.I), {"tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    (re.compile(r"A100", re.I), {"tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (re.compile(r"L40S", re.I), {"tf32": 183.0, "bf16": 362.05, "fp16": 362.05}),
    (re.compile(r"\bA10\b", re.I), {"tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    (re.compile(r"V100", re.I), {"fp16": 125.0}),
    (re.compile(r"\bL4\b", re.I), {"tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    (re.compile(r"MI300X", re.I), {"tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4}),
)
PRECISION_PEAK_KEY = {"tf32": "tf32", "bf16-mixed": "bf16", "16-mixed": "fp16"}


def peak_tflops(device_name: str, precision: str | None) -> float | None:
    key = PRECISION_PEAK_KEY.get(precision)
    if key is None:
        return None
    for pattern, peaks in PEAK_TFLOPS:
        if pattern.search(device_name):
            return peaks.get(key)
    return None


def flop_metrics(
    flops_per_unit: float, rate: float, device_name: str, precision: str | None, unit: str = "sample"
) -> dict:
    """Achieved TFLOP/s, and MFU where the device's peak for the precision is known. FLOPs are model FLOPs
    (forward + backward): `flops_per_unit` a sample's (as FlopCounterMode counts a batch), or with `unit`
    "token" a token's (autotune.trial.tokens.flops_per_token), at `rate` of them a second."""
    achieved = flops_per_unit * rate / 1e12
    out = {f"flops_per_{unit}": flops_per_unit, "achieved_tflops": achieved}
    peak = peak_tflops(device_name, precision)
    if peak:
        out["mfu"] = achieved / peak
    return out


def profile_metrics(profile: dict, step_ms_mean: float) -> dict[str, float]:
    """A profiled window's numbers as a trial's metrics (`step_ms_mean`: the timed window's step, unprofiled)."""
    out = {f"breakdown_{k}_frac": v for k, v in profile["breakdown"].items()}
    out["dataloader_frac"] = profile["dataloader_frac"]
    out["profiler_overhead_frac"] = profile["step_ms"] / step_ms_mean - 1
    for key in ("gpu_util", "tensor_core_frac", "gpu_compute_kernel_frac", "cpu_compute_op_frac", "h2d_ms_per_step"):
        if key in profile:
            out[key + ("_frac" if key == "gpu_util" else "")] = profile[key]
    for name, share in (profile.get("shares") or {}).items():  # a language model's: attention, LM head/loss, optimizer
        out[f"share_{name}_frac"] = share
    return out
