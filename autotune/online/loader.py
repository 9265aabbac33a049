"""The loader re-tuned while the real job runs (issue 43): `for batch in OnlineLoader(loader):`.

It times the data wait at each `next()` and the compute between calls, in windows. When the wait is above
`threshold` of the step it tries more workers (or a deeper prefetch); under half of it, and when every move up lost,
it tries fewer (a wait that a move up did not shorten, a batch's transfer from its worker, counts for neither). Each
move is a measured trial: the setting's last windows before, the loader rebuilt, a warm-up (a batch from each worker
at least), then windows after that go on until the difference is clear of the noise of both sides (a 95% interval
from their chunks, or from their windows' rates where the host's speed drifts more) or `settle_s` has passed; the move is kept only if it wins beyond that noise (a move down is kept
when it clearly does not lose more than `min_gain` against where the run of moves down began, three ties of -3% not
being one of -9%; a difference still inside the noise at `settle_s` is a tie, and a tie holds the setting either
way). The config that lost is not tried again for a back-off time that
doubles at each loss, so it does not oscillate. A move whose predicted CPU (the workers' CPU time, not their count)
passes what the host has idle (measured over the window, shared by the node's ranks) or a `cpu_budget` set, or whose
memory (PSS: forked workers share pages) passes its budget, is not made.

What stays the same: the sample indices and their order (the epoch's indices are drawn once; a rebuilt loader
continues from the next one not yet yielded, mid-epoch), and torch's global random state (saved and restored around
every rebuild, so dropout draws what it would have drawn). Sample *contents* under random augmentations in workers
depend on the workers' seeds and may differ. Never touched: batch size, precision, compile, layout, optimizer.

torch and the standard library only (psutil is not needed: /proc is read directly). This module is the iterator
the user loops over: its measured loop and windows, its epochs and rebuilds (which keep the order and the random
state), and the log. The measurements (a window, the host's readings, a worker's pace) are
`autotune.online.window`'s; which move to try and whether it won, `autotune.online.moves`'s (`Moves`,
given each closed window; it changes the loader only through `switch`).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.online.moves import Moves, Setting
from autotune.online.options import Options
from autotune.online.window import Window, cpu_seconds, host_idle_cores

KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
NEVER = "batch size, precision, compile, layout and optimizer stay as exported"
PREFIX = "autotune online:"
# a step whose time outside next() passes PAUSE times the window's mean step is the program pausing (validation,
# a checkpoint written): its gap is left out of the window, as the time between epochs is
PAUSE = 10


class _Remaining:
    """The rebuilt loader's sampler: the epoch's indices (or batches of indices) from `start` on."""

    def __init__(self):
        self.order: list = []
        self.start = 0

    def __iter__(self):
        return iter(self.order[self.start :])

    def __len__(self):
        return len(self.order) - self.start


class OnlineLoader:
    """Iterate it like the loader. Its keyword options (`cpu_budget`, `ram_budget_gib`, `threshold`, `log`,
    `tracker`, `window_s`, `window_steps`, `settle_s`, `warmup_steps`, `backoff_s`, `min_gain`, `max_workers`,
    `max_prefetch`) are `autotune.online.options.Options`'s fields: a budget of CPU and memory for its workers, the
    data wait that moves it, where its log goes, and its windows."""

    def __init__(self, loader, **options):
        from torch.utils.data import IterableDataset

        self.options = opts = Options.of(options)
        self.loader = loader
        self.tracker = opts.tracker
        self.window_s, self.window_steps, self.warmup_steps = opts.window_s, opts.window_steps, opts.warmup_steps
        self.settle_s = opts.settle
        self.windows: list[Window] = []  # the windows of the present setting since it was built (the last settle_s)
        self._sink = opts.log
        self.setting = Setting(
            loader.num_workers, loader.prefetch_factor, bool(loader.pin_memory), bool(loader.persistent_workers)
        )
        self.start_setting = self.setting
        self.iterable = isinstance(loader.dataset, IterableDataset)
        self.step = 0
        self.epochs = 0
        self.pauses = 0  # steps whose compute took over PAUSE times the window's mean step: left out of the window
        self._last_step_end = 0.0
        self._typical_step = 0.0  # the last window's mean step, for a window too young to have its own
        self._startup, self._epoch_wall = 0.0, None  # the last epoch's wait for its first batch, and its wall time
        self._dl = self._dl_setting = self._win = self._paused = None
        self._remaining = _Remaining()
        self._live = [None]  # the live torch iterator, in a box that the finalizer holds (close())
        weakref.finalize(self, _shut_down, self._live)
        self._accel = _accelerator_available()
        self.moves = Moves(self, opts, accel=self._accel)
        ram = opts.ram_budget_gib
        self.emit(
            f"watching {self.setting.short()} (threshold {100 * opts.threshold:.0f}% data wait, cpu budget "
            f"{self.moves.budget_text()}, ram budget "
            f"{'none' if ram is None else f'{ram:.2f} GiB PSS'}); re-tunes "
            f"{', '.join(KNOBS)} only: {NEVER}",
            event="start",
            setting=self.setting.kwargs(),
        )
        if self.iterable:
            self.emit(
                "IterableDataset: not re-tuned (its order lives in the dataset); data wait is still measured",
                event="note",
            )
        self.metric(0)

    # ---- the user's side ------------------------------------------------------------------------------------
    def __len__(self):
        return len(self.loader)

    def close(self):
        """Stop the loader's workers now (persistent workers outlive an epoch); a later `for` starts new ones.
        Also done when the OnlineLoader is collected."""
        _shut_down(self._live)
        self._dl = self._dl_setting = None

    @property
    def _it(self):
        return self._live[0]

    @_it.setter
    def _it(self, it):
        self._live[0] = it

    @property
    def changes(self) -> list[dict]:
        """Every move tried, kept or not (the log's `change` lines)."""
        return self.moves.changes

    def __iter__(self) -> Iterator:
        t = time.perf_counter()
        if self.iterable:
            yield from self._measured(iter(self.loader), retune=False, t_epoch=t)
            return
        self._begin_epoch()
        self.setting = self.moves.epoch_start(self.setting, self._startup, self._epoch_wall, self.epochs)
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
        self._it = it if it is not None else self._rebuild(reuse=True)
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
                self.setting = self.moves.epoch_judged(self.setting, self._startup, self.epochs)
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
                        self.moves.decide(self._history())
            self._last_step_end = t1
            yield batch

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

    def _rebuild(self, reuse: bool = False):
        """An iterator for `self.setting` from the next index not yet yielded, the live one's workers stopped first
        (at an epoch start, persistent workers of the same setting are reused); the generator's state is the same
        after as before."""
        keep = reuse and self._dl is not None and self._dl_setting == self.setting and self.setting.persistent_workers
        if self._dl_setting != self.setting:
            self.windows = []  # windows of another setting say nothing of this one
        if not keep:
            _shut_down(self._live)
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
        self._open_window(time.perf_counter())
        if self.moves.observe(w):  # a move's, on trial
            return
        self.windows.append(w)
        self._trim()

    def switch(self, setting: Setting, windows: list[Window], warmup: int = 0):
        """A move of `self.moves` applied: the loader rebuilt for `setting` (when it is not the present one) and
        timed again after `warmup` steps; `windows` are the setting's history from now on."""
        if setting != self.setting:
            self.setting = setting
            self._it = self._rebuild()
            self._open_window(time.perf_counter(), warmup=warmup)
        self.windows = windows
        self._trim()

    def read_pss(self, w: Window) -> Window:
        """The job's PSS now, onto `w`, where a decision needs it (`Window.read_pss`)."""
        return w.read_pss(self._worker_pids())

    def _trim(self):
        while len(self.windows) > 1 and sum(h.wall for h in self.windows[1:]) >= self.settle_s:
            self.windows.pop(0)

    def _history(self) -> Window | None:
        """The present setting's windows as one (None before it has two: one window's noise is a guess)."""
        if len(self.windows) < 2:
            return None
        w = self.windows[0]
        for later in self.windows[1:]:
            w = w.merged(later)
        return w

    def _worker_pids(self) -> list[int]:
        return [p.pid for p in getattr(self._it, "_workers", []) if p.pid]

    def _worker_cpu(self) -> float:
        return sum(cpu_seconds(p) for p in self._worker_pids())

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

    def metric(self, wait_pct: float):
        if self.tracker is not None:
            self.tracker.log_metric("online/num_workers", self.setting.num_workers, step=self.step)
            self.tracker.log_metric("online/data_wait_pct", wait_pct, step=self.step)

    def summary(self) -> dict:
        """One line: what changed, and the settings to export (a move still on trial does not count yet)."""
        kept = [c for c in self.changes if c["kept"]]
        settled = self.moves.settled(self.setting)
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


def _shut_down(live: list):
    """The live iterator's workers stopped: at a rebuild, at `close()`, and first of all when the OnlineLoader is
    collected. It is collected with a cycle (its `Moves` holds it), where torch's own finalizer can run after its
    queues' are gone and then waits 5 s for each worker before killing it (measured: 10.2 s at 2 persistent
    workers, at whatever step the collector ran; 0.01 s shut down first)."""
    it, live[0] = live[0], None
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


def _accelerator_available() -> bool:
    import torch

    return bool(getattr(torch, "accelerator", None) and torch.accelerator.is_available())


def settings_from_log(path: str | Path) -> dict[str, Any]:
    """The loader settings an online run ended with (its last summary, else its last change or start line)."""
    settings = None
    for line in Path(path).read_text().splitlines():
        if line.startswith(PREFIX) and " | " in line:
            record = json.loads(line.rsplit(" | ", 1)[1])
            settings = record.get("settings", record.get("setting", settings))
    if settings is None:
        raise ValueError(f"`{path}` has no `{PREFIX}` lines: not the log of an OnlineLoader run")
    return settings
