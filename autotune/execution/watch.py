"""What ends a user's program's trial before its timeout, read from its trial dir while the launcher waits for it
(autotune.trial.progress): no optimizer step within its first-step limit (`Limits.first_step_s`). The launcher
checks its `Watch` every WATCH_S of its wait, and where it says stop, the trial's stacks go to its trial.log and
its processes are killed (`launcher._time_out`); the trial is then a failed one (NoStep), and `Watch.why` says what
its program was seen to do and where its main thread was, from faulthandler's dump in that log."""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.trial import progress

WATCH_S = 0.25  # how often the launcher looks, while it waits for a trial
FIRST_STEP_SET_BY = "`--first-step-limit` or trial.first_step_s sets it"
NO_FIRST_STEP = "no first step"  # Watch.ended: why a trial was ended


@dataclass(frozen=True)
class Limits:
    """What a program's trial must reach, and by when (None: no limit): its first step `first_step_s` after its
    process started, and at the latest by `first_step_by` (a time.monotonic() time: the end of the search's
    budget, which a wait for the fork server before the start may have eaten into). `set_by`: what the refusal
    names as the first-step limit's source."""

    first_step_s: float | None = None
    set_by: str = FIRST_STEP_SET_BY
    first_step_by: float | None = None


class Watch:
    """A program trial's `limits`, checked against its trial dir while it runs (from `start()`, when its process
    started: a forked one has torch imported already, a fresh one imports it in its limit, as it would in
    production). `check()`: None while it may go on, else why it ends (kept in `ended`)."""

    def __init__(self, trial_dir: str | Path, limits: Limits | None):
        self.dir, self.limits = Path(trial_dir), limits or Limits()
        self.started: float | None = None
        self.stepped = False
        self.ended: str | None = None

    def start(self) -> None:
        self.started = time.monotonic()

    def check(self) -> str | None:
        if self.ended or self.stepped or self.limits.first_step_s is None:
            return self.ended
        if self.started is None:
            self.start()
        if (self.dir / progress.FIRST_STEP_FILE).exists():
            self.stepped = True
        elif time.monotonic() >= min(self.started + self.limits.first_step_s, self.limits.first_step_by or math.inf):
            self.ended = NO_FIRST_STEP
        return self.ended

    def why(self, cwd: str | Path | None = None) -> str:
        """The ended trial in one line: the limit, what its program did on the way, where its main thread was
        (a file under `cwd`, the program's dir, named from there), its log."""
        log = self.dir / "trial.log"
        where = main_thread(_tail(log), cwd)
        return (
            f"the program finished no optimizer step within its first-step limit of "
            f"{clock(self.limits.first_step_s)} ({self.limits.set_by}): {saw(progress.seen(self.dir))}"
            + (f"; its main thread was in `{where[0]}` ({where[1]})" if where else "")
            + f"; see {log}"
        )


def clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


# each fact of progress.FACTS as done, and as not done
_DONE = {
    "torch imported": ("imported torch", "never imported torch"),
    "an optimizer made": ("made an optimizer", "made no optimizer"),
    "a DataLoader iterated": ("iterated a DataLoader", "iterated no DataLoader"),
    "a forward run": ("ran a forward", "ran no forward"),
    "a backward run": ("ran a backward", "ran no backward"),
}


def saw(facts: list[str]) -> str:
    """What a program did before it was ended (progress.seen's `facts`), and the next thing it did not do:
    "it imported torch and made an optimizer, but iterated no DataLoader"."""
    if not facts:
        return "it " + _DONE[progress.FACTS[0]][1]
    done = [_DONE[f][0] for f in facts]
    said = done[0] if len(done) == 1 else f"{', '.join(done[:-1])} and {done[-1]}"
    later = progress.FACTS[progress.FACTS.index(facts[-1]) + 1 :]
    return f"it {said}, but " + (_DONE[later[0]][1] if later else "stepped no optimizer")


_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
_SKIPPED = (str(Path(__file__).resolve().parent.parent) + "/", str(Path(threading.__file__)))  # autotune's, threading


def main_thread(log: str, cwd: str | Path | None = None) -> tuple[str, str] | None:
    """Where the main thread was in faulthandler's last dump in `log` (a trial.log): its innermost frame that is
    not autotune's or threading's, as (function, "file:line"), the file relative to `cwd` where it is under it.
    The main thread: the thread running a module's top level (`<module>`), else the thread the dump ran on
    ("Current thread"). None without a dump."""
    threads: list[tuple[bool, list[tuple[str, str, str]]]] = []  # (the current thread?, frames innermost first)
    for line in log.splitlines():
        header = _HEADER.match(line)
        frame = _FRAME.match(line)
        if header:
            threads.append((header.group(1) == "Current thread", []))
        elif frame and threads:
            threads[-1][1].append(frame.groups())
    latest = threads[::-1]  # the last dump's (a rank's, where several wrote to the log)
    main = next((t for t in latest if any(f[2] == "<module>" for f in t[1])), None)
    main = main or next((t for t in latest if t[0]), None)
    if main is None:
        return None
    for file, line, function in main[1]:
        if not file.startswith(_SKIPPED[0]) and file != _SKIPPED[1]:
            return function, f"{_shown(file, cwd)}:{line}"
    return None


def _shown(file: str, cwd: str | Path | None) -> str:
    if cwd:
        try:
            return str(Path(file).relative_to(Path(cwd)))
        except ValueError:
            pass
    return file


def _tail(path: Path, size: int = 256 << 10) -> str:
    """The end of `path` (a dump is at the end of a trial's log; a program may have logged megabytes before it)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
