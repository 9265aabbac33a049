"""The online loader tuner's measurements (`autotune.trial.online`): a window of steps (its rate, data wait,
noise from its chunks, the workers' CPU time and PSS, the host's idle cores), windows of one setting merged, and
the host readings behind them (/proc through procfs). torch-free."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from autotune.trial import procfs
from autotune.trial.measure import T95, Z95


@dataclass
class Window:
    """One measured window: steps (batches yielded), its wall time, the data wait in it, per-chunk rates (for the
    noise), the workers' CPU time and the PSS of the job at its end."""

    steps: int = 0
    wall: float = 0.0
    wait: float = 0.0
    chunks: list = field(default_factory=list)
    worker_cpu: float = 0.0
    main_data_cpu: float = 0.0
    pss_gib: float = 0.0
    worker_pss_gib: float = 0.0
    start: float = 0.0
    host_idle: float | None = None

    @property
    def rate(self) -> float:
        return self.steps / self.wall if self.wall > 0 else 0.0

    @property
    def wait_share(self) -> float:
        return self.wait / self.wall if self.wall > 0 else 0.0

    @property
    def noise(self) -> float:
        """Standard error of the rate, from the spread of its chunks' rates."""
        c = self.chunks
        if len(c) < 2:
            return self.rate * 0.1
        m = sum(c) / len(c)
        return math.sqrt(sum((x - m) ** 2 for x in c) / (len(c) - 1) / len(c))

    @property
    def data_cpu(self) -> float:
        """Cores the data loading used: the workers' CPU time (or the main process's inside next() at 0 workers)."""
        return (self.worker_cpu + self.main_data_cpu) / self.wall if self.wall > 0 else 0.0

    def merged(self, later: Window) -> Window:
        """This window and the `later` one of the same setting, as one (the noise from all their chunks)."""
        wall = self.wall + later.wall
        idle = [(w.host_idle, w.wall) for w in (self, later) if w.host_idle is not None]
        return Window(
            steps=self.steps + later.steps,
            wall=wall,
            wait=self.wait + later.wait,
            chunks=self.chunks + later.chunks,
            worker_cpu=self.worker_cpu + later.worker_cpu,
            main_data_cpu=self.main_data_cpu + later.main_data_cpu,
            pss_gib=later.pss_gib,
            worker_pss_gib=later.worker_pss_gib,
            start=self.start,
            host_idle=sum(i * t for i, t in idle) / sum(t for _, t in idle) if idle and wall > 0 else None,
        )

    def describe(self) -> str:
        idle = "" if self.host_idle is None else f", host idle {self.host_idle:.1f} cores"
        return f"{self.rate:.2f}±{self.noise:.2f} steps/s, wait {100 * self.wait_share:.0f}%{idle}"


def local_ranks() -> int:
    """The ranks of this job on this node (torchrun's LOCAL_WORLD_SIZE; 1 without it)."""
    return max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (from /proc; 0 when it is gone)."""
    proc = procfs.process(pid)
    return proc.cpu_s if proc else 0.0


def pss_gib(pid: int) -> float:
    """Proportional set size (shared pages split between the processes sharing them), psutil or smaps_rollup."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return psutil.Process(pid).memory_full_info().pss / 2**30
        except psutil.Error:  # gone, or not ours to read
            return 0.0
    return (procfs.kib(f"{pid}/smaps_rollup", "Pss") or 0) / 2**20


def host_available_gib() -> float | None:
    """The host's MemAvailable (what can be allocated without swapping), None where /proc/meminfo is absent."""
    available = procfs.kib("meminfo", "MemAvailable")
    return None if available is None else available / 2**20


def host_idle_cores(prev: tuple | None) -> tuple[tuple, float | None]:
    """Idle cores of the host since `prev` (from /proc/stat), and the new mark."""
    v = procfs.host_cpu_ticks()
    if not v:
        return (), None
    mark = (sum(v), v[3] + v[4])
    if not prev:
        return mark, None
    total, idle = mark[0] - prev[0], mark[1] - prev[1]
    cores = os.cpu_count() or 1
    return mark, (cores * idle / total if total > 0 else None)


def t95(df: int) -> float:
    """Student's t, two-sided 95%, for `df` degrees of freedom (a difference of few chunks is a wide one)."""
    return 12.706 if df < 2 else T95.get(df, Z95)


def window_dict(w: Window) -> dict:
    return {
        "steps_per_s": round(w.rate, 3),
        "noise": round(w.noise, 3),
        "data_wait_pct": round(100 * w.wait_share, 1),
        "data_cpu_cores": round(w.data_cpu, 3),
        "pss_gib": round(w.pss_gib, 3),
        "steps": w.steps,
        "host_idle_cores": None if w.host_idle is None else round(w.host_idle, 2),
        "wall_s": round(w.wall, 3),
    }
