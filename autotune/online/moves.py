"""The online loader tuner's moves (`autotune.online`): which loader setting to try next, whether it fits
the budgets, and whether it won.

The iterator (`OnlineLoader`, the `host`) hands each closed window here (`observe`, then `decide`) and each epoch's
start-up (`epoch_start`, `epoch_judged`). A move up is tried when the data wait passes `threshold` of the step, a
move down under half of it; each is a measured trial against the setting's last windows, kept only if it wins beyond
the noise of both sides (`verdict`), and the setting that lost is backed off. The policy changes the loader only
through `host.switch(setting, windows, warmup)` and reads the host's `setting`, `step`, `windows` and `read_pss`; it reports
through `host.emit` and `host.metric`. It never touches the loader itself.

May import: `autotune.online.window` (the measurements), `autotune.online.options` (the options) and the standard
library.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

from autotune.online.options import Options
from autotune.online.window import (
    Window,
    between,
    host_available_gib,
    local_ranks,
    t95,
    window_dict,
    window_se,
    WorkerPace,
)


# A move whose rate changed by less than this factor either way could be the host's drift (this 2-core VM: a fixed
# loader read 2473 -> 3880 samples/s over 25 s, scripts/measurements/cpu-2026-11-27d-online-drift): before it is
# settled, the old setting is read again beside it, and the move judged against the old setting's reads on both sides
# (issue 53: start_wrong ended at 0.817-0.926 of the best fixed config where drift was read as gains)
REREAD_BAND = 1.5


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


@dataclass
class _Move:
    """A move on trial: from `old` to `new`, why, the windows before it (`before` merged, `before_windows` to go on
    from if it is reverted), what it is judged against (`ref`), when it began, and the windows after it so far
    (while the old setting is re-read beside it: the re-read's, the move's own in `candidate`)."""

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
    # the re-read (`Moves._judge`): the move's own windows, kept while the old setting is read again beside them
    candidate: Window | None = None
    candidate_windows: list[Window] = field(default_factory=list)


class Moves:
    """The move policy of one `OnlineLoader`, under its `options` (`autotune.online.options.Options`); `accel`:
    an accelerator is there (pinned memory can help)."""

    def __init__(self, host, options: Options, *, accel: bool):
        self.host = host
        self.cpu_budget = None if options.cpu_budget is None else float(options.cpu_budget)
        self.ram_budget_gib = options.ram_budget_gib
        self.threshold, self.settle_s, self.warmup_steps = options.threshold, options.settle, options.warmup_steps
        self.backoff_s, self.min_gain, self.max_prefetch = options.backoff_s, options.min_gain, options.max_prefetch
        mw = options.max_workers
        self.max_workers = mw if mw is not None else max(4 * (os.cpu_count() or 1), 8)
        self.accel = accel
        self.changes: list[dict] = []
        self.banned: dict[tuple, tuple[float, float]] = {}  # setting key -> (until, back-off seconds)
        self.trial: _Move | None = None  # a move whose windows are being measured
        self.persist: dict | None = None  # persistent_workers on trial, judged at the next epoch's start
        self._down_ref: Window | None = None  # where a run of kept moves down started: the rate they answer to
        # the data wait a move up did not shorten (the main process taking a batch from its worker): not a reason
        # for more workers, nor against fewer; cleared when a move up wins
        self._wait_floor = 0.0
        self.pace = WorkerPace()  # fewer workers than the step rate needs at a worker's measured pace: not tried

    def settled(self, setting: Setting) -> Setting:
        """The setting to export: a move still on trial does not count yet."""
        return self.trial.old if self.trial else (self.persist or {}).get("from", setting)

    def budget_text(self) -> str:
        if self.cpu_budget is None:
            return "the host's idle cores, measured in each window"
        return f"{self.cpu_budget:.2f} cores of workers' CPU time (or the host's idle cores, when fewer)"

    # ---- windows --------------------------------------------------------------------------------------------
    def observe(self, w: Window) -> bool:
        """A closed window: a worker's pace learnt from it; True when it is a move's (on trial), not the present
        setting's history."""
        self.pace.learn(w, self.host.setting.num_workers, self._wait_floor, self.threshold)
        if self.trial is None:
            return False
        self.trial.windows.append(w)
        self.trial.after = w if self.trial.after is None else self.trial.after.merged(w)
        return True

    def decide(self, history: Window | None):
        """After a window: judge the move on trial, or, from the present setting's windows merged (`history`,
        None before there are two), start one."""
        if self.trial is not None:
            self._judge(self.trial, self.trial.after)
            return
        w = history
        if w is None:
            return
        floor = f" ({100 * self._wait_floor:.0f}% of it no move up shortened)" if self._wait_floor else ""
        excess = w.wait_share - self._wait_floor
        if excess > self.threshold:
            if self._try(
                self.up_moves(),
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
        self._try(self.down_moves(w), w, "down", why)

    # ---- persistent_workers: a move judged at epoch boundaries -----------------------------------------------
    def epoch_start(self, setting: Setting, startup: float, epoch_wall: float | None, epochs: int) -> Setting:
        """Workers that persist save each epoch's start-up: tried when the last epoch's start-up (the wait for its
        first batch) passed `threshold` of the epoch, judged by the start-up of the second epoch after. Returns the
        setting the epoch is built with."""
        s, last = setting, epoch_wall
        if self.persist or self.trial or last is None or not s.num_workers or s.persistent_workers:
            return s
        new = replace(s, persistent_workers=True)
        if startup > self.threshold * last and self.banned.get(new.key(), (0.0,))[0] <= time.monotonic():
            self.persist = {
                "from": s,
                "to": new,
                "before": startup,
                "epoch_wall": last,
                "epoch": epochs,
                "step": self.host.step,
            }
            return new
        return s

    def epoch_judged(self, setting: Setting, startup: float, epochs: int) -> Setting:
        """At an epoch's first batch: the persistent_workers move judged, once its second epoch has started.
        Returns the setting to go on with."""
        p = self.persist
        if not p or epochs < p["epoch"] + 1:
            return setting
        self.persist = None
        old, new, before, after = p["from"], p["to"], p["before"], startup
        keep = after < 0.5 * before
        loser = old if keep else new
        back = self._back_off(loser)
        if not keep:
            setting = replace(setting, persistent_workers=False)
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
        self.host.emit(
            f"{old.short()} -> {new.short()} {'kept' if keep else 'reverted'} ({why}): start-up of an epoch "
            f"{before:.2f} s -> {after:.2f} s; {loser.short()} not retried for {back:.0f} s",
            event="change",
            **record,
            setting=setting.kwargs(),
        )
        return setting

    # ---- which moves ----------------------------------------------------------------------------------------
    def up_moves(self) -> list[Setting]:
        s = self.host.setting
        n = s.num_workers
        out = [replace(s, num_workers=k) for k in dict.fromkeys((max(2, 2 * n), n + 1)) if k <= self.max_workers]
        if n > 0 and (s.prefetch_factor or 2) < self.max_prefetch:
            out.append(replace(s, prefetch_factor=2 * (s.prefetch_factor or 2)))
        if self.accel and not s.pin_memory:
            out.append(replace(s, pin_memory=True))
        return out

    def down_moves(self, w: Window) -> list[Setting]:
        """Fewer workers: where the step waits little on data (under twice the threshold), first as few as the
        workers' CPU says would do, with twice the headroom (workers using 0.09 cores of CPU time between them: 1);
        then half, then one less. The CPU says nothing of a worker waiting on storage, which a job waiting on its
        data may have: there the moves go by halves (each move is measured; one that loses is reverted), never
        below what a worker's measured pace says the step rate needs (`WorkerPace.needed`)."""
        s = self.host.setting
        n = s.num_workers
        low_wait = w.wait_share < 2 * self.threshold
        enough = max(1, math.ceil(2 * w.data_cpu)) if low_wait and n > 1 else n
        need = self.pace.needed(w)
        return [replace(s, num_workers=k) for k in dict.fromkeys((enough, n // 2, n - 1)) if need <= k < n]

    def _predict(self, w: Window, new: Setting) -> tuple[float, float]:
        """CPU (cores of workers' CPU time) and PSS (GiB) after a move. CPU grows at most with the workers, and the
        loader cannot usefully run faster than the compute consumes (CPU per batch times the compute's step rate),
        nor any worker use more than a core. Each new worker costs the PSS the present ones have (none yet: half
        the main process's, as a forked worker's copy-on-write pages grow)."""
        n, k = self.host.setting.num_workers, new.num_workers
        per_batch = w.data_cpu / w.rate if w.rate > 0 else 0.0
        compute = max(w.wall - w.wait, 1e-9) / max(w.steps, 1)
        cpu = min(w.data_cpu * k / max(n, 1), per_batch / compute, float(k))
        per_worker = w.worker_pss_gib / n if n else 0.5 * (w.pss_gib - w.worker_pss_gib)
        return cpu, w.pss_gib + per_worker * (k - n)

    def _try(self, moves: list[Setting], w: Window, direction: str, why: str) -> bool:
        """Start a trial of the first move not backed off nor past a budget; False when there is none."""
        now = time.monotonic()
        if direction == "up":
            self.host.read_pss(w)
        for new in moves:
            until = self.banned.get(new.key(), (0.0, 0.0))[0]
            if until > now:
                continue
            cpu, pss = self._predict(w, new)
            room, bound = self._cpu_room(w)
            if direction == "up" and new.num_workers > self.host.setting.num_workers and cpu > room:
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

    def _back_off(self, loser: Setting) -> float:
        """The setting that lost is not tried again for `backoff_s`, doubled at each loss."""
        back = 2 * self.banned.get(loser.key(), (0.0, self.backoff_s / 2))[1]
        self.banned[loser.key()] = (time.monotonic() + back, back)
        return back

    def _refused(self, new: Setting, why: str, reason: str):
        key = ("refused", new.key(), reason.split(":")[0])
        if key not in self.banned:  # said once per setting and budget
            self.banned[key] = (math.inf, 0.0)
            self.host.emit(
                f"{self.host.setting.short()} -> {new.short()} not made ({why}): {reason}",
                event="refused",
                to=new.kwargs(),
                reason=reason,
            )

    # ---- a move on trial ------------------------------------------------------------------------------------
    def _start_trial(self, new: Setting, before: Window, direction: str, why: str):
        self.host.read_pss(before)  # its workers, before they go
        t = time.perf_counter()
        # a run of moves down answers to where it started (three ties of -3% are not one of -9%), or to the window
        # before, when that was faster
        ref = max(self._down_ref or before, before, key=lambda x: x.rate) if direction == "down" else before
        self.trial = _Move(self.host.setting, new, direction, why, before, ref, self.host.windows, t, self.host.step)
        self.host.switch(new, [], self._warmup(new))

    def verdict(
        self, direction: str, ref: Window, after: Window, final: bool, drift: float = 0.0
    ) -> tuple[bool | None, float]:
        """Keep the move, revert it, or None: not yet clear of the noise (the 95% interval of the difference, from
        the chunks of both sides, or from `drift`, the standard error of the difference from the rates of each
        side's windows, where that is larger: a host whose speed drifts moves whole windows). Up: kept when it
        gains more than `min_gain` and the noise, reverted when it clearly gains less (or, at `settle_s`, when
        still unclear). Down: kept when it clearly loses less than `min_gain` against where the run of moves down
        started, reverted when it clearly loses more, or, at `settle_s`, when still unclear: a tie holds the
        setting, as a move up's does (too_many once kept a move down on a -0.4% inside its noise, and lost 13%
        side by side: issue 64)."""
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
                return False, margin
        return None, margin

    def _judge(self, trial: _Move, after: Window):
        """The move's verdict once it is clear of the noise; where the rates' change could be the host's drift
        (within REREAD_BAND either way), only after the old setting is read again beside it (`_reread`)."""
        if trial.candidate is not None:
            return self._reread(trial, after)
        drift = math.hypot(
            window_se(trial.before_windows) if trial.ref is trial.before else 0.0, window_se(trial.windows)
        )
        keep, margin = self.verdict(trial.direction, trial.ref, after, after.wall >= self.settle_s, drift)
        if keep is None:
            return  # the windows after the move go on
        if trial.ref.rate > 0 and 1 / REREAD_BAND < after.rate / trial.ref.rate < REREAD_BAND:
            trial.candidate, trial.candidate_windows = after, trial.windows
            trial.windows, trial.after = [], None
            self.host.switch(trial.old, [], self._warmup(trial.old))  # its windows now: the old setting's again
            return
        self._settle(trial, keep, margin, after, trial.ref)

    def _reread(self, trial: _Move, again: Window):
        """The old setting read again after the move (one window): the move is judged against the old setting's
        reads on both sides of it (`between`: the mean of their rates, the old setting as the host ran at the move's
        time), the spread of those reads and of the move's own windows as the drift (`verdict`), and settled."""
        ref = between(trial.ref, again)
        drift = math.hypot(window_se([*trial.before_windows, *trial.windows]), window_se(trial.candidate_windows))
        keep, margin = self.verdict(trial.direction, ref, trial.candidate, True, drift)
        self._settle(trial, keep, margin, trial.candidate, ref, again)

    def _settle(self, trial: _Move, keep: bool, margin: float, after: Window, ref: Window, again=None):
        old, new = trial.old, trial.new
        before = trial.before
        self.host.read_pss(after)
        over = self.ram_budget_gib is not None and after.pss_gib > self.ram_budget_gib
        over_cpu = (
            self.cpu_budget is not None and new.num_workers > old.num_workers and after.data_cpu > 1.1 * self.cpu_budget
        )
        if over or over_cpu:
            keep = False
        loser = old if keep else new
        back = self._back_off(loser)
        self.trial = None
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
            f"{'' if trial.ref is before else f'; against {trial.ref.rate:.2f} steps/s where the moves down began'}"
            f"{'' if again is None else f'; {old.short()} read again beside it: {again.rate:.2f} steps/s'}), "
            "workers' CPU "
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
            **({"reread": window_dict(again)} if again is not None else {}),
            "margin": round(margin, 3),
            "move_cost_s": round(cost, 3),
            "backoff_s": back,
        }
        self.changes.append(record)
        self._down_ref = ref if keep and trial.direction == "down" else None
        if trial.direction == "up":
            shortened = after.wait_share < 0.8 * before.wait_share
            self._wait_floor = 0.0 if keep or shortened else min(before.wait_share, after.wait_share)
            if self._wait_floor:  # those settings' wait was the hand-over, not their workers: no pace of theirs
                self.pace.forget(old.num_workers, new.num_workers)
        if again is not None:  # the old setting runs: back to the move where it is kept
            if keep:
                self.host.switch(new, trial.candidate_windows, self._warmup(new))
            else:
                self.host.switch(old, [*trial.before_windows, *trial.windows])
        elif keep:
            self.host.switch(self.host.setting, trial.windows)  # they measured the setting kept
        else:
            self.host.switch(old, trial.before_windows, self._warmup(old))
        self.host.emit(line, event="change", **record, setting=self.host.setting.kwargs())
        self.host.metric(100 * after.wait_share)
