"""Was a timed window disturbed? Load from outside the trial (another search,
a build, a notebook) slows the steps it shares the machine with, and the trial's
figure then says nothing about its knobs. Measured, not assumed: the host's busy
CPU time during the window less the trial's own (its process and its loader
workers; every rank of a multi-rank trial), as a share of the host's CPU capacity; on a GPU, other processes on the
device (NVML). Linux /proc only; elsewhere nothing is reported."""

from __future__ import annotations

import os

from autotune.host import procfs

OTHER_CPU_LIMIT = 0.25  # others used more than a quarter of the host's CPU time: disturbed
TRIAL_PID = "AUTOTUNE_TRIAL_PID"  # set in a rank the trial process forked (autotune.trial.ranks): that process


def _host_busy_s() -> float | None:
    ticks = procfs.host_cpu_ticks()
    if not ticks:
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / procfs.TICK  # user..steal; guest time is already in user


def _tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and its descendants (the loader workers)."""
    procs = procfs.processes()
    return sum(procs[p].cpu_s for p in procfs.descendants(root, procs) if p in procs)


def trial_root() -> int:
    """The process whose tree is the trial: this one, or, in a rank the trial
    process forked (autotune.trial.ranks), the trial process, so the other ranks of the
    same trial count as its own CPU, not as load from outside."""
    return int(os.environ.get(TRIAL_PID) or os.getpid())


class CpuWatch:
    """`start()` at the window's start, `stop(window_s)` at its end."""

    def start(self) -> None:
        self.root = trial_root()
        self.host0, self.own0 = _host_busy_s(), _tree_cpu_s(self.root)

    def stop(self, window_s: float) -> dict[str, float]:
        host1, own1 = _host_busy_s(), _tree_cpu_s(self.root)
        if self.host0 is None or host1 is None or window_s <= 0:
            return {}
        other = max(0.0, (host1 - self.host0) - (own1 - self.own0))  # /proc/stat counts every CPU of the host
        return {"host_other_cpu_frac": other / (window_s * (os.cpu_count() or 1))}


def gpu_other_processes(device_index: int = 0) -> int | None:
    """Processes on the GPU that are not this trial's (None without NVML)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:
        return None
    return sum(1 for p in procs if p.pid != os.getpid())


def verdict(metrics: dict[str, float], device_type: str = "cpu") -> str | None:
    """Why a window's figure is suspect, or None. On a GPU the device decides
    (other processes on it): trials on the other GPUs of a host share its CPUs by
    design, each within its reservation; the CPU share is still recorded."""
    other = metrics.get("host_other_cpu_frac")
    reasons = []
    if device_type == "cpu" and other is not None and other > OTHER_CPU_LIMIT:
        reasons.append(f"other processes used {other:.0%} of the host's CPU time during the window")
    if metrics.get("gpu_other_processes"):
        reasons.append(f"{int(metrics['gpu_other_processes'])} other process(es) on the GPU")
    return "; ".join(reasons) or None
