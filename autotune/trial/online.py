"""The loader re-tuned while the real job runs (issue 43): `for batch in OnlineLoader(loader):`.

It times the data wait at each `next()` and the compute between calls, in windows. When the wait is above
`threshold` of the step it tries more workers (or a deeper prefetch); under half of it, and when every move up lost,
it tries fewer (a wait that a move up did not shorten, a batch's transfer from its worker, counts for neither). Each
move is a measured trial: the setting's last windows before, the loader rebuilt, a warm-up (a batch from each worker
at least), then windows after that go on until the difference is clear of the noise of both sides (a 95% interval
from their chunks, or from their windows' rates where the host's speed drifts more) or `settle_s` has passed; the move is kept only if it wins beyond that noise (a move down is kept
when it does not lose more than `min_gain` against where the run of moves down began: a tie goes to the cheaper
loader, three ties of -3% are not one of -9%). The config that lost is not tried again for a back-off time that
doubles at each loss, so it does not oscillate. A move whose predicted CPU (the workers' CPU time, not their count)
passes what the host has idle (measured over the window, shared by the node's ranks) or a `cpu_budget` set, or whose
memory (PSS: forked workers share pages) passes its budget, is not made.

What stays the same: the sample indices and their order (the epoch's indices are drawn once; a rebuilt loader
continues from the next one not yet yielded, mid-epoch), and torch's global random state (saved and restored around
every rebuild, so dropout draws what it would have drawn). Sample *contents* under random augmentations in workers
depend on the workers' seeds and may differ. Never touched: batch size, precision, compile, layout, optimizer.

torch and the standard library only (psutil is not needed: /proc is read directly). The measurements (a window, the
host's readings, a worker's pace) are `autotune.trial.online_window`'s; this module decides and rebuilds. It is ~700
lines and one concept: the iterator the user loops over, its epochs and rebuilds (which keep the order and the random
state), the moves and their verdicts, and the log are one state machine, each part reading the others' state.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.trial.online_window import (
    Window,
    cpu_seconds,
    host_available_gib,
    host_idle_cores,
    local_ranks,
    t95,
    window_dict,
    window_se,
    WorkerPace,
)

KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
NEVER = "batch size, precision, compile, layout and optimizer stay as exported"
PREFIX = "autotune online:"
# a step whose time outside next() passes PAUSE times the window's mean step is the program pausing (validation,
# a checkpoint written): its gap is left out of the window, as the time between epochs is
PAUSE = 10


@dataclass(frozen=True)
class Setting:
    """The loader knobs the tuner moves."""

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool

    def kwargs(self) -> dict[str, Any]:
        """The DataLoader arguments (and best_config.yaml's knobs): without workers, no prefetch nor persistence."""
        n = self.num_workers
        return {
            "num_workers": n,
            "prefetch_factor": (self.prefetch_factor or 2) if n else None,
            "pin_memory": self.pin_memory,
            "persistent_workers": self.persistent_workers and n > 0,
        }

    def key(self) -> tuple:
        return tuple(self.kwargs().values())

    def short(self) -> str:
        s = f"num_workers={self.num_workers}"
        if self.num_workers:
            s += f" prefetch_factor={self.prefetch_factor or 2}"
        return s + (" pin_memory" if self.pin_memory else "") + (" persistent" if self.persistent_workers else "")


class _Remaining:
    """The rebuilt loader's sampler: the epoch's indices (or batches of indices) from `start` on."""

    def __init__(self):
        self.order: list = []
        self.start = 0

    def __iter__(self):
        return iter(self.order[self.start :])

    def __len__(self):
        return len(self.order) - self.start


@dataclass
class _Move:
    """A move on trial: from `old` to `new`, why, the windows before it (`before` merged, `before_windows` to go on
    from if it is reverted), what it is judged against (`ref`), when it began, and the windows after it so far."""

    old: Setting
    new: Setting
    direction: str  # "up" or "down"
    why: str
    before: Window
    ref: Window
    before_windows: list[Window]
    t: float
    step: int
    windows: list[Window] = field(default_factory=list)
    after: Window | None = None


class OnlineLoader:
    """Iterate it like the loader. `cpu_budget`: cores of CPU time the workers may use (default: none set, the host's
    idle cores measured in each window, shared by the node's ranks, bound a move up); `ram_budget_gib`: the
    job's PSS (main + workers) it may reach (default: no limit beyond the host's available memory); `threshold`:
    data wait share of the step above which it moves up; `log`: a path (lines appended), a callable (given each
    line) or None (stderr); `tracker`: anything with `log_metric(key, value, step=...)`, e.g. the `mlflow`
    module inside a run. Windows: at least `window_s` and `window_steps`; a move is weighed on the setting's last
    `settle_s` (4 windows) against windows after it that go on, up to `settle_s`, until the difference is clear of
    their noise."""

    def __init__(
        self,
        loader,
        *,
        cpu_budget: float | None = None,
        ram_budget_gib: float | None = None,
        threshold: float = 0.05,
        log: str | Path | Callable[[str], None] | None = None,
        tracker=None,
        window_s: float = 2.0,
        window_steps: int = 8,
        settle_s: float | None = None,
        warmup_steps: int = 2,
        backoff_s: float = 30.0,
        min_gain: float = 0.03,
        max_workers: int | None = None,
        max_prefetch: int = 8,
    ):
        from torch.utils.data import IterableDataset

        self.loader = loader
        self.cpu_budget = None if cpu_budget is None else float(cpu_budget)
        self.ram_budget_gib = ram_budget_gib
        self.threshold = threshold
        self.tracker = tracker
        self.window_s, self.window_steps, self.warmup_steps = window_s, window_steps, warmup_steps
        self.settle_s = 4 * window_s if settle_s is None else settle_s
        self._hist: list[Window] = []  # the windows of the present setting since it was built (the last settle_s)
        self._down_ref: Window | None = None  # where a run of kept moves down started: the rate they answer to
        # the data wait a move up did not shorten (the main process taking a batch from its worker): not a reason
        # for more workers, nor against fewer; cleared when a move up wins
        self._wait_floor = 0.0
        self._pace = WorkerPace()  # fewer workers than the step rate needs at a worker's measured pace: not tried
        self.backoff_s, self.min_gain, self.max_prefetch = backoff_s, min_gain, max_prefetch
        self.max_workers = max_workers if max_workers is not None else max(4 * (os.cpu_count() or 1), 8)
        self._sink = log
        self.setting = Setting(
            loader.num_workers, loader.prefetch_factor, bool(loader.pin_memory), bool(loader.persistent_workers)
        )
        self.start_setting = self.setting
        self.iterable = isinstance(loader.dataset, IterableDataset)
        self.changes: list[dict] = []
        self.banned: dict[tuple, tuple[float, float]] = {}  # setting key -> (until, back-off seconds)
        self.step = 0
        self.epochs = 0
        self.pauses = 0  # steps whose compute took over PAUSE times the window's mean step: left out of the window
        self._last_step_end = 0.0
        self._typical_step = 0.0  # the last window's mean step, for a window too young to have its own
        self._dl = self._dl_setting = self._trial = self._persist = self._win = self._paused = None
        self._remaining = _Remaining()
        self._accel = _accelerator_available()
        self.emit(
            f"watching {self.setting.short()} (threshold {100 * threshold:.0f}% data wait, cpu budget "
            f"{self._budget_text()}, ram budget "
            f"{'none' if ram_budget_gib is None else f'{ram_budget_gib:.2f} GiB PSS'}); re-tunes "
            f"{', '.join(KNOBS)} only: {NEVER}",
            event="start",
            setting=self.setting.kwargs(),
        )
        if self.iterable:
            self.emit(
                "IterableDataset: not re-tuned (its order lives in the dataset); data wait is still measured",
                event="note",
            )
        self._metric(0)

    # ---- the user's side ------------------------------------------------------------------------------------
    def __len__(self):
        return len(self.loader)

    def __iter__(self) -> Iterator:
        t = time.perf_counter()
        if self.iterable:
            yield from self._measured(iter(self.loader), retune=False, t_epoch=t)
            return
        self._begin_epoch()
        self._epoch_move()
        yield from self._measured(None, retune=True, t_epoch=t)
        self.epochs += 1
        self._epoch_wall = time.perf_counter() - t
        self.summary()

    def _measured(self, it, retune: bool, t_epoch: float):
        """The loop: a clock read before and after each next() (and the main thread's CPU clock at 0 workers,
        where the data work is done inside next()); everything else only at window ends. A window goes on across
        an epoch's end; the time between epochs and the next epoch's first batch (worker start-up) are left out, and
        so are the program's own pauses (a step PAUSE times the window's mean outside next(); the last window's mean
        while this one has under 4 steps)."""
        clock, cpu = time.perf_counter, time.thread_time
        self._it = it if it is not None else self._rebuild(None, reuse=True)
        if self._win is None:
            self._open_window(clock(), warmup=self.warmup_steps)
        first = True
        while True:
            zero = self.setting.num_workers == 0
            c0 = cpu() if zero else 0.0
            t0 = clock()
            try:
                batch = next(self._it)
            except StopIteration:
                self._paused = clock()
                return
            t1 = clock()
            self.step += 1
            self._remaining.start += 1
            if first:
                first = False
                self._startup = t1 - t_epoch
                self._epochs_judged()
                if not self._warm and self._paused is not None:
                    gap = t1 - self._paused
                    self._win.start += gap
                    self._chunk_t += gap
                    self._last_step_end = t1  # the gap is out already: not a pause of the program's as well
                    yield batch
                    continue
            if self._warm:
                self._warm -= 1
                if not self._warm:
                    self._start_window(t1)
            else:
                w = self._win
                gap = t0 - self._last_step_end
                typical = (self._last_step_end - w.start) / w.steps if w.steps >= 4 else self._typical_step
                if typical and gap > max(PAUSE * typical, 0.1):
                    w.start += gap  # the program paused (validation, a checkpoint): not the loader's time
                    self._chunk_t += gap
                    self.pauses += 1
                w.wait += t1 - t0
                w.steps += 1
                if zero:
                    w.main_data_cpu += cpu() - c0
                if t1 - self._chunk_t >= self._chunk_s and w.steps - self._chunk_steps >= self._chunk_n:
                    w.chunks.append((w.steps - self._chunk_steps) / (t1 - self._chunk_t))
                    self._chunk_t, self._chunk_steps = t1, w.steps
                if w.steps >= self.window_steps and t1 - w.start >= self.window_s:
                    self._close_window(t1)
                    if retune:
                        self._decide()
            self._last_step_end = t1
            yield batch

    # ---- persistent_workers: a move judged at epoch boundaries -----------------------------------------------
    def _epoch_move(self):
        """Workers that persist save each epoch's start-up: tried when the last epoch's start-up (the wait for its
        first batch) passed `threshold` of the epoch, judged by the start-up of the second epoch after."""
        s, last = self.setting, getattr(self, "_epoch_wall", None)
        if self._persist or self._trial or last is None or not s.num_workers or s.persistent_workers:
            return
        new = replace(s, persistent_workers=True)
        if self._startup > self.threshold * last and self.banned.get(new.key(), (0.0,))[0] <= time.monotonic():
            self._persist = {
                "from": s,
                "to": new,
                "before": self._startup,
                "epoch_wall": last,
                "epoch": self.epochs,
                "step": self.step,
            }
            self.setting = new

    def _epochs_judged(self) -> bool:
        p = self._persist
        if not p or self.epochs < p["epoch"] + 1:
            return False
        self._persist = None
        old, new, before, after = p["from"], p["to"], p["before"], self._startup
        keep = after < 0.5 * before
        loser = old if keep else new
        back = self._back_off(loser)
        if not keep:
            self.setting = replace(self.setting, persistent_workers=False)
        why = f"start-up {before:.2f} s was {100 * before / p['epoch_wall']:.0f}% of a {p['epoch_wall']:.1f} s epoch"
        record = {
            "kind": "epoch",
            "step": p["step"],
            "from": old.kwargs(),
            "to": new.kwargs(),
            "kept": keep,
            "why": why,
            "before": {"startup_s": round(before, 3)},
            "after": {"startup_s": round(after, 3)},
            "move_cost_s": 0.0,
            "backoff_s": back,
        }
        self.changes.append(record)
        self.emit(
            f"{old.short()} -> {new.short()} {'kept' if keep else 'reverted'} ({why}): start-up of an epoch "
            f"{before:.2f} s -> {after:.2f} s; {loser.short()} not retried for {back:.0f} s",
            event="change",
            **record,
            setting=self.setting.kwargs(),
        )
        return True

    # ---- epochs and rebuilds --------------------------------------------------------------------------------
    def _begin_epoch(self):
        """Draw the epoch's indices once, consuming torch's random state exactly as the plain loader would (its
        iterator's base seed, unless its workers persist past the first epoch, then its sampler), and keep the
        state from before the base seed so every rebuilt iterator of this epoch gets the same worker seed."""
        import torch

        loader = self.loader
        self._gen = loader.generator if loader.generator is not None else torch.default_generator
        self._seed_state = self._gen.get_state()
        if self.epochs == 0 or not loader.persistent_workers:
            torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        self._remaining.order = list(loader._index_sampler)
        self._remaining.start = 0

    def _new_loader(self, setting: Setting):
        from torch.utils.data import DataLoader

        src = self.loader
        common = dict(
            collate_fn=src.collate_fn,
            timeout=src.timeout,
            worker_init_fn=src.worker_init_fn,
            multiprocessing_context=src.multiprocessing_context if setting.num_workers else None,
            in_order=getattr(src, "in_order", True),
            **setting.kwargs(),
        )
        if not self._accel:
            common["pin_memory"] = False  # pinning without an accelerator only warns
        if src._auto_collation:
            return DataLoader(src.dataset, batch_sampler=self._remaining, **common)
        return DataLoader(src.dataset, batch_size=None, sampler=self._remaining, **common)

    def _rebuild(self, old_it, reuse: bool = False):
        """An iterator for `self.setting` from the next index not yet yielded (at an epoch start, persistent
        workers of the same setting are reused); the generator's state is the same after as before."""
        keep = reuse and self._dl is not None and self._dl_setting == self.setting and self.setting.persistent_workers
        if self._dl_setting != self.setting:
            self._hist = []  # windows of another setting say nothing of this one
        if old_it is not None and hasattr(old_it, "_shutdown_workers"):
            old_it._shutdown_workers()
        gen = self._gen
        state = gen.get_state()
        gen.set_state(self._seed_state)
        try:
            with warnings.catch_warnings():  # the budgets, not torch's count of cores, bound the workers
                warnings.filterwarnings("ignore", message="This DataLoader will create")
                if not keep:
                    self._dl, self._dl_setting = self._new_loader(self.setting), self.setting
                return iter(self._dl)
        finally:
            gen.set_state(state)

    # ---- windows --------------------------------------------------------------------------------------------
    def _open_window(self, now: float, warmup: int = 0):
        """A new window, after `warmup` steps that do not count (worker start-up, the prefetch filling)."""
        self._win = Window()
        self._warm = warmup
        if not warmup:
            self._start_window(now)

    def _start_window(self, now: float):
        w = self._win
        w.start = self._chunk_t = now
        self._chunk_steps = 0
        self._chunk_s, self._chunk_n = self.window_s / 4, max(2, self.window_steps // 4)  # 4 chunks: the noise
        self._cpu_mark = self._worker_cpu()
        self._idle_mark, _ = host_idle_cores(None)

    def _close_window(self, now: float):
        w = self._win
        w.wall = now - w.start
        self._typical_step = w.wall / max(w.steps, 1)
        w.worker_cpu = self._worker_cpu() - self._cpu_mark
        _, w.host_idle = host_idle_cores(self._idle_mark)
        self._pace.learn(w, self.setting.num_workers, self._wait_floor, self.threshold)
        self._open_window(time.perf_counter())
        if self._trial is not None:
            move = self._trial
            move.windows.append(w)
            move.after = w if move.after is None else move.after.merged(w)
            return
        self._hist.append(w)
        self._trim()

    def _read_pss(self, w: Window) -> Window:
        """The job's PSS now, onto `w`, where a decision needs it (`Window.read_pss`)."""
        return w.read_pss(self._worker_pids())

    def _trim(self):
        while len(self._hist) > 1 and sum(h.wall for h in self._hist[1:]) >= self.settle_s:
            self._hist.pop(0)

    def _history(self) -> Window | None:
        """The present setting's windows as one (None before it has two: one window's noise is a guess)."""
        if len(self._hist) < 2:
            return None
        w = self._hist[0]
        for later in self._hist[1:]:
            w = w.merged(later)
        return w

    def _worker_pids(self) -> list[int]:
        return [p.pid for p in getattr(self._it, "_workers", []) if p.pid]

    def _worker_cpu(self) -> float:
        return sum(cpu_seconds(p) for p in self._worker_pids())

    # ---- decisions ------------------------------------------------------------------------------------------
    def _decide(self):
        if self._trial is not None:
            self._judge(self._trial, self._trial.after)
            return
        w = self._history()
        if w is None:
            return
        floor = f" ({100 * self._wait_floor:.0f}% of it no move up shortened)" if self._wait_floor else ""
        excess = w.wait_share - self._wait_floor
        if excess > self.threshold:
            if self._try(
                self._up_moves(),
                w,
                "up",
                f"data wait {100 * w.wait_share:.0f}% of the step{floor} > {100 * self.threshold:.0f}%",
            ):
                return
            why = f"data wait {100 * w.wait_share:.0f}%{floor} but every move up lost or passes a budget"
        elif excess < self.threshold / 2:
            why = f"data wait {100 * w.wait_share:.1f}% of the step{floor}: fewer workers may keep the rate"
        else:
            return
        self._try(self._down_moves(w), w, "down", why)

    def _up_moves(self) -> list[Setting]:
        s, n = self.setting, self.setting.num_workers
        out = [replace(s, num_workers=k) for k in dict.fromkeys((max(2, 2 * n), n + 1)) if k <= self.max_workers]
        if n > 0 and (s.prefetch_factor or 2) < self.max_prefetch:
            out.append(replace(s, prefetch_factor=2 * (s.prefetch_factor or 2)))
        if self._accel and not s.pin_memory:
            out.append(replace(s, pin_memory=True))
        return out

    def _down_moves(self, w: Window) -> list[Setting]:
        """Fewer workers: where the step waits little on data (under twice the threshold), first as few as the
        workers' CPU says would do, with twice the headroom (workers using 0.09 cores of CPU time between them: 1);
        then half, then one less. The CPU says nothing of a worker waiting on storage, which a job waiting on its
        data may have: there the moves go by halves (each move is measured; one that loses is reverted), never
        below what a worker's measured pace says the step rate needs (`WorkerPace.needed`)."""
        s, n = self.setting, self.setting.num_workers
        low_wait = w.wait_share < 2 * self.threshold
        enough = max(1, math.ceil(2 * w.data_cpu)) if low_wait and n > 1 else n
        need = self._pace.needed(w)
        return [replace(s, num_workers=k) for k in dict.fromkeys((enough, n // 2, n - 1)) if need <= k < n]

    def _predict(self, w: Window, new: Setting) -> tuple[float, float]:
        """CPU (cores of workers' CPU time) and PSS (GiB) after a move. CPU grows at most with the workers, and the
        loader cannot usefully run faster than the compute consumes (CPU per batch times the compute's step rate),
        nor any worker use more than a core. Each new worker costs the PSS the present ones have (none yet: half
        the main process's, as a forked worker's copy-on-write pages grow)."""
        n, k = self.setting.num_workers, new.num_workers
        per_batch = w.data_cpu / w.rate if w.rate > 0 else 0.0
        compute = max(w.wall - w.wait, 1e-9) / max(w.steps, 1)
        cpu = min(w.data_cpu * k / max(n, 1), per_batch / compute, float(k))
        per_worker = w.worker_pss_gib / n if n else 0.5 * (w.pss_gib - w.worker_pss_gib)
        return cpu, w.pss_gib + per_worker * (k - n)

    def _try(self, moves: list[Setting], w: Window, direction: str, why: str) -> bool:
        """Start a trial of the first move not backed off nor past a budget; False when there is none."""
        now = time.monotonic()
        if direction == "up":
            self._read_pss(w)
        for new in moves:
            until = self.banned.get(new.key(), (0.0, 0.0))[0]
            if until > now:
                continue
            cpu, pss = self._predict(w, new)
            room, bound = self._cpu_room(w)
            if direction == "up" and new.num_workers > self.setting.num_workers and cpu > room:
                self._refused(new, why, f"{bound}: {cpu:.2f} cores predicted > {room:.2f}")
                continue
            if direction == "up" and self.ram_budget_gib is not None and pss > self.ram_budget_gib:
                self._refused(new, why, f"ram budget: {pss:.2f} GiB PSS predicted > {self.ram_budget_gib:.2f}")
                continue
            free = host_available_gib()
            if direction == "up" and free is not None and pss - w.pss_gib > 0.5 * free:
                self._refused(
                    new, why, f"host memory: {pss - w.pss_gib:.2f} GiB more PSS predicted, {free:.2f} GiB available"
                )
                continue
            self._start_trial(new, w, direction, why)
            return True
        return False

    def _warmup(self, setting: Setting) -> int:
        """Steps not timed after a rebuild: `warmup_steps`, and at least one batch from each worker (8 new workers
        on storage take a while to start delivering: a 2-step warm-up read 4->8 workers as +4% where a fixed run
        of each gives +29%)."""
        return max(self.warmup_steps, setting.num_workers)

    def _cpu_room(self, w: Window) -> tuple[float, str]:
        """Cores the workers may use after a move up, and what bounds them: what they use now plus the host's idle
        cores over the window (this rank's share, LOCAL_WORLD_SIZE: a worker waiting on storage leaves its core
        idle, a host busy with other work has none to give), never past an explicit `cpu_budget`."""
        measured = None if w.host_idle is None else w.data_cpu + max(w.host_idle, 0.0) / local_ranks()
        if self.cpu_budget is not None and (measured is None or self.cpu_budget <= measured):
            return self.cpu_budget, "cpu budget"
        return (float(os.cpu_count() or 1) if measured is None else measured), "host idle"

    def _budget_text(self) -> str:
        if self.cpu_budget is None:
            return "the host's idle cores, measured in each window"
        return f"{self.cpu_budget:.2f} cores of workers' CPU time (or the host's idle cores, when fewer)"

    def _back_off(self, loser: Setting) -> float:
        """The setting that lost is not tried again for `backoff_s`, doubled at each loss."""
        back = 2 * self.banned.get(loser.key(), (0.0, self.backoff_s / 2))[1]
        self.banned[loser.key()] = (time.monotonic() + back, back)
        return back

    def _refused(self, new: Setting, why: str, reason: str):
        key = ("refused", new.key(), reason.split(":")[0])
        if key not in self.banned:  # said once per setting and budget
            self.banned[key] = (math.inf, 0.0)
            self.emit(
                f"{self.setting.short()} -> {new.short()} not made ({why}): {reason}",
                event="refused",
                to=new.kwargs(),
                reason=reason,
            )

    def _start_trial(self, new: Setting, before: Window, direction: str, why: str):
        self._read_pss(before)  # its workers, before they go
        t = time.perf_counter()
        old, measured = self.setting, self._hist
        self.setting = new
        self._it = self._rebuild(self._it)
        # a run of moves down answers to where it started (three ties of -3% are not one of -9%), or to the window
        # before, when that was faster
        ref = max(self._down_ref or before, before, key=lambda x: x.rate) if direction == "down" else before
        self._trial = _Move(old, new, direction, why, before, ref, measured, t, self.step)
        self._open_window(time.perf_counter(), warmup=self._warmup(new))

    def _verdict(
        self, direction: str, ref: Window, after: Window, final: bool, drift: float = 0.0
    ) -> tuple[bool | None, float]:
        """Keep the move, revert it, or None: not yet clear of the noise (the 95% interval of the difference, from
        the chunks of both sides, or from `drift`, the standard error of the difference from the rates of each
        side's windows, where that is larger: a host whose speed drifts moves whole windows). Up: kept when it gains more than `min_gain` and the noise, reverted when it
        clearly gains less (or, at `settle_s`, when still unclear). Down: kept when it clearly loses less than
        `min_gain` against where the run of moves down started, reverted when it clearly loses more; at
        `settle_s` a tie goes to the cheaper loader."""
        margin = t95(len(ref.chunks) + len(after.chunks) - 2) * max(math.sqrt(ref.noise**2 + after.noise**2), drift)
        gain, least = after.rate - ref.rate, self.min_gain * ref.rate
        if direction == "up":
            if gain > max(margin, least):
                return True, margin
            if gain + margin < least or final:
                return False, margin
        else:
            if gain - margin > -least:
                return True, margin
            if gain + margin < -least or final:
                return gain > -least, margin
        return None, margin

    def _judge(self, trial: _Move, after: Window):
        old, new = trial.old, trial.new
        drift = math.hypot(
            window_se(trial.before_windows) if trial.ref is trial.before else 0.0, window_se(trial.windows)
        )
        keep, margin = self._verdict(trial.direction, trial.ref, after, after.wall >= self.settle_s, drift)
        if keep is None:
            return  # the windows after the move go on
        before, ref = trial.before, trial.ref
        self._read_pss(after)
        over = self.ram_budget_gib is not None and after.pss_gib > self.ram_budget_gib
        over_cpu = (
            self.cpu_budget is not None and new.num_workers > old.num_workers and after.data_cpu > 1.1 * self.cpu_budget
        )
        if over or over_cpu:
            keep = False
        loser = old if keep else new
        back = self._back_off(loser)
        self._trial = None
        cost = max(after.start - trial.t - self.warmup_steps / after.rate, 0.0) if after.rate else 0.0
        verdict = "kept" if keep else "reverted"
        reason = (
            " (measured PSS over the ram budget)"
            if over
            else " (measured workers' CPU over the budget)"
            if over_cpu
            else ""
        )
        line = (
            f"{old.short()} -> {new.short()} {verdict}{reason} ({trial.why}): "
            f"{before.describe()} -> {after.describe()} (noise ±{margin:.2f}"
            f"{'' if ref is before else f'; against {ref.rate:.2f} steps/s where the moves down began'}), workers' CPU "
            f"{before.data_cpu:.2f} -> {after.data_cpu:.2f} cores, PSS {before.pss_gib:.2f} -> "
            f"{after.pss_gib:.2f} GiB; move cost {cost:.2f} s (shutdown, start-up, warm-up); "
            f"{loser.short()} not retried for {back:.0f} s"
        )
        record = {
            "kind": "window",
            "step": trial.step,
            "from": old.kwargs(),
            "to": new.kwargs(),
            "kept": keep,
            "why": trial.why,
            "before": window_dict(before),
            "after": window_dict(after),
            "judged_against": window_dict(ref),
            "margin": round(margin, 3),
            "move_cost_s": round(cost, 3),
            "backoff_s": back,
        }
        self.changes.append(record)
        self._down_ref = trial.ref if keep and trial.direction == "down" else None
        if trial.direction == "up":
            shortened = after.wait_share < 0.8 * before.wait_share
            self._wait_floor = 0.0 if keep or shortened else min(before.wait_share, after.wait_share)
            if self._wait_floor:  # those settings' wait was the hand-over, not their workers: no pace of theirs
                self._pace.forget(old.num_workers, new.num_workers)
        if keep:
            self._hist = trial.windows  # they measured the setting kept
            self._trim()
        else:
            self.setting = old
            self._it = self._rebuild(self._it)
            self._hist = trial.before_windows
            self._open_window(time.perf_counter(), warmup=self._warmup(old))
        self.emit(line, event="change", **record, setting=self.setting.kwargs())
        self._metric(100 * after.wait_share)

    # ---- output ---------------------------------------------------------------------------------------------
    def emit(self, text: str, **record):
        line = f"{PREFIX} {text} | {json.dumps(record, default=str)}"
        if callable(self._sink):
            self._sink(line)
        elif self._sink is not None:
            with open(self._sink, "a") as f:
                f.write(line + "\n")
        else:
            print(line, file=sys.stderr, flush=True)

    def _metric(self, wait_pct: float):
        if self.tracker is not None:
            self.tracker.log_metric("online/num_workers", self.setting.num_workers, step=self.step)
            self.tracker.log_metric("online/data_wait_pct", wait_pct, step=self.step)

    def summary(self) -> dict:
        """One line: what changed, and the settings to export (a move still on trial does not count yet)."""
        kept = [c for c in self.changes if c["kept"]]
        settled = self._trial.old if self._trial else (self._persist or {}).get("from", self.setting)
        text = (
            f"summary after {self.step} steps, {self.epochs} epoch(s): {len(kept)} change(s) kept of "
            f"{len(self.changes)} tried; settings for best_config.yaml: {settled.short()} (started at "
            f"{self.start_setting.short()}; `autotune export --from-online LOG` writes them); {NEVER}"
        )
        out = {
            "steps": self.step,
            "pauses": self.pauses,
            "epochs": self.epochs,
            "tried": len(self.changes),
            "kept": len(kept),
            "settings": settled.kwargs(),
        }
        self.emit(text, event="summary", **out)
        return out


def _accelerator_available() -> bool:
    import torch

    return bool(getattr(torch, "accelerator", None) and torch.accelerator.is_available())


def settings_from_log(path: str | Path) -> dict[str, Any]:
    """The loader settings an online run ended with (its last summary, else its last change or start line)."""
    found = None
    for line in Path(path).read_text().splitlines():
        if line.startswith(PREFIX) and " | " in line:
            record = json.loads(line.rsplit(" | ", 1)[1])
            found = record.get("settings", record.get("setting", found))
    if found is None:
        raise ValueError(f"`{path}` has no `{PREFIX}` lines: not the log of an OnlineLoader run")
    return found
