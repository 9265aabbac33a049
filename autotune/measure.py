"""Reading a profile the way a performance engineer does: trace analysis (GPU
utilization, step-time breakdown, reader ratio, H2D copies, tensor-core share),
FLOPs and MFU. Pure Python over a Chrome trace, so it is tested on synthetic
traces; the profiler itself runs in `autotune.trial`.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Iterable

Interval = tuple[float, float]

# the profiler plugin's order: each instant of a step counts once, for the first
# category active then
BREAKDOWN_ORDER = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec")

# kernel names of tensor-core GEMMs/convolutions (cuBLAS, cuDNN, CUTLASS families);
# a name heuristic, as in the profiler plugin
TENSOR_CORE_KERNEL = re.compile(r"884|1688|16816|hmma|wmma|xmma|gmma|tensorop|_tc_|bf16gemm|f16gemm", re.I)
# matmul/convolution work, on the GPU (kernel names) and the CPU (aten op names)
COMPUTE_KERNEL = re.compile(r"gemm|conv|cutlass|cublas|xmma|gmma|hmma|fprop|dgrad|wgrad|winograd|implicit|flash|fmha", re.I)
COMPUTE_OP = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_?convolution(_backward)?|mkldnn_convolution|"
                        r"cudnn_convolution|conv\dd|_scaled_dot_product_\w+|scaled_dot_product_attention)$")


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
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events  # the host's step spans (not their GPU-side marks)
             if e.get("name", "").startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"]
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
        out["gpu_compute_kernel_frac"] = sum(k["dur"] for k in kernels if COMPUTE_KERNEL.search(k["name"])) / kernel_time
    if by_cat["memcpy"]:
        h2d = sum(e["dur"] for e in by_cat["memcpy"] if "htod" in e["name"].lower().replace(" ", ""))
        out["h2d_ms_per_step"] = h2d / len(steps) / 1e3
    return out


# --- FLOPs and MFU ------------------------------------------------------------------

# Dense peak TFLOP/s per GPU from NVIDIA's datasheets, by the tensor-core precision a
# step runs in. No entry: no MFU (never a guess). 32-true has none on purpose: an
# "fp32" step runs cuDNN convolutions in TF32 and matmuls in FP32, no single peak.
PEAK_TFLOPS = (
    (re.compile(r"H100.*(PCIe)", re.I), {"tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    (re.compile(r"H200|H100", re.I), {"tf32": 494.7, "bf16": 989.4, "fp16": 989.4}),
    (re.compile(r"A100", re.I), {"tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (re.compile(r"V100", re.I), {"fp16": 125.0}),
    (re.compile(r"\bL4\b", re.I), {"tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
)
PRECISION_PEAK_KEY = {"tf32": "tf32", "bf16-mixed": "bf16", "16-mixed": "fp16"}


def peak_tflops(device_name: str, precision: str) -> float | None:
    key = PRECISION_PEAK_KEY.get(precision)
    if key is None:
        return None
    for pattern, peaks in PEAK_TFLOPS:
        if pattern.search(device_name):
            return peaks.get(key)
    return None


def flop_metrics(flops_per_sample: float, samples_per_s: float, device_name: str, precision: str) -> dict:
    """Achieved TFLOP/s, and MFU where the device's peak for the precision is known.
    FLOPs are model FLOPs (forward + backward, as FlopCounterMode counts them)."""
    achieved = flops_per_sample * samples_per_s / 1e12
    out = {"flops_per_sample": flops_per_sample, "achieved_tflops": achieved}
    peak = peak_tflops(device_name, precision)
    if peak:
        out["mfu"] = achieved / peak
    return out


# --- measuring a running session (torch imported on call) ---------------------------


class GpuUtilSampler:
    """Samples NVML GPU utilization (what nvidia-smi shows) in a thread, when
    nvidia-ml-py is installed."""

    def __init__(self, enabled: bool, period_s: float = 0.05):
        import threading

        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = None
        if enabled:
            import torch

            try:
                torch.cuda.utilization()
            except Exception:  # no NVML: no samples, the field stays absent
                return
            self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)

    def _run(self, period_s):
        import torch

        while not self._stop.wait(period_s):
            self.samples.append(torch.cuda.utilization())

    def __enter__(self):
        if self._thread:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join()

    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


def percentile(sorted_values: list[float], q: float) -> float:
    i = (len(sorted_values) - 1) * q
    lo, hi = math.floor(i), math.ceil(i)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (i - lo)


def rel_ci95(xs: list[float]) -> float:
    """Half-width of the 95% confidence interval of the mean, relative to the mean."""
    n = len(xs)
    if n < 3:
        return math.inf
    mean = sum(xs) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return 1.96 * std / math.sqrt(n) / mean


@dataclass
class WindowRule:
    """When the timed window stops: at least `min_steps` steps and `min_s` seconds,
    then as soon as the step-time mean is known to within ±`target_ci` (95%), or at
    `max_steps` / `max_s`, whichever comes first.

    With `prune_ms`, a window clearly slower than that stops early (`pruned`),
    decided on elapsed time as well as on the step count, so a window of a few
    slow steps is prunable too: at any step, a mean step (one step, even) above
    `hopeless_factor` x prune_ms; once the window has run `min_s`, a mean step
    above `slow_factor` x prune_ms; every 10 steps and at the caps, a step-time
    mean (from 9 step times on) whose 95% CI lies wholly above prune_ms."""

    min_steps: int = 30
    min_s: float = 1.0
    target_ci: float = 0.02
    max_steps: int = 3000
    max_s: float = 30.0
    prune_ms: float | None = None  # stop early once the mean step time is clearly above this
    slow_factor: float = 1.5
    hopeless_factor: float = 4.0
    pruned: bool = False

    def done(self, steps: int, elapsed: float, step_times) -> bool:
        capped = steps >= self.max_steps or elapsed >= self.max_s
        if self.prune_ms and self._clearly_slow(steps, elapsed, step_times, check_ci=capped or steps % 10 == 0):
            self.pruned = True
            return True
        if capped:
            return True
        if steps % 10 or steps < min(self.min_steps, 10):
            return False
        if steps < self.min_steps or elapsed < self.min_s:
            return False
        return rel_ci95(step_times()) <= self.target_ci

    def _clearly_slow(self, steps: int, elapsed: float, step_times, check_ci: bool) -> bool:
        mean_ms = elapsed / steps * 1e3  # the host clock over the steps run (on a GPU it runs ahead: never too high)
        if mean_ms > self.hopeless_factor * self.prune_ms:
            return True
        if elapsed >= self.min_s and mean_ms > self.slow_factor * self.prune_ms:
            return True
        if check_ci:
            times = step_times()
            return len(times) >= 9 and sum(times) / len(times) * (1 - rel_ci95(times)) > self.prune_ms
        return False


def timed_window(session, batches, rule: WindowRule) -> dict[str, float]:
    """Time steps between two device syncs. The host clock decides when to stop
    (no sync in the loop); per-step times are CUDA events on a GPU (read when
    complete, no sync) and host intervals on a CPU."""
    import torch

    from autotune.workload import count_samples

    cuda = session.device.type == "cuda"
    sync = session.sync
    clock = time.perf_counter
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    events, starts, data_wait, samples = [], [], 0.0, 0

    def step_times() -> list[float]:  # ms, of the steps known to be complete
        if not cuda:
            return [(b - a) * 1e3 for a, b in zip(starts, starts[1:])]
        done = 0
        while done < len(events) and events[done].query():
            done += 1
        return [events[i].elapsed_time(events[i + 1]) for i in range(done - 1)]

    from autotune.disturbance import CpuWatch, gpu_other_processes

    outside = CpuWatch()  # load from outside the trial during the window
    with GpuUtilSampler(enabled=cuda) as util:
        sync()
        outside.start()
        t0, cpu0 = clock(), time.process_time()
        while not starts or not rule.done(len(starts), clock() - t0, step_times):
            starts.append(clock())
            batch = next(batches)
            data_wait += clock() - starts[-1]
            samples += count_samples(session.workload, batch)
            if cuda:
                events.append(torch.cuda.Event(enable_timing=True))
                events[-1].record()
            loss = session.step(batch)
        if cuda:
            events.append(torch.cuda.Event(enable_timing=True))
            events[-1].record()
        sync()
        window = clock() - t0
        cpu = time.process_time() - cpu0
        disturbed = outside.stop(window)
    steps = len(starts)
    if cuda:
        steps_ms = [events[i].elapsed_time(events[i + 1]) for i in range(steps)]
    else:
        steps_ms = [(b - a) * 1e3 for a, b in zip(starts, starts[1:] + [t0 + window])]
    ordered = sorted(steps_ms)
    mean_ms = sum(steps_ms) / steps
    metrics = {
        "samples_per_s": samples / window,
        "steps_per_s": steps / window,
        "step_ms_mean": window / steps * 1e3,
        "step_ms_p50": percentile(ordered, 0.5),
        "step_ms_p95": percentile(ordered, 0.95),
        "step_ms_min": ordered[0],
        "step_ms_max": ordered[-1],
        "step_time_cv": math.sqrt(sum((x - mean_ms) ** 2 for x in steps_ms) / max(steps - 1, 1)) / mean_ms,
        "step_mean_ci95": rel_ci95(steps_ms),
        "data_wait_frac": data_wait / window,
        "cpu_main_cores": cpu / window,  # CPU-seconds per second of the training process (not its workers)
        "window_s": window,
        "window_steps": steps,
        "loss_last": float(loss.detach().float()),
        **disturbed,  # host_other_cpu_frac
    }
    if cuda:
        others = gpu_other_processes(session.device.index or 0)
        if others is not None:
            metrics["gpu_other_processes"] = others
        metrics["mem_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        metrics["mem_peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        metrics["mem_device_gib"] = torch.cuda.get_device_properties(session.device).total_memory / 2**30
        if util.mean() is not None:
            metrics["gpu_util_nvml_pct"] = util.mean()
    return metrics


def profile_window(session, batches, active_steps: int, trace_path: str) -> dict:
    """A separate, short profiled window (wait 1, warm-up 1, active N steps); the
    Chrome trace is written to `trace_path` and analyzed. The device is
    synchronized at both ends of the active steps, as in the timed window: the
    first step carries no earlier step's kernels, and the last steps' kernels
    finish before the profiler stops."""
    import json

    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if session.device.type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=active_steps),
                 on_trace_ready=lambda p: p.export_chrome_trace(trace_path)) as prof:
        for i in range(active_steps + 2):
            session.step(next(batches))
            if i in (1, active_steps + 1):  # the ends of the active window
                session.sync()
            prof.step()
    with open(trace_path) as f:
        return analyze_trace(json.load(f))


def count_flops(session, batch) -> float:
    """Forward + backward FLOPs of one batch (torch.utils.flop_counter), run on
    the uncompiled module; the gradients are cleared after."""
    from torch.utils.flop_counter import FlopCounterMode

    from autotune import knobs as K

    model = getattr(session.model, "_orig_mod", session.model)
    batch = session.device_batch(batch)
    with FlopCounterMode(display=False) as counter:
        with K.autocast(session.knobs, session.device.type):
            loss = session.workload.loss(model, batch)
        loss.backward()
    session.optimizer.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


# --- the two sides apart: compute on a cached batch, the loader without a model ------


def host_cpus_per_gpu(cpus: int) -> int:
    """The host's CPUs per GPU: what the loader workers of one GPU's trial may use
    (NVML counts every GPU of the host, even where CUDA_VISIBLE_DEVICES hides some)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        gpus = pynvml.nvmlDeviceGetCount()
    except Exception:  # no NVML: the GPUs this process sees
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return max(1, cpus // gpus) if gpus else cpus


def compute_ceiling(session, batch, min_steps: int = 10, min_s: float = 0.5, max_s: float = 5.0) -> dict[str, float]:
    """The compute side alone: training steps on one batch cached on the device
    (no loader, no host-to-device copy), synchronized at the window's ends only.
    The batch has the timed window's shape, so a compiled model is not compiled
    again. What the step would reach if the loader were infinitely fast."""
    from autotune import knobs as K
    from autotune.workload import count_samples

    cached = K.to_device(batch, session.device, non_blocking=False)
    samples = count_samples(session.workload, batch)
    session.step(cached)  # the copy and any lazy allocation, untimed
    session.sync()
    steps, t0 = 0, time.perf_counter()
    while steps < min_steps or time.perf_counter() - t0 < min_s:
        session.step(cached)
        steps += 1
        if time.perf_counter() - t0 >= max_s:
            break
    session.sync()
    elapsed = time.perf_counter() - t0
    return {"compute_ceiling_samples_per_s": steps * samples / elapsed, "compute_ceiling_step_ms": elapsed / steps * 1e3}


def loader_rate(workload, batch_size: int, seed: int = 0, max_batch: int = 32, min_batches: int = 3,
                min_s: float = 0.5, max_s: float = 3.0, max_batches: int = 200) -> dict[str, float]:
    """The input side alone: one loader worker's rate, without a model. Batches
    are made in this process as a worker makes them (one torch thread: DataLoader
    workers run with one), at a batch of at most `max_batch` (per-sample work does
    not depend on the batch; a small one keeps the probe short), for `min_s` to
    `max_s` seconds or `max_batches` batches."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    batch = min(batch_size, max_batch)
    sampler = RandomSampler(workload.dataset, num_samples=(max_batches + 1) * batch,
                            generator=torch.Generator().manual_seed(seed + 2))
    loader = DataLoader(workload.dataset, batch_size=batch, sampler=sampler, num_workers=0,
                        collate_fn=workload.collate_fn, drop_last=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        batches = iter(loader)
        next(batches)  # lazy dataset set-up, untimed
        n, t0 = 0, time.perf_counter()
        for _ in batches:
            n += 1
            elapsed = time.perf_counter() - t0
            if (n >= min_batches and elapsed >= min_s) or elapsed >= max_s:
                break
        elapsed = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    per_worker = n * batch / elapsed
    return {"loader_samples_per_s_per_worker": per_worker, "loader_batches_per_s_per_worker": per_worker / batch_size}


def two_sides(session, batch, device, seed: int = 0) -> dict[str, float]:
    """The compute ceiling, one loader worker's rate and the host's CPUs per GPU:
    a bottleneck as a comparison of two measured rates (autotune.diagnose)."""
    out = compute_ceiling(session, batch)
    out.update(loader_rate(session.workload, session.knobs["batch_size"], seed))
    out["host_cpus_per_gpu"] = float(host_cpus_per_gpu(device.cpus) if device.type == "cuda" else device.cpus)
    return out
