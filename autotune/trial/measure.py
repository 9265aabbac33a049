"""Measuring a running training session: the timed window (synchronized at its
ends only, until its mean is known), NVML utilization, the separate profiled
window, FLOPs of a step. The trace is read by `autotune.trial.trace`; the two sides
(compute on a cached batch, the loader alone) by `autotune.trial.sides`; the
confidence intervals a window stops at are `autotune.stats`'.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass

from autotune.stats import gap_ci, percentile, t_rel_ci95
from autotune.trial.compiled import compile_seconds
from autotune.trial.memory import peak_rss_gib, reset_peak_rss
from autotune.trial.trace import analyze_trace

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


@dataclass
class WindowRule:
    """When the timed window stops: at least `min_steps` steps and `min_s` seconds,
    then as soon as the step-time mean is known to within ±`target_ci` (95%), or at
    `max_steps` / `max_s`, whichever comes first.

    With `prune_ms`, a window clearly slower than that stops early (`pruned`),
    decided on elapsed time as well as on the step count, so a window of a few
    slow steps is prunable too: at any step, a mean step (one step, even) above
    `hopeless_factor` x prune_ms; once the window has run `min_s`, a mean step
    above `slow_factor` x prune_ms; once it has run `min_s`, every 10 steps, and
    at the caps, a step-time mean (from 9 step times on) whose 95% CI lies
    wholly above prune_ms (before `min_s`, 10 steps of a fast config are ~0.1 s:
    its first steps after warm-up, not its rate; measured on the quickstart, such
    windows read 25-50% low, and 7 of 9 trials were pruned on them).

    With `screen_ms` (the step time a config must beat to become the incumbent:
    the incumbent's, less `search.min_improvement`), the window is a screening
    window: once it has run `min_s` (and 9 step times, before `min_steps`),
    every 10 steps, a step-time mean whose 95% CI (Student's t) lies wholly
    above screen_ms stops it (`screened`: this config cannot gain enough to move
    the incumbent, at 95%). Its throughput is a complete measurement, to a wider
    CI than the target. `screen_ci`: the incumbent's own relative CI, so the
    threshold is known to within it: a screen needs the window's CI wholly above
    screen_ms x (1 + screen_ci).

    With `promote_ci` too, the mirror rule: once the window has its floors
    (`min_steps`, `min_s`), every 10 steps, a step-time mean whose 95% CI (t)
    lies wholly below screen_ms x (1 - screen_ci), and is within a quarter of
    its lead below it (`stats.gap_ci`: at least ±promote_ci, at most ±GAP_CI_CAP),
    stops it (`promoted`: this config beats the incumbent by min_improvement,
    at 95%; its mean is known to that looser interval, not target_ci: on
    jpeg_pipeline a 1.3x lead ran its 30-s cap to reach ±4%).

    And where the incumbent itself is known only to ±screen_ci, wider than
    target_ci: a window whose CI still reaches into that band (above the
    promotion's threshold; one wholly above the screen's is screened) stops
    once its own CI is as narrow (`tied`: a tie with the incumbent, at the
    incumbent's precision: the two are compared to within both intervals, and
    a longer window narrows only its own). On jpeg_pipeline two windows inside
    the band ran their 30-s caps for ±4% and ±3% against an incumbent known to
    ±7%, and three just above it ran theirs for ±3.7-4.2% against ±5.5%.)"""

    min_steps: int = 30
    min_s: float = 1.0
    target_ci: float = 0.02
    max_steps: int = 3000
    max_s: float = 30.0
    prune_ms: float | None = None  # stop early once the mean step time is clearly above this
    screen_ms: float | None = None  # stop once the mean step time is known to be above this (cannot win)
    screen_ci: float = 0.0  # the incumbent's relative CI: screen_ms is known to within it
    promote_ci: float | None = None  # stop once the mean is known below screen_ms (wins), to within this
    slow_factor: float = 1.5
    hopeless_factor: float = 4.0
    settle: bool = True  # a still-falling step time extends the warm-up (Window.done); not where ranks step together
    pruned: bool = False
    screened: bool = False
    promoted: bool = False
    tied: bool = False

    def done(self, steps: int, elapsed: float, step_times, capped: bool = False) -> bool:
        """`capped`: at a cap counted from outside (a window that went on past a warm-up it dropped)."""
        capped = capped or steps >= self.max_steps or elapsed >= self.max_s
        if self.prune_ms and self._clearly_slow(
            steps, elapsed, step_times, check_ci=capped or (steps % 10 == 0 and elapsed >= self.min_s)
        ):
            self.pruned = True
            return True
        if capped:
            return True
        if steps % 10 or steps < min(self.min_steps, 10):
            return False
        times = step_times() if self.screen_ms and elapsed >= self.min_s else None
        if times:  # the step-time mean and its 95% CI (Student's t), for the screen and the promotion
            mean, ci = sum(times) / len(times), t_rel_ci95(times)
            if len(times) >= 9 and mean * (1 - ci) > self.screen_ms * (1 + self.screen_ci):
                self.screened = True  # cannot win, at 95%
                return True
        if steps < self.min_steps or elapsed < self.min_s:
            return False
        if not times:
            ci = t_rel_ci95(step_times())
        elif self.promote_ci:
            bar = self.screen_ms * (1 - self.screen_ci)
            if mean * (1 + ci) < bar and ci <= gap_ci(bar / mean - 1, self.promote_ci):
                self.promoted = True  # wins, at 95%, its mean known to a quarter of its lead
                return True
            if mean * (1 + ci) >= bar and ci <= self.screen_ci:
                self.tied = True  # reaching into the incumbent's own uncertainty, and known as well as it
                return True
        return ci <= self.target_ci

    def _clearly_slow(self, steps: int, elapsed: float, step_times, check_ci: bool) -> bool:
        mean_ms = elapsed / steps * 1e3  # the host clock over the steps run (on a GPU it runs ahead: never too high)
        if mean_ms > self.hopeless_factor * self.prune_ms:
            return True
        if elapsed >= self.min_s and mean_ms > self.slow_factor * self.prune_ms:
            return True
        if check_ci:
            times = step_times()
            return len(times) >= 9 and sum(times) / len(times) * (1 - t_rel_ci95(times)) > self.prune_ms
        return False


class Window:
    """The timed window, fed step by step: `start()` synchronizes the device and
    starts the clock; `step_done(samples, data_wait_s)` marks the end of each
    step (which `done()` then asks the rule about: the host clock decides, no
    sync in the loop); `finish(loss)` synchronizes again and returns the
    metrics. Per-step times are CUDA events recorded at the step boundaries on
    a GPU (read when complete, no sync) and host intervals on a CPU. The one
    timing path of both the built-in trial (`timed_window` pulls its steps) and
    a user's own program (`autotune.trial.loop`, which pushes them).

    The window never includes compile: the seconds torch spent compiling before it started are its `compile_s`
    (autotune.trial.compiled), and a step that compiled (a recompile: a new shape, a graph break's new frame) ends
    what came before it: those steps are warm-up (`window_recompiled_steps`, `_s`), dropped for good, and the window
    starts again after it (its caps still count from its first start)."""

    def __init__(self, rule: WindowRule, device_type: str, sync, device=None):
        self.rule, self.cuda, self.sync, self.device = rule, device_type == "cuda", sync, device
        self.clock = time.perf_counter
        self.marks: list[float] = []  # the window's start, then the end of each step
        self.events: list = []
        self.waits: list[float] = []  # each step's data wait (s) and samples, and the process's CPU time at each mark
        self.counts: list[int] = []
        self.tokens: list = []  # a language model's: each step's tokens and sequences (autotune.trial.tokens)
        self.seqs: list = []
        self.padded: list = []  # ... and the token slots its batches held, padding included
        self.cpu: list[float] = []
        # steps still warming up, held out of the window (`done`), and given back if it never settles
        self.dropped_steps, self.dropped_s, self.unsettled, self._drops = 0, 0.0, False, 0
        self._held: dict[str, list] = {name: [] for name in _PER_MARK}
        self.compiled_s = 0.0  # torch's compile seconds at the window's (latest) start
        self.recompiled_steps, self.recompiled_s = 0, 0.0  # steps that compiled, and those before them: dropped

    def _event(self) -> None:
        if self.cuda:
            import torch

            self.events.append(torch.cuda.Event(enable_timing=True))
            self.events[-1].record()

    def step_times(self) -> list[float]:  # ms, of the steps known to be complete
        if not self.cuda:  # a CPU step has ended when the rule asks: the rule decides on every step it records
            return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]
        done = 0
        while done < len(self.events) and self.events[done].query():
            done += 1
        return [self.events[i].elapsed_time(self.events[i + 1]) for i in range(done - 1)]

    @property
    def steps(self) -> int:
        return max(len(self.marks) - 1, 0)

    def start(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
        reset_peak_rss()
        from autotune.trial.disturbance import CpuWatch

        self.outside = CpuWatch()  # load from outside the trial during the window
        self.util = GpuUtilSampler(enabled=self.cuda).__enter__()
        self.sync()
        self.outside.start()
        self.compiled_s = compile_seconds()
        self.cpu = [time.process_time()]
        self.marks = [self.clock()]
        self._event()

    def step_done(self, samples: int, data_wait_s: float = 0.0, tokens=None, sequences=None, padded=None) -> None:
        """`tokens`: a language model's step's tokens (None: not counted), in `sequences` (default: `samples`);
        `padded`: the token slots its batches held, padding included (autotune.trial.tokens.padded). A count
        may be a device tensor (summed, and read at `finish`, after its sync)."""
        self.marks.append(self.clock())
        self._event()
        self.cpu.append(time.process_time())
        self.counts.append(samples)
        self.waits.append(data_wait_s)
        self.tokens.append(tokens)
        self.seqs.append(samples if sequences is None else sequences)
        self.padded.append(padded)

    def done(self) -> bool:
        """The rule's answer, on the window since its (latest) start; its caps count from the first start.
        Where the rule could end it first: a window whose step time is still falling is a warm-up; its first half
        is held out and it goes on, to the floors again (`_still_warming`). A window that has not settled after
        WARM_DROPS_MAX such halves, or by its caps, is not warming up (a cycle of batch costs, a drift): the held
        steps are given back."""
        if self.steps == 0:
            return False
        if compile_seconds() > self.compiled_s:  # a step compiled: what ran so far is warm-up (class doc)
            self._drop_compiled()
            return False
        rule, now = self.rule, self.clock()
        before = self.dropped_steps + self.recompiled_steps, self.dropped_s + self.recompiled_s
        capped = before[0] + self.steps >= rule.max_steps or before[1] + now - self.marks[0] >= rule.max_s
        if capped and self.dropped_steps:
            self._give_back()
        elif rule.settle and not self.unsettled and not capped and self._floors_met(now):
            if _still_warming(self.step_times()):
                if self._drops == WARM_DROPS_MAX:
                    self._give_back()
                else:
                    self._hold_first_half()
                    return False
        return rule.done(self.steps, now - self.marks[0], self.step_times, capped)

    def _floors_met(self, now: float) -> bool:
        """Where the rule could end the window (its floors, on the window since its latest start), every 10 steps."""
        rule = self.rule
        return self.steps % 10 == 0 and self.steps >= rule.min_steps and now - self.marks[0] >= rule.min_s

    def _drop_compiled(self) -> None:
        """Every step so far out of the window for good, the held ones too (the last of them compiled)."""
        self.recompiled_steps += self.dropped_steps + self.steps
        self.recompiled_s += self.dropped_s + self.marks[-1] - self.marks[0]
        for name in _PER_MARK:  # the last mark (and its event, its CPU time) starts the window again
            values = getattr(self, name)
            del values[: len(values) - 1 if name in ("marks", "events", "cpu") else len(values)]
            self._held[name] = []
        self.dropped_steps, self.dropped_s, self._drops = 0, 0.0, 0
        self.compiled_s = compile_seconds()

    def _hold_first_half(self) -> None:
        half = self.steps // 2
        self.dropped_steps += half
        self.dropped_s += self.marks[half] - self.marks[0]
        self._drops += 1
        for name in _PER_MARK:
            values = getattr(self, name)
            self._held[name] += values[:half]
            del values[:half]

    def program_ended(self, min_steps: int, min_s: float) -> bool:
        """The program's loop ended with the window open: whether it meets these floors. Like a cap, the end gives
        back the halves held out as warm-up (`_hold_first_half`) where the settled part alone falls short."""

        def met() -> bool:
            return self.steps >= min_steps and self.clock() - self.marks[0] >= min_s

        if not met() and self.dropped_steps:
            self._give_back()
        return met()

    @property
    def all_steps(self) -> int:
        """The steps since the window first started: those held out or dropped as warm-up included."""
        return self.steps + self.dropped_steps + self.recompiled_steps

    def _give_back(self) -> None:
        for name in _PER_MARK:
            setattr(self, name, self._held[name] + getattr(self, name))
        self.dropped_steps, self.dropped_s, self.unsettled = 0, 0.0, True

    def finish(self, loss=None) -> dict[str, float]:
        import torch

        self.sync()
        t0 = self.marks[0]
        window = self.clock() - t0
        cpu = time.process_time() - self.cpu[0]
        disturbed = self.outside.stop(window)
        self.util.__exit__(None, None, None)
        steps = self.steps
        if self.cuda:
            steps_ms = [self.events[i].elapsed_time(self.events[i + 1]) for i in range(steps)]
        else:  # the last step ends where the window does (its end includes the final sync)
            steps_ms = [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:-1] + [t0 + window])]
        ordered = sorted(steps_ms)
        mean_ms = sum(steps_ms) / steps
        metrics = {
            "samples_per_s": float(sum(self.counts)) / window,  # a count may be a device tensor (loop._step)
            "steps_per_s": steps / window,
            "step_ms_mean": window / steps * 1e3,
            "step_ms_p50": percentile(ordered, 0.5),
            "step_ms_p95": percentile(ordered, 0.95),
            "step_ms_min": ordered[0],
            "step_ms_max": ordered[-1],
            "step_time_cv": math.sqrt(sum((x - mean_ms) ** 2 for x in steps_ms) / max(steps - 1, 1)) / mean_ms,
            "step_mean_ci95": t_rel_ci95(steps_ms),  # Student's t: a window may be 10 steps
            "data_wait_frac": sum(self.waits) / window,
            "cpu_main_cores": cpu / window,  # CPU-seconds per second of the training process (not its workers)
            "window_s": window,
            # when the window ran (its middle, Unix seconds): where the search reads its reference for this trial
            # (autotune.decide.reference: the host's speed drifts, and a ratio is taken against the baseline then)
            "window_mid_unix": time.time() - window / 2,
            "window_steps": steps,
            "mem_rss_peak_gib": peak_rss_gib(),  # the training process's, over the window (not its loader workers)
            **disturbed,  # host_other_cpu_frac
        }
        metrics.update(self._tokens(window, steps))
        if self.dropped_steps:  # the warm-up went on into the window: those steps are the warm-up's
            metrics["warmup_extended_steps"], metrics["warmup_extended_s"] = self.dropped_steps, self.dropped_s
        if self.unsettled:  # its step time fell and fell: the whole window counts, as if none were held out
            metrics["window_unsettled"] = 1.0
        compiled = compile_seconds()
        if compiled:  # torch.compile's seconds in this process before the window: set-up and warm-up's
            metrics["compile_s"] = compiled
        if self.recompiled_steps:  # steps that compiled in the window, and those before them: warm-up
            metrics["window_recompiled_steps"], metrics["window_recompiled_s"] = (
                self.recompiled_steps,
                self.recompiled_s,
            )
        if loss is not None:
            metrics["loss_last"] = float(loss.detach().float()) if isinstance(loss, torch.Tensor) else float(loss)
        if self.cuda:
            from autotune.trial.disturbance import gpu_other_processes

            dev = self.device if self.device is not None else torch.device("cuda", torch.cuda.current_device())
            others = gpu_other_processes(dev.index or 0)
            if others is not None:
                metrics["gpu_other_processes"] = others
            metrics["mem_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
            metrics["mem_peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
            metrics["mem_device_gib"] = torch.cuda.get_device_properties(dev).total_memory / 2**30
            if self.util.mean() is not None:
                metrics["gpu_util_nvml_pct"] = self.util.mean()
        return metrics

    def _tokens(self, window: float, steps: int) -> dict[str, float]:
        """A language model's window (every step's tokens counted): tokens/s, tokens a step, and the mean length
        of a sequence (the attention term's, autotune.trial.tokens.flops_per_token). {} otherwise."""
        if not self.tokens or any(t is None for t in self.tokens):
            return {}
        tokens, sequences = float(sum(self.tokens)), float(sum(self.seqs))
        slots = float(sum(self.padded)) if self.padded and None not in self.padded else None
        return {
            "tokens_per_s": tokens / window,
            "tokens_per_step": tokens / steps,
            **({"seq_len_mean": tokens / sequences} if sequences else {}),
            # the share of the padded batches' token slots that were padding: compute padding-free rows skip
            **({"padding_frac": max(0.0, 1 - tokens / slots)} if slots else {}),
        }


# A warm-up that goes on into the window. The window's mean is taken once the step time stops falling: where the rule
# could end a window (its floors met), one whose first half's mean step is slower than its second half's by more than
# WARM_DRIFT and the two halves' 95% intervals together gives its first half to the warm-up and goes on (at most to
# the rule's caps, counted from the window's first start). hf_bert's baseline (batch 4, the main process
# tokenizing, 2-core CPU) ran ~20% slower over its first ~100 steps than over steps 30-300 (192.5 against 237-239
# samples/s), past a 5-step warm-up: its trials read 173-188, and the search claimed 3.24x where the program itself
# showed 2.09-2.14x (with this rule: 2.09x claimed, 2.04x +-0.18 shown).
WARM_DRIFT = 0.05
# At most this many halves held out: hf_bert's baseline settled after 55 steps held (2-3 halves); under
# group_by_length (each megabatch of 50 batches, longest first) the halves fell every 10 steps, and holding 210 steps
# out kept a cheap end of a cycle: batch 16 read 748 samples/s (batch 32 598, batch 16 sampled at random 395).
WARM_DROPS_MAX = 3
_PER_MARK = (
    "marks",
    "events",
    "cpu",
    "counts",
    "waits",
    "tokens",
    "seqs",
    "padded",
)  # a window's lists, step by step (held out together)
WARM_HALF_MIN = 5  # steps in each half, at least, for the comparison (Student's t of 4 degrees of freedom)


def _still_warming(times: list[float]) -> bool:
    """Whether the step time still falls across a window (its step times, in order)."""
    half = len(times) // 2
    if half < WARM_HALF_MIN:
        return False
    first, second = times[:half], times[-half:]
    drift = (sum(first) / half) / (sum(second) / half) - 1
    return drift > max(WARM_DRIFT, math.hypot(t_rel_ci95(first), t_rel_ci95(second)))


def loader_queue(loader) -> int:
    """The batches a DataLoader has in flight once its iterator starts: num_workers x prefetch_factor (torch's
    default 2), 0 without workers. Those batches are made before the first step asks for them, so a window that
    starts before the warm-up has taken them reads its queue, not its loader: a loader-fed window starts once the
    queue has turned over once (the warm-up runs at least this many steps). Issue 40: two loader-fed configs'
    order flipped between short and long windows; issue 53: 2 workers x 2 batches are 4 of a 10-step window."""
    return queue_batches(getattr(loader, "num_workers", 0), getattr(loader, "prefetch_factor", None))


def queue_batches(num_workers: int | None, prefetch_factor: int | None) -> int:
    """`loader_queue` of a loader with these settings."""
    return num_workers * (prefetch_factor or 2) if num_workers and num_workers > 0 else 0


def timed_window(session, batches, rule: WindowRule) -> dict[str, float]:
    """Time steps of a built-in session (`Window`): each pulls its batch (the
    wait at `next()` is data wait) and runs `session.step`; its samples, and a language model's tokens, are
    counted on the loader's batch, on the host, before the step moves it."""
    from autotune.trial.tokens import padded
    from autotune.workload import count_samples, count_tokens

    window, clock = Window(rule, session.device.type, session.sync, session.device), time.perf_counter
    window.start()
    loss = None
    while not window.done():
        fetch = clock()
        batch = next(batches)
        wait = clock() - fetch
        samples, tokens = count_samples(session.workload, batch), count_tokens(session.workload, batch)
        loss = session.step(batch)
        window.step_done(samples, wait, *(tokens or (None, None)), padded=padded(batch) if tokens else None)
    return window.finish(loss)


def profile_window(session, batches, active_steps: int, trace_path: str) -> dict:
    """A separate, short profiled window (wait 1, warm-up 1, active N steps); the
    Chrome trace is written to `trace_path` and analyzed. The device is
    synchronized at both ends of the active steps, as in the timed window: the
    first step carries no earlier step's kernels, and the last steps' kernels
    finish before the profiler stops."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if session.device.type == "cuda" else [])
    with profile(
        activities=activities,
        schedule=schedule(wait=1, warmup=1, active=active_steps),
        on_trace_ready=lambda p: p.export_chrome_trace(trace_path),
    ) as prof:
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


def phase_clock(result, started: float):
    """`phase(name, until=now)`: the seconds since the last phase ended (the
    trial's start first) go to `result.phases_s[name]` (a TrialResult)."""
    if result.phases_s is None:
        result.phases_s = {}
    phases, last = result.phases_s, [started]

    def phase(name: str, until: float | None = None) -> None:
        until = time.perf_counter() if until is None else until
        phases[name] = round(until - last[0], 4)
        last[0] = until

    return phase


FLOPS_FILE = "flops.json"


def flops_per_sample(session, batch, samples: int, path: str | None, key: dict) -> float:
    """`count_flops` per sample, once per search for each `key` (what determines
    them: the workload and its arguments, the batch size, activation
    checkpointing): kept in the JSON file at `path` (FLOPS_FILE in the run dir)
    for the search's later trials. Where `path`'s directory does not exist (a
    trial on another node, or run alone), counted here every time."""
    name = json.dumps(key, sort_keys=True, default=str)
    known = {}
    if path and os.path.exists(path):
        try:
            known = json.loads(open(path).read())
        except (OSError, ValueError):  # a foreign or partial file: count again
            known = {}
    if name in known:
        return float(known[name])
    flops = count_flops(session, batch) / samples
    if path and os.path.isdir(os.path.dirname(os.path.abspath(path))):
        tmp = f"{path}.{os.getpid()}.tmp"  # the rename makes it whole or absent (a lost race only counts again)
        with open(tmp, "w") as f:
            json.dump({**known, name: flops}, f)
        os.replace(tmp, path)
    return flops
