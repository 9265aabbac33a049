"""The online loader tuner's measurements (`autotune.online`): a window of steps (its rate, data wait,
noise from its chunks, the workers' CPU time and PSS, the host's idle cores), windows of one setting merged, the
host readings behind them (/proc through procfs), and a worker's pace read from them (`WorkerPace`). torch-free."""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field

from autotune.host import procfs
from autotune.stats import T95, Z95


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
    pss_read: bool = False  # PSS is read where a decision needs it (OnlineLoader._read_pss), not every window
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
            pss_read=later.pss_read,
            start=self.start,
            host_idle=sum(i * t for i, t in idle) / sum(t for _, t in idle) if idle and wall > 0 else None,
        )

    def read_pss(self, worker_pids: list[int]) -> Window:
        """The job's PSS now (this process and its workers), once: ~10 ms a process from /proc, 96 ms with 8
        workers, ~5% of a 2-s window on the training loop's thread, so it is read where a decision needs it (a
        move up's prediction, a move's two sides: the budget checks and the log line), not at every window."""
        if not self.pss_read:
            self.worker_pss_gib = sum(pss_gib(p) for p in worker_pids)
            self.pss_gib, self.pss_read = pss_gib(os.getpid()) + self.worker_pss_gib, True
        return self

    def describe(self) -> str:
        idle = "" if self.host_idle is None else f", host idle {self.host_idle:.1f} cores"
        return f"{self.rate:.2f}±{self.noise:.2f} steps/s, wait {100 * self.wait_share:.0f}%{idle}"


def between(before: Window, after: Window) -> Window:
    """A setting's window midway in time between two reads of it (`before` and `after` another setting's windows):
    the mean of their rates (the host's speed interpolated to the other setting's time, as a search's reference is,
    autotune.decide.reference), the noise from all their chunks (a drift between the two widens it), their walls."""
    merged = before.merged(after)
    wall = before.wall + after.wall
    merged.steps = round((before.rate + after.rate) / 2 * wall)
    return merged


def window_se(windows: list[Window]) -> float:
    """Standard error of a setting's rate from its windows' rates (0 with fewer than two): the drift from window to
    window, which the chunks inside one window do not show (this 2-core host: a fixed config read 2,200-5,000
    samples/s over tens of seconds, scripts/measurements/cpu-2026-11-27d-online-drift)."""
    rates = [w.rate for w in windows if w.wall > 0]
    return statistics.stdev(rates) / math.sqrt(len(rates)) if len(rates) > 1 else 0.0


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
        "pss_gib": round(w.pss_gib, 3) if w.pss_read else None,
        "steps": w.steps,
        "host_idle_cores": None if w.host_idle is None else round(w.host_idle, 2),
        "wall_s": round(w.wall, 3),
    }


# Fewer workers than the step rate needs, at a worker's slowest recent pace, are not tried, with this headroom: a
# window's rate varies ~10% here, and a worker's pace grows as more share the cores. busy_host (storage latency +
# decode, a CPU hog): 4 workers delivered 10.0 steps/s waiting 48% (0.40 s a batch each), 2 workers 4.2 (0.47 s),
# and at 8 the compute took 15.2 steps/s: 6.1 needed at 0.40, 7.2 at 0.47; without this the moves to 3, 2 and 4
# workers lost 45-72% for their 4-8 s each (the run: 0.66 of the best fixed config), and with 1.2, 7 -> 6 lost 12%
# and its two rebuilds (~3.5 s): that 8-s pair read 0.55.
WORKER_HEADROOM = 1.5
# a pace measured this many windows ago (2 s each by default: 2 min of the run) no longer holds: a host's load changes
# over minutes. Counted in the run's windows, not wall time: a program paused (validation, or the bench's fixed runs
# beside it) ages nothing; by wall time, busy_host's pace expired during its side-by-side and a move to 2 of 7
# workers lost 67% (that pair read 0.55 of the fixed config)
BATCH_TIME_TTL_WINDOWS = 60


class WorkerPace:
    """Seconds one worker takes per batch (the main process's, with none), read where the loader clearly bound a
    window, and what it says: the fewest workers that keep up with the step rate the compute allows."""

    def __init__(self):
        self.windows = 0  # windows closed so far (a pace's age)
        self._pace: tuple[float, int, int] | None = None  # (seconds a batch, the window it was read in, workers)

    def _fresh(self) -> bool:
        return self._pace is not None and self.windows - self._pace[1] <= BATCH_TIME_TTL_WINDOWS

    def learn(self, w: Window, workers: int, wait_floor: float, threshold: float) -> None:
        """A window closed at `workers`. Where the loader clearly bound it (its wait, less the wait floor, over twice
        the threshold: a wait just over it may be the hand-over, too_many's 5% at 4 workers, which read as a pace
        kept 4 workers), its workers delivered its steps: n workers at `rate` batches a second take n / rate seconds
        a batch each (with no workers, the main process loads: its wait per step)."""
        self.windows += 1
        if w.steps and w.rate > 0 and w.wait_share - wait_floor > 2 * threshold:
            pace = workers / w.rate if workers else w.wait / w.steps
            if self._fresh():
                pace = max(pace, self._pace[0])  # the slowest recent pace: it grows as workers share the cores
            self._pace = (pace, self.windows, workers)

    def forget(self, *workers: int) -> None:
        """The pace, where it was read at one of these worker counts (their wait was the hand-over)."""
        if self._pace is not None and self._pace[2] in workers:
            self._pace = None

    def needed(self, w: Window) -> int:
        """The fewest workers that keep up with the step rate the compute allows (`w`'s steps over its time not
        waiting) at the pace, with WORKER_HEADROOM; 0 while the pace is unknown, or older than
        BATCH_TIME_TTL_WINDOWS."""
        if not self._fresh():
            return 0
        demand = w.steps / max(w.wall - w.wait, 1e-9)
        return math.ceil(WORKER_HEADROOM * demand * self._pace[0])
