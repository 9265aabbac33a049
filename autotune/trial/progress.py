"""What a trial's program has done so far, as its instrumentation sees it, kept in its trial dir where the
launcher reads it (torch-free, cheap: each fact is written once):

- `first_step`: the time (s, from the process's start) of its first optimizer step, written at that step: the
  launcher's "it reached a step" (a program that never does is refused: autotune.execution.program);
- `seen`: the facts on the way there, one line each, `<seconds>\t<fact>`, in the order they came: `FACTS`.
  A probe that ends without a step says which of them it saw, and which not;
- `beat` (a rank's `beat.<R>`): the steps it has taken, rewritten at most every BEAT_S of its steps (`beat`: a
  counter and a clock read per step; no device sync), so the launcher's watch sees the steps as they come
  (autotune.execution.watch: a gap past the stall limit is a hung trial), with what it is doing where that is
  not stepping: `compiling` (torch.compile at work: the compile's limit, not the stall's), `measured` (its
  measured steps are done: what follows, the built-in trial's profile, diagnosis and parity, is held by the
  trial's timeout alone). Written where the trial's dir is named (AUTOTUNE_TRIAL_DIR), never in production.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

FIRST_STEP_FILE, SEEN_FILE, BEAT_FILE = "first_step", "seen", "beat"
BEAT_S = 0.5  # a beat is written at most this often (a step's cost: a counter and a clock read)
COMPILING, MEASURED = "compiling", "measured"  # what a beat says beside its steps (nothing: stepping)
# what a program does before its first optimizer step, in the order a training program usually does it
FACTS = ("torch imported", "an optimizer made", "a DataLoader iterated", "a forward run", "a backward run")
_STARTED = time.monotonic()
_noted: set[str] = set()


def note(trial_dir: str | os.PathLike | None, fact: str) -> None:
    """Record `fact` (one of FACTS) in `trial_dir`'s `seen`, once per process (no trial dir: nothing)."""
    if trial_dir is None or fact in _noted:
        return
    _noted.add(fact)
    try:
        with open(Path(trial_dir) / SEEN_FILE, "a") as f:
            f.write(f"{time.monotonic() - _STARTED:.3f}\t{fact}\n")
    except OSError:  # the trial dir went (the launcher cleans up): the program runs on
        pass


def seen(trial_dir: str | os.PathLike) -> list[str]:
    """The facts `trial_dir`'s program was seen to reach, in FACTS' order, each once (every rank's together)."""
    try:
        lines = (Path(trial_dir) / SEEN_FILE).read_text().splitlines()
    except OSError:
        return []
    got = {line.partition("\t")[2] for line in lines}
    return [f for f in FACTS if f in got]


class _Beats:
    """This process's steps and where they go (resolved at its first beat: a rank's environment is set by then)."""

    def __init__(self):
        self.steps, self.state, self.written = 0, "", -math.inf
        self.path: Path | None = None
        self.resolved = False

    def write(self) -> None:
        if not self.resolved:
            self.resolved, self.path = True, beat_path()
        if self.path is None:  # no trial dir (production): never again
            self.written = math.inf
            return
        self.written = time.monotonic()
        try:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(f"{self.steps} {self.state}\n")
            os.replace(tmp, self.path)  # whole: the watch never reads half a beat
        except OSError:  # the trial dir went (the launcher cleans up): the program runs on
            self.written = math.inf


_beats = _Beats()


def beat_path() -> Path | None:
    """Where this process's beats go: its trial dir's `beat`, a rank's `beat.<R>` (None outside a trial)."""
    where = os.environ.get("AUTOTUNE_TRIAL_DIR")
    if not where:
        return None
    several = os.environ.get("WORLD_SIZE", "1") != "1"
    return Path(where) / (f"{BEAT_FILE}.{os.environ.get('RANK', '0')}" if several else BEAT_FILE)


def beat() -> None:
    """One step done (an optimizer step of the measured loop): the first is written at once, then at most every
    BEAT_S."""
    _beats.steps += 1
    if time.monotonic() - _beats.written >= BEAT_S:
        _beats.write()


def mark(state: str) -> None:
    """What this process does now instead of stepping (COMPILING, MEASURED; "": stepping again), written at once."""
    if _beats.state != state and _beats.state != MEASURED:
        _beats.state = state
        _beats.write()


def watch_compiles(callbacks) -> None:
    """torch.compile's work marked as it runs (`callbacks`: torch._dynamo.callback, its on_compile_start and
    on_compile_end): a compile mid-run is no stall."""
    callbacks.on_compile_start(lambda *_: mark(COMPILING))
    callbacks.on_compile_end(lambda *_: mark(""))


def beats(trial_dir: str | os.PathLike) -> dict[str, tuple[int, str]]:
    """Each beat file of `trial_dir` (a rank each): its name -> (steps, state)."""
    out = {}
    try:
        entries = [e for e in os.scandir(trial_dir) if e.name.startswith(BEAT_FILE) and not e.name.endswith(".tmp")]
    except OSError:
        return out
    for entry in entries:
        try:
            steps, _, state = Path(entry.path).read_text().strip().partition(" ")
            out[entry.name] = (int(steps), state)
        except (OSError, ValueError):
            continue
    return out


def reset() -> None:
    """Forget what this process noted and stepped (a forked child starts with its parent's memory: the fork
    server's)."""
    global _STARTED, _beats
    _noted.clear()
    _STARTED = time.monotonic()
    _beats = _Beats()
