"""The measured loop of a user's own training program (`cfg.steps`, `cfg.step`,
`cfg.data` of `autotune.config()`), in a trial: the measurement rules of
docs/design.md on the program's own steps. Untimed warm-up; then the timed window
(`measure.Window`, the built-in trial's own: the device synchronized at its two
ends only, the rule deciding on the host clock); data wait measured at the
loader's `next()` (`steps`) or inside `with cfg.data():`; each step's loss kept
(detached, read after the window). Once the window is done, the
trial's `TrialResult` goes to `<trial dir>/result.json` and the process ends
(`os._exit(0)`: no teardown, final save or eval of the program runs).

With several ranks (`resources.ranks_per_trial`; the launcher starts one process
a rank under torchrun's environment), each rank runs this loop in the program's
own process group: a fixed warm-up, then the same window on every rank, as the
built-in trial's ranks (`autotune.trial.ranks`): its step count agreed after
warm-up (an all-reduce), a barrier at its two ends (so it is the slowest rank's);
each rank writes rank<R>.json, which the launcher merges.

A parity run (the late loss-parity check, `autotune.safety.program_parity`)
has no window: seeded, it runs `parity.steps` steps from the first, keeps each
loss, and, for a noise run, perturbs the model the program handed over
(`watch`) before every step.

Needs torch only. A program that reaches its first step leaves `first_step` in
its trial dir, so the launcher can tell "never called steps/step" from a crash.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import socket
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any, Iterable

from autotune.trial import measure as M
from autotune.trial import ranks as R
from autotune.trial.request import check_config, window_rule
from autotune.trial.result import DeviceInfo, TrialResult
from autotune.trial.tokens import batch_samples
from autotune.trial.tokens import count as count_tokens
from autotune.trial import progress
from autotune.trial.tokens import flop_metrics, padded
from autotune.trial.progress import FIRST_STEP_FILE  # written at the program's first step

STEP_LOG_ENV, STOP_AFTER_ENV = "AUTOTUNE_STEP_LOG", "AUTOTUNE_STOP_AFTER"  # production: time the steps (benchmarks)
LOSSES_KEPT = 200  # the loss trajectory reported: the first steps (parity compares the first `parity.steps`)


class PassThrough:
    """Production and plain modes: the loop as the program wrote it. With
    `AUTOTUNE_STEP_LOG=path` (scripts/bench/bench_program.py), each step's end and
    samples are kept and written to `path` as JSON when the process ends, or
    after `AUTOTUNE_STOP_AFTER` steps, where it then ends (os._exit)."""

    def __init__(self):
        self.log = os.environ.get(STEP_LOG_ENV)
        self.stop_after = int(os.environ.get(STOP_AFTER_ENV) or 0)
        self.marks: list[float] = []
        self.samples: list[int] = []
        self.tokens: list = []  # a language model's (None: a step without them)
        self.explicit = False
        self.claimed = False  # the program or a framework reports its own steps: torch's hooks stand down
        if self.log:
            atexit.register(self._write)

    def claim(self) -> None:
        self.claimed = True

    def steps(self, iterable: Iterable):
        self.claim()
        if not self.log:
            return iter(iterable)
        return self._steps(iterable)

    def _steps(self, iterable):
        previous = None
        for batch in iterable:
            if previous is not None and not self.explicit:
                self._mark(batch_samples(previous), (count_tokens(previous) or (None,))[0])
            previous = batch
            yield batch

    def step(self, samples: int | None = None, loss=None, tokens=None, slots=None) -> None:
        self.explicit = self.claimed = True
        if self.log:
            self._mark(samples, tokens)  # a device tensor is read when the log is written

    def hooked_step(self, samples, loss=None, tokens=None, sequences=None, slots=None) -> None:
        """An optimizer step as torch's hooks saw it (autotune.instrument._torch), where nothing claims them."""
        if self.log and not self.claimed:
            self._mark(samples, tokens)

    def hooked_wait(self, seconds: float) -> None:
        pass

    def data(self):
        return contextlib.nullcontext()

    def watch(self, model) -> None:
        pass

    def _mark(self, samples, tokens=None) -> None:
        self.marks.append(time.perf_counter())
        self.samples.append(1 if samples is None else samples)
        self.tokens.append(tokens)
        if self.stop_after and len(self.marks) >= self.stop_after:
            self._write()
            sys.stdout.flush()
            os._exit(0)

    def _write(self) -> None:
        # ranks step together: rank 0's log is the job's (each rank stops); a process that stepped nothing (a
        # launcher's agent: torchrun's imports torch too) leaves it alone
        if os.environ.get("RANK", "0") != "0" or not self.marks:
            return
        samples = [int(s) or 1 for s in self.samples]
        log = {"marks": self.marks, "samples": samples}
        # a language model's, every step counted (but the first, where torch's hooks found the model in its forward)
        if self.tokens and all(t is not None for t in self.tokens[1:]):
            log["tokens"] = [None if t is None else int(t) for t in self.tokens]
        Path(self.log).write_text(json.dumps(log))


class TrialLoop:
    """A trial's measured loop over the program's steps (see the module doc).
    `request`: the trial config (python -m autotune.trial's JSON); `trial_dir`:
    where result.json goes; `used`: the config's usage record (method names),
    read when the result is written, with `cannot` and `own` (what the program's
    model cannot take and runs with on its own: autotune.config.Config)."""

    def __init__(
        self,
        request: dict[str, Any],
        trial_dir: Path,
        used: set[str],
        device_type: str,
        cannot: dict[str, str] | None = None,
        own: dict[str, Any] | None = None,
    ):
        self.cfg = check_config(request)
        self.dir, self.used, self.device_type = trial_dir, used, device_type
        self.cannot, self.own = {} if cannot is None else cannot, {} if own is None else own
        self.clock = time.perf_counter
        self.started = self.clock()
        self.knobs = dict(request.get("knobs") or {})  # the knobs this trial sets (the rest: the program's own)
        self.warm, self.warm_samples, self.warm_started, self.loop_started = 0, 0, None, None
        self.warm_known = 0  # warm-up steps whose samples are known (their pace sets the window's rule)
        self.warm_tokens = 0  # a language model's tokens in the warm-up (None: a step without them)
        self.fetched = None  # (samples, tokens, sequences) of the batches steps() gave since the last step
        self.window: M.Window | None = None
        self.wait, self.wait_measured = 0.0, False
        self.losses: list = []
        self.last_loss = None
        self.explicit = False  # the program calls step() itself: steps() adds none
        self.claimed = False  # the program or a framework reports its steps: torch's hooks stand down (claim)
        self.hooked = 0  # steps torch's hooks reported (autotune.instrument._torch)
        self.timed_by_program = False  # the program times its data wait itself (`data`)
        self.ended = False
        self.ended_by_program = False  # the program ended with a window that had met its floors (_ended_early)
        self.ranks = self.cfg["ranks"] if R.launched(self.cfg["ranks"]) and self.cfg["ranks"] > 1 else 1
        self.rank = int(os.environ["RANK"]) if self.ranks > 1 else 0
        self.out = self.dir / (R.RANK_FILE.format(self.rank) if self.ranks > 1 else "result.json")
        # a parity run (safety.program_parity): `steps` steps from the seed, each loss kept, no window
        self.parity_run = self.cfg["parity"] if self.cfg["parity_only"] else None
        self.model, self.noise, self.perturbed = None, None, False
        self.random = False  # the watched model draws random numbers in training (program_parity.draws_random)
        if self.parity_run is not None:
            self._seed()
        self.queue = 0  # the batches its loaders' workers make ahead (measure.loader_queue): the warm-up's floor
        self._watch_loaders()
        atexit.register(self._ended_early)
        sys.excepthook = self._raised

    def _watch_loaders(self) -> None:
        """Each DataLoader this trial's program iterates (its own loop's, a Trainer's): the largest queue of
        batches its workers make ahead, which the warm-up takes before the window starts (`_warm`): a window on
        them reads the queue, not the loader."""
        from torch.utils.data import DataLoader

        loop, iterate = self, DataLoader.__iter__

        def __iter__(loader):
            loop.queue = max(loop.queue, M.loader_queue(loader))
            return iterate(loader)

        DataLoader.__iter__ = __iter__

    # --- what the program calls ---------------------------------------------------

    def claim(self) -> None:
        """The program (`steps`, `step`, `data`) or a framework's callback reports the steps from here: what torch's
        hooks reported before (the first step, at most: an explicit `step()` comes after the optimizer's) is
        forgotten, and the warm-up starts again."""
        if self.claimed:
            return
        self.claimed = True
        if self.hooked and self.window is None and self.parity_run is None:
            self.warm, self.warm_samples, self.warm_tokens, self.warm_known = 0, 0, 0, 0
            self.losses.clear()
            self.wait, self.wait_measured = 0.0, False
        self.hooked = 0

    def hooked_step(self, samples, loss=None, tokens=None, sequences=None, slots=None) -> None:
        """An optimizer step as torch's hooks saw it (autotune.instrument._torch): its samples, loss, a language
        model's tokens, sequences and token slots, padding included (None each: unknown); nothing where the steps
        are claimed."""
        if self.claimed:
            return
        self.hooked += 1
        self._step((samples, tokens, sequences, slots), loss, known=samples is not None)

    def hooked_wait(self, seconds: float) -> None:
        """Time in a DataLoader iterator's `next()`, as torch's hooks saw it: data wait, where nothing claims it."""
        if not self.claimed and not self.timed_by_program:
            self.wait += seconds
            self.wait_measured = True

    def steps(self, iterable: Iterable):
        """Each batch of `iterable`, the wait at `next()` as data wait; a step ends
        at the next batch unless the program calls `step()` itself."""
        self.claim()
        self.wait_measured = True
        if self.loop_started is None:  # the warm-up starts with the loader, as the built-in trial's does
            self.loop_started = self.clock()
        it = iter(iterable)
        previous = None
        while True:
            if previous is not None and not self.explicit:
                self._step(self._take(), None)
            fetch = self.clock()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.wait += self.clock() - fetch
            self._fetched(batch)
            previous = batch
            yield batch

    def _fetched(self, batch) -> None:
        """A batch steps() gives: its samples and a language model's tokens (autotune.trial.tokens.count, on the
        batch's device: no host sync) and token slots (`padded`), added up until the step that trains on them."""
        samples, counted = batch_samples(batch), count_tokens(batch)
        tokens, sequences = counted or (None, None)
        counts = (samples, tokens, sequences, padded(batch) if counted else None)
        self.fetched = counts if self.fetched is None else tuple(_add(a, b) for a, b in zip(self.fetched, counts))

    def _take(self) -> tuple:
        """(samples, tokens, sequences, slots) of the batches steps() gave since the last step (None each: none)."""
        fetched, self.fetched = self.fetched or (None, None, None, None), None
        return fetched

    def data(self):
        """`with cfg.data(): batch = get_batch()`: the time inside is data wait (a DataLoader's `next()` that
        torch's hooks time is then not counted again: the program times its own)."""
        self.timed_by_program = self.wait_measured = True
        return self._waiting()

    @contextlib.contextmanager
    def _waiting(self):
        fetch = self.clock()
        try:
            yield
        finally:
            self.wait += self.clock() - fetch

    def step(self, samples: int | None = None, loss=None, tokens=None, slots=None) -> None:
        """The end of one optimizer step: `samples` it trained on, a language model's `tokens` and the token
        `slots` of its batches, padding included, its `loss`. A count left out is the batches' that `steps()` gave
        since the last step, where it gave any."""
        self.claim()
        self.explicit = True
        fetched = self._take()
        mine = (tokens, None, slots) if tokens is not None else fetched[1:]
        self._step((fetched[0] if samples is None else samples, *mine), loss)

    def watch(self, model) -> None:
        """The program's model (cfg.prepare, cfg.wrap, cfg.watch, the Trainers' callbacks): a parity noise run
        perturbs its weights before every step, from before the first."""
        if self.model is not None:
            return
        self.model = model
        if self.parity_run is not None:
            from autotune.safety.program_parity import draws_random

            self.random = draws_random(model)
        noise = (self.parity_run or {}).get("noise")
        if noise and self.warm == 0:
            import torch

            self.noise = torch.Generator().manual_seed(noise["seed"])
            self.perturbed = True
            self._perturb()

    # --- a parity run (autotune.safety.program_parity) --------------------------------

    def _seed(self) -> None:
        """Every parity run of a search starts from the same seed: torch's, Python's and numpy's generators (a
        program that seeds itself sets its own over it); compiled code draws eager code's random numbers
        (dropout), as the built-in parity's does (safety.stepping)."""
        import random

        import torch

        seed = self.cfg["seed"]
        torch.manual_seed(seed)
        random.seed(seed)
        try:
            import numpy

            numpy.random.seed(seed)
        except ImportError:
            pass
        if self.knobs.get("compile", "none") != "none":
            import torch._inductor.config as inductor

            inductor.fallback_random = True

    def _perturb(self) -> None:
        from autotune.safety.program_parity import perturb

        perturb(self.model, self.parity_run["noise"]["level"], self.noise)

    def _parity_step(self) -> None:
        if self.noise is not None:
            self._perturb()
        if self.warm >= self.parity_run["steps"]:
            self._write(self._parity_result())

    def _parity_result(self) -> TrialResult:
        metrics = {
            "parity_steps_run": float(self.warm),
            "parity_perturbed": float(self.perturbed),
            "parity_random": float(self.random),
        }
        return self._result("ok", metrics=metrics)

    # --- the measurement ------------------------------------------------------------

    def _step(self, counts: tuple, loss, known: bool = True) -> None:
        """One step done: its `counts` (samples, tokens, sequences, token slots: None each where unknown);
        `known`: its counts are (a step torch's hooks saw before they found the model is not: the warm-up's pace
        leaves it out)."""
        samples, tokens, sequences, slots = counts
        if samples is None:
            samples = 1
        elif getattr(samples, "device", None) is None or samples.device.type == "cpu":
            samples = int(samples)
        if getattr(tokens, "device", None) is not None and tokens.device.type == "cpu":
            tokens = int(tokens)
        # else a tensor on the device (a padding-free batch's count): summed, and read where the window ends
        # (measure.Window.finish), after the device is synchronized there: no host sync per step
        if loss is not None:
            self.last_loss = loss.detach() if hasattr(loss, "detach") else float(loss)
            if len(self.losses) < LOSSES_KEPT:
                self.losses.append(self.last_loss)
        wait, self.wait = self.wait, 0.0
        progress.beat()  # the launcher's watch sees the steps come (a counter and a clock read)
        if self.parity_run is not None:
            self.warm += 1
            self._first_step()
            return self._parity_step()
        if self.window is not None:
            self.window.step_done(samples, wait, tokens, sequences, slots)
            if self.window.done():
                self._finish()
            return
        self.warm += 1
        if known:
            self.warm_known += 1
            self.warm_samples += samples
            self.warm_tokens = None if tokens is None or self.warm_tokens is None else self.warm_tokens + tokens
        self._first_step()
        if self._warm():
            self._start_window()

    def _first_step(self) -> None:
        if self.warm == 1:
            (self.dir / FIRST_STEP_FILE).write_text(f"{self.clock() - self.started:.3f}\n")
            self.first_step_s = self.clock() - self.started
            self.warm_started = self.clock()

    def _warm(self) -> bool:
        cfg = self.cfg
        if self.warm < self.queue:  # its loader's queue has not turned over once (measure.loader_queue)
            return False
        if self.warm >= cfg["warmup_steps"]:
            return True
        short = (
            cfg["warmup_min_s"] is not None
            and self.device_type == "cpu"
            and self.knobs.get("compile", "none") == "none"
        )
        return short and self.ranks == 1 and self.warm >= 2 and self.clock() - self.warm_started >= cfg["warmup_min_s"]

    def _start_window(self) -> None:
        import torch

        # the rule's thresholds are in the search's unit (result.unit_of): a language model's tokens/s, else samples/s
        per_step = float(self.warm_samples if self.warm_tokens is None else self.warm_tokens) / max(1, self.warm_known)
        # the warm-up's time: from the loader's start (steps()), else from the first step's end (step())
        self.warmup_s = self.clock() - (self.loop_started or self.warm_started)
        rule = window_rule(self.cfg, per_step, self.device_type)
        cuda = self.device_type == "cuda"
        grouped = self.ranks > 1 and R.world_size() > 1  # the program's own process group

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize()
            if grouped:
                torch.distributed.barrier()

        if grouped:  # the same window on every rank: min_window_s at the warm-up's pace (its first step left out)
            step_s = (self.clock() - self.warm_started) / (self.warm - 1) if self.warm > 1 else None
            rule = R.fixed_rule(R.window_steps(step_s, self.cfg, rule.max_steps, self.device_type))
        self.window = M.Window(rule, self.device_type, sync)
        self.window.start()

    def _losses(self) -> list[float]:
        return [float(x) for x in self.losses]

    def _device_name(self) -> str:
        import torch

        return torch.cuda.get_device_name() if self.device_type == "cuda" else "cpu"

    def _result(self, status: str, **extra) -> TrialResult:
        import torch

        return TrialResult(
            status=status,
            knobs=self.knobs,
            device=DeviceInfo(
                self.device_type,
                self._device_name(),
                len(os.sched_getaffinity(0)),
                torch.get_num_threads(),
            ),
            host=socket.gethostname(),
            torch=str(torch.__version__),  # a str, not torch's TorchVersion (which YAML cannot write)
            used=sorted(self.used),
            cannot=dict(self.cannot) or None,
            own_knobs=dict(self.own) or None,
            losses=self._losses(),
            trial_s=self.clock() - self.started,
            **extra,
        )

    def _finish(self) -> None:
        window, rule = self.window, self.window.rule
        metrics = {
            **window.finish(self.last_loss),
            "warmup_s": self.warmup_s,  # the warm-up's steps; any that went on into the window: warmup_extended_*
            "warmup_steps_run": self.warm,
            "first_step_s": self.first_step_s,
        }
        # a language model's FLOPs per token and MFU, from the model the program handed over (cfg.prepare/wrap/watch)
        metrics.update(flop_metrics(self.model, metrics, self._device_name(), self.knobs.get("precision")))
        extra = {}
        if not self.wait_measured:
            metrics.pop("data_wait_frac")
            extra["data_wait"] = (
                "unknown: the program iterates no DataLoader (its batches come from its own code; "
                "`with cfg.data():` around it times it)"
            )
        if self.ended_by_program:
            metrics["window_ended_by_program"] = 1.0
        for mark in ("screened", "promoted", "tied"):
            if getattr(rule, mark):
                metrics[mark] = 1.0
        status = "pruned" if rule.pruned else "ok"
        if not math.isfinite(metrics.get("loss_last", 0.0)):
            status, extra = "error", {**extra, "error_type": "NonFiniteLoss", "error": "the loss is NaN or inf"}
        if status == "ok" and self.cfg["diagnose"]:  # what its window says: the data wait, a language model's facts
            from autotune.trial.diagnose import diagnose_program

            extra["diagnosis"] = diagnose_program(metrics, {**self.own, **self.knobs}, self.device_type == "cuda")
        self._write(self._result(status, metrics=metrics, **extra))

    def _save(self, result: TrialResult) -> None:
        """result.json, the contract checked; a rank's rank<R>.json (for the launcher's merge, `ranks.collect`)."""
        if self.ranks > 1:
            result.rank, result.ended_unix = self.rank, time.time()
        result.write(self.out)

    def _write(self, result: TrialResult) -> None:
        self.ended = True
        if result.status == "ok" and (result.metrics or {}).get("compile_s") and self.rank == 0:
            from autotune.trial import compiled

            compiled.save(self.dir, self._device_name())  # what it compiled, for production (trial.compiled)
        self._save(result)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if result.status in ("ok", "pruned") else 1)

    def _raised(self, kind, error, tb) -> None:
        """An exception escaping the program: an `error` (or `oom`, with the memory at the failure) result with
        its traceback, which also goes to trial.log, as the built-in trial's does."""
        from autotune.trial.memory import at_failure, is_oom

        text = "".join(traceback.format_exception(kind, error, tb))
        sys.stderr.write(text)
        self.ended = True
        first = str(error).strip().splitlines()[0][:500] if str(error).strip() else kind.__name__
        oom = is_oom(error)
        metrics = at_failure(error, types.SimpleNamespace(type=self.device_type)) if oom else None
        self._save(
            self._result(
                "oom" if oom else "error",
                error_type=kind.__name__,
                error=first,
                traceback=text[-4000:],
                metrics=metrics,
            )
        )

    def _ended_early(self) -> None:
        """The program returned before the window was done: an error result naming why."""
        if self.ended or self.warm == 0:  # no step at all: the launcher says what to add
            return
        if self.parity_run is not None:  # fewer losses than the parity steps: the verdict says so
            self.ended = True
            return self._save(self._parity_result())
        window, cfg = self.window, self.cfg
        if window is not None and window.program_ended(cfg["measure_steps"], cfg["min_window_s"]):
            self.ended_by_program = True  # a window the program's end closed: its floors held, its target may not
            self._finish()
        done = self.warm + (window.all_steps if window else 0)
        short = (
            f"its window had {window.steps} steps in {self.clock() - window.marks[0]:.2f} s "
            f"(a window needs {cfg['measure_steps']} steps and {cfg['min_window_s']:g} s)"
            if window is not None
            else f"a trial needs at least {cfg['warmup_steps'] + cfg['measure_steps']} (warm-up and window)"
        )
        self.ended = True
        self._save(
            self._result(
                "error",
                error_type="TooFewSteps",
                error=f"the program ended after {done} steps; {short}: give it more steps or data in a trial "
                "(cfg.in_trial)",
            )
        )


def _add(a, b):
    """Two counts' sum; None where either is unknown."""
    return None if a is None or b is None else a + b
