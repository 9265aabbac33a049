"""What a trial's program has done so far, as its instrumentation sees it, kept in its trial dir where the
launcher reads it (torch-free, cheap: each fact is written once):

- `first_step`: the time (s, from the process's start) of its first optimizer step, written at that step: the
  launcher's "it reached a step" (a program that never does is refused: autotune.execution.program);
- `seen`: the facts on the way there, one line each, `<seconds>\t<fact>`, in the order they came: `FACTS`.
  A probe that ends without a step says which of them it saw, and which not.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

FIRST_STEP_FILE, SEEN_FILE = "first_step", "seen"
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


def reset() -> None:
    """Forget what this process noted (a forked child starts with its parent's memory: the fork server's)."""
    global _STARTED
    _noted.clear()
    _STARTED = time.monotonic()
