"""Memory in use on the CPU: the C allocator's bytes in use (glibc `mallinfo2`,
through ctypes), sampled by a thread, its peak over a short memory window of its
own, and the forced memory limit (`memory_limit_gib`) checked against it.

Why not peak RSS alone: a CPU process's RSS is mostly what activations do not
touch. Measured on tiny_transformer (batch 32, seq_len 256, dim 64, 4 layers, one
thread): RSS 0.79 GiB before a step, of which 0.14 GiB in use by the allocator
(weights, gradients, AdamW state); the rest is torch's libraries and pages glibc
keeps after warm-up's frees. A step's activations (0.09 GiB) then move the
window's peak RSS by 5%, checkpointing's saving (0.05 GiB) by less. The
allocator's bytes in use move by the activations themselves: 0.23 GiB at its
peak without checkpointing, 0.18 with it.

The peak is sampled (every `PERIOD_S`), so a peak shorter than that may be
missed: a step's activations are held from the end of forward into backward,
much longer. The sampler takes the allocator's locks, so it runs outside the
timed window (`memory_window`), and inside it only under a forced limit.
Imports torch only on call (at_failure, is_oom); glibc (Linux) for the numbers: elsewhere they are absent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

from autotune.host import procfs


PERIOD_S = 0.001  # sampling period of the allocator's bytes in use
MEMORY_STEPS = 2  # the memory window's steps (after the timed window, untimed)
_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _FIELDS]


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        return libc
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33
        return None


_LIBC = _libc()


def in_use_gib() -> float | None:
    """Bytes the C allocator has handed out and not got back (in its arenas and
    mmapped chunks), in GiB; None without glibc's mallinfo2."""
    if _LIBC is None:
        return None
    info = _LIBC.mallinfo2()
    return (info.uordblks + info.hblkhd) / 2**30


class PeakInUse:
    """The peak of `in_use_gib`, sampled every `period_s` by a daemon thread
    from `start` (or the last `reset`) until `stop`. With `limit_gib`, `check`
    raises MemoryCapExceeded once a sample was above it."""

    def __init__(self, limit_gib: float | None = None, period_s: float = PERIOD_S):
        self.limit_gib, self.period_s = limit_gib, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.reset()

    def reset(self) -> None:
        self.start_gib = in_use_gib()
        self.peak_gib = self.start_gib

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            now = in_use_gib()
            if now > self.peak_gib:
                self.peak_gib = now

    def start(self) -> "PeakInUse":
        if _LIBC is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def check(self) -> None:
        """Raise MemoryCapExceeded when a sample since the start was above the limit
        (without glibc: the peak RSS against it, check_rss_cap)."""
        if self.limit_gib is None:
            return
        if self.peak_gib is None:
            check_rss_cap(self.limit_gib)
        elif self.peak_gib > self.limit_gib:
            error = MemoryCapExceeded(
                f"out of memory: {self.peak_gib:.3f} GiB in use (the allocator's sampled "
                f"peak) above memory_limit_gib={self.limit_gib:g}"
            )
            error.in_use_gib = self.peak_gib
            raise error


def cap(limit_gib: float | None) -> PeakInUse | None:
    """The forced memory limit's sampler, started (None: no limit)."""
    return PeakInUse(limit_gib).start() if limit_gib is not None else None


def memory_window(session, batches, steps: int = MEMORY_STEPS) -> dict[str, float]:
    """`steps` more steps, untimed, with the allocator's bytes in use sampled:
    `mem_inuse_peak_gib`, the peak, and `mem_inuse_step_gib`, the peak above the
    bytes in use before the first of them (what a step adds: activations,
    gradients, the optimizer's temporaries). {} without glibc."""
    if in_use_gib() is None:
        return {}
    sampler = session.memory_cap or PeakInUse().start()
    session.sync()
    sampler.reset()
    try:
        for _ in range(steps):
            session.step(next(batches))
        session.sync()
    finally:
        if sampler is not session.memory_cap:
            sampler.stop()
    return {"mem_inuse_peak_gib": sampler.peak_gib, "mem_inuse_step_gib": sampler.peak_gib - sampler.start_gib}


# --- the process's peak RSS, and what an out of memory left ---------------------


def reset_peak_rss() -> None:
    """Restart this process's peak RSS (Linux VmHWM) from its current RSS; elsewhere a no-op."""
    procfs.reset_peak_rss()


def peak_rss_gib() -> float:
    """This process's peak RSS since `reset_peak_rss` (Linux; elsewhere since it started)."""
    peak = procfs.kib("self/status", "VmHWM")
    if peak is None:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return peak / 2**20


class MemoryCapExceeded(MemoryError):
    """The trial's memory went over its cap (`memory_limit_gib`: the allocator's bytes in use, autotune.trial.memory;
    peak RSS where glibc's mallinfo2 is missing): an out of memory, status "oom"."""


def check_rss_cap(limit_gib: float | None) -> None:
    """Raise MemoryCapExceeded when this process's peak RSS is above `limit_gib`
    (a forced memory limit on the CPU, where nothing else bounds a batch)."""
    if limit_gib is not None and peak_rss_gib() > limit_gib:
        raise MemoryCapExceeded(
            f"out of memory: peak RSS {peak_rss_gib():.2f} GiB above memory_limit_gib={limit_gib:g}"
        )


def at_failure(error: BaseException, device) -> dict[str, float]:
    """What an out of memory left: the process's peak RSS; on CUDA the device's
    peak allocated and its total; the allocator's peak a forced limit stopped at."""
    import resource

    import torch

    out = {"mem_rss_peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}  # KiB on Linux
    if device.type == "cuda":
        out["mem_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["mem_device_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    peak = getattr(error, "in_use_gib", None)
    return {**out, **({"mem_inuse_peak_gib": peak} if peak is not None else {})}


# what an allocation that failed says: CUDA's OutOfMemoryError, and the CPU allocator's RuntimeError
# ("DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes. Error code 12 (Cannot allocate
# memory)", torch 2.14: no OutOfMemoryError on the CPU)
OOM_WORDS = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.OutOfMemoryError) or any(w in str(e).lower() for w in OOM_WORDS)
