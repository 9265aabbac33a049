"""What ends a trial before its timeout, read from its trial dir while the launcher waits for it
(autotune.trial.progress): no optimizer step within its first-step limit (`Limits.first_step_s`, its clock stopped
while torch.compile works, which has the compile's own limit, `compile_s`), a gap between
two steps past its stall limit (`Limits.stall_s`; a compile at work has the compile's limit, `compile_s`), and the
search's time budget's end (`Limits.cut_unix`). The launcher checks its `Watch` every WATCH_S of its wait; where
it says stop, and at the trial's timeout, every process of the trial (each rank, each loader worker) writes its
stacks into trial.log in turn, after a line naming it (`dump_stacks`: faulthandler's SIGUSR1, which the trial's
instrumentation registers and its loader workers inherit), and its process groups are killed (`Watch.end`). A trial
ended so is `hung` (no step in time) or `cut` (the budget ended while it ran); `Watch.why` says in one line what
its program did and where it waited (`Hang`: its main thread, the loader worker it waited for, the rank that
stopped), from those stacks."""

from __future__ import annotations

import ast
import functools
import math
import os
import re
import signal
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.execution.forkserver import kill_group
from autotune.host import procfs
from autotune.trial import progress

WATCH_S = 0.25  # how often the launcher looks, while it waits for a trial
STACKS_S = 0.5  # the longest a process's stacks may take to land in the log (a dump is a few ms)
FIRST_STEP_SET_BY = "`--first-step-limit` or trial.first_step_s sets it"
STALL_SET_BY = "trial.stall_s sets it"
NO_FIRST_STEP, STALLED, CUT = "no first step", "stalled", "cut"  # Watch.ended: why a trial was ended
WORKER = "pt_data_worker"  # what a DataLoader worker names itself (torch.utils.data._utils.worker)


@dataclass(frozen=True)
class Limits:
    """What a trial must reach, and by when (None: no limit): its first step `first_step_s` after its process
    started, and at the latest by `first_step_by` (a time.monotonic() time: the end of a probe's budget, which a
    wait for the fork server before the start may have eaten into); then a step at most `stall_s` after the last
    (a compile at work, at most `compile_s` from its start; before the first step too); and the whole trial by
    `cut_unix` (a Unix time: the search's time budget's end). `set_by`, `stall_set_by`: what the line names as
    each limit's source."""

    first_step_s: float | None = None
    set_by: str = FIRST_STEP_SET_BY
    first_step_by: float | None = None
    stall_s: float | None = None
    stall_set_by: str = STALL_SET_BY
    compile_s: float | None = None
    cut_unix: float | None = None


@dataclass(frozen=True)
class Stacks:
    """What one process of a trial wrote when it was made to dump its stacks (`dump_stacks`)."""

    pid: int
    label: str  # "the main process", "rank 1", "loader worker 0 of rank 1", "process 4242"
    text: str
    main: bool  # the trial's process, or a rank's
    rank: int | None = None  # a trial of several ranks: whose
    worker: int | None = None  # a DataLoader worker: its index among its loader's workers


class Watch:
    """A trial's `limits`, checked against its trial dir while it runs (from `start()`, when its process
    started: a forked one has torch imported already, a fresh one imports it in its limit, as it would in
    production). `check()`: None while it may go on, else why it ends (kept in `ended`); `end(pids)` dumps its
    stacks (`stacks`) and kills it."""

    def __init__(self, trial_dir: str | Path, limits: Limits | None):
        self.dir, self.limits = Path(trial_dir), limits or Limits()
        self.started: float | None = None
        self.stepped = False
        self.ended: str | None = None
        self.beats: dict[str, tuple[tuple[int, str], float]] = {}  # a beat file -> (what it said, since when)
        self.compiled: dict[str, float] = {}  # a beat file -> the seconds its finished compiles took
        self.stalled: str | None = None  # the beat file that stalled (a rank's)
        self.stacks: list[Stacks] = []
        self.ran_s = 0.0  # how long it had run when it was ended

    def start(self) -> None:
        self.started = time.monotonic()

    def check(self) -> str | None:
        if self.ended:
            return self.ended
        if self.started is None:
            self.start()
        now, lim = time.monotonic(), self.limits
        if lim.cut_unix is not None and time.time() >= lim.cut_unix:
            return self._end(CUT, now)
        if lim.first_step_s is None and lim.stall_s is None and lim.first_step_by is None:
            return None
        self._read(now)
        compiling = [since for (steps, state), since in self.beats.values() if state == progress.COMPILING]
        if not self.stepped:  # its first-step clock stops while it compiles, which has the compile's own limit
            compiled = max(self.compiled.values(), default=0.0)
            deadline = self.started + compiled + lim.first_step_s if lim.first_step_s is not None else math.inf
            if compiling and lim.compile_s:
                deadline = max(deadline, max(compiling) + lim.compile_s)
            if now >= min(deadline, lim.first_step_by or math.inf):
                return self._end(NO_FIRST_STEP, now)
            return None
        for name, ((steps, state), since) in self.beats.items():
            limit = lim.compile_s or lim.stall_s if state == progress.COMPILING else lim.stall_s
            if state != progress.MEASURED and limit is not None and now - since > limit:
                self.stalled = name
                return self._end(STALLED, now)
        return None

    def _read(self, now: float) -> None:
        """The beats as they are now: each file's content, and since when it says so."""
        for name, said in progress.beats(self.dir).items():
            was, since = self.beats.get(name, ((0, ""), now))
            if was != said:
                if was[1] == progress.COMPILING:  # a compile ended (one shorter than a look is not seen)
                    self.compiled[name] = self.compiled.get(name, 0.0) + now - since
                self.beats[name] = (said, now)
            self.stepped = self.stepped or said[0] > 0
        self.stepped = self.stepped or (self.dir / progress.FIRST_STEP_FILE).exists()

    def _end(self, why: str, now: float) -> str:
        self.ended, self.ran_s = why, now - (self.started or now)
        return why

    def end(self, pids: list[int]) -> None:
        """The trial's process groups (`pids`: a rank's each) killed, every process's stacks in its log first
        (`stacks`); a trial cut by the budget's end is killed at once (it hung nowhere)."""
        if self.ended != CUT:
            self.stacks = dump_stacks(self.dir / "trial.log", pids)
        for pid in pids:
            kill_group(pid, signal.SIGKILL)

    def why(self, cwd: str | Path | None = None) -> str:
        """The ended trial in one line: the limit it ran past, what its program did on the way, where it waited
        (`Hang`: a file under `cwd`, the program's dir, named from there), its log."""
        log, lim = self.dir / "trial.log", self.limits
        if self.ended == CUT:
            return f"the search's time budget ended {clock(self.ran_s)} into it: cut; `--budget` sets the budget"
        if self.ended == STALLED:
            steps = self.beats[self.stalled][0][0]  # as last beaten: a beat is written at most every BEAT_S
            head = (
                f"no optimizer step for {clock(lim.stall_s)} after {steps} step{'s' * (steps != 1)} or more (its "
                f"stall limit: {lim.stall_set_by})"
            )
        else:
            did = progress.seen(self.dir)
            head = f"the program finished no optimizer step within its first-step limit of {clock(lim.first_step_s)} ({lim.set_by})"
            head += f": {saw(did)}" if did or (self.dir / progress.SEEN_FILE).exists() else ""
        hang = self.hang(cwd)
        return head + (f"; {hang.line}" if hang else "") + f"; see {log}"

    def hang(self, cwd: str | Path | None = None) -> Hang | None:
        """Where the ended trial waited, from its stacks (`Hang.of`), else from its log's last dump."""
        return Hang.of(self.stacks, cwd) if self.stacks else Hang.of_log(_tail(self.dir / "trial.log"), cwd)


def clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


# --- every process's stacks, one at a time ---------------------------------------------------------------------


def dump_stacks(log: Path, leaders: list[int]) -> list[Stacks]:
    """Every process of each session in `leaders` (a trial's, or a rank's each) made to write its threads' stacks
    into `log`, one process at a time (dumps at once would interleave their lines), each after a line that names
    it ("autotune: the stacks of loader worker 0 (pid 4242):"); a process with no handler for SIGUSR1 (a compile
    worker, a program that is not Python) is left alone: the signal would end it. What each wrote, in order."""
    out: list[Stacks] = []
    for r, leader in enumerate(leaders):
        rank = r if len(leaders) > 1 else None
        members = procfs.in_session(leader)
        workers = [p for p in members if p.name == WORKER]
        for p in members:
            if not procfs.catches(p.pid, signal.SIGUSR1):
                continue
            worker = [w.pid for w in workers if w.ppid == p.ppid].index(p.pid) if p in workers else None
            label = _label(p.pid == leader, rank, worker, p.pid)
            text = _dumped(log, p.pid, f"autotune: the stacks of {label} (pid {p.pid}):\n")
            out.append(Stacks(p.pid, label, text, p.pid == leader, rank, worker))
    return out


def _label(main: bool, rank: int | None, worker: int | None, pid: int) -> str:
    of = "" if rank is None else f" of rank {rank}"
    if worker is not None:
        return f"loader worker {worker}{of}"
    if main:
        return "the main process" if rank is None else f"rank {rank}"
    return f"process {pid}{of}"


def _dumped(log: Path, pid: int, header: str) -> str:
    """`header` appended to `log`, then `pid`'s stacks (SIGUSR1): what it wrote, once its log has grown and held
    still for a moment, or after STACKS_S."""
    try:
        with open(log, "a") as f:  # the trial's writers append too: nothing is overwritten
            f.write(header)
        before = log.stat().st_size
        os.kill(pid, signal.SIGUSR1)
    except OSError:  # it ended meanwhile
        return ""
    deadline, size, still = time.monotonic() + STACKS_S, before, 0
    while time.monotonic() < deadline and still < 3:
        time.sleep(0.02)
        now = log.stat().st_size
        still = still + 1 if now == size and now > before else 0
        size = now
    with open(log, "rb") as f:
        f.seek(before)
        return f.read(size - before).decode(errors="replace")


# --- where it waited --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hang:
    """Where a hung trial waited: `kind` (autotune.trial.hung: loader, a loader worker never returned a batch;
    rank, one rank stopped while the others waited for it; main, its main thread waited elsewhere), the one
    line (`line`), its short form for a list (`short`: "loader worker 0 in Corpus.__getitem__"), the rank."""

    kind: str
    line: str
    short: str
    rank: int | None = None

    def record(self) -> dict:
        """What a result keeps of it (TrialResult.hung)."""
        return {"kind": self.kind, "where": self.short, **({"rank": self.rank} if self.rank is not None else {})}

    @classmethod
    def of(cls, stacks: list[Stacks], cwd: str | Path | None = None) -> Hang | None:
        """From every process's stacks: a main process waiting on its DataLoader names the worker it waited for
        (its first worker busy in code of its own, not torch's or Python's); of several ranks, the one whose main
        thread is not in torch (the others wait for it in a collective); else the main thread's frame."""
        mains = [s for s in stacks if s.main]
        for s in mains:
            frames = main_frames(s.text)
            if any(f[0].endswith(_LOADER_FILE) for f in frames):
                return _loader_hang(s, [w for w in stacks if w.worker is not None and w.rank == s.rank], cwd)
        if len(mains) > 1:
            stopped = [s for s in mains if not _in_torch(main_frames(s.text))]
            if len(stopped) == 1 and (where := _place(main_frames(stopped[0].text), cwd)):
                line = (
                    f"rank {stopped[0].rank} stopped in `{where[0]}` ({where[1]}) while the other ranks waited for it"
                )
                return cls("rank", line, f"rank {stopped[0].rank} in {where[0]}", stopped[0].rank)
        places = [(s, _place(main_frames(s.text), cwd, skip_libraries=False)) for s in mains]
        places = [(s, where) for s, where in places if where]
        if not places:
            return None
        s, where = places[0]
        every = len(places) == len(mains) > 1 and len({w for _, w in places}) == 1
        of = (
            "every rank's main thread"
            if every
            else "its main thread"
            if s.rank is None
            else f"rank {s.rank}'s main thread"
        )
        return cls("main", f"{of} was in `{where[0]}` ({where[1]})", f"{where[0]} ({where[1]})", s.rank)

    @classmethod
    def of_log(cls, log: str, cwd: str | Path | None = None) -> Hang | None:
        """From the last dump in a log alone (no stacks taken: what it says of the main thread)."""
        where = main_thread(log, cwd)
        return cls("main", f"its main thread was in `{where[0]}` ({where[1]})", where[0]) if where else None


_LOADER_FILE = "torch/utils/data/dataloader.py"


def _loader_hang(main: Stacks, workers: list[Stacks], cwd) -> Hang:
    of = "" if main.rank is None else f"rank {main.rank} "
    for w in sorted(workers, key=lambda w: w.worker):
        where = _place(main_frames(w.text), cwd)
        if where:
            line = f"{of}waiting for loader worker {w.worker}, which is in `{where[0]}` ({where[1]})"
            return Hang("loader", line, f"loader worker {w.worker} in {where[0]}", main.rank)
    line = f"{of}waiting for its loader's workers" + ("" if workers else " (their stacks were not taken)")
    return Hang("loader", line, "its loader's workers", main.rank)


def _in_torch(frames: list[tuple[str, str, str]]) -> bool:
    """The innermost frame of its own (not autotune's or threading's) is torch's: a rank waiting in a collective."""
    mine = [f for f in frames if not _skipped(f[0])]
    return bool(mine) and mine[0][0].startswith(_roots()[0])


def _place(frames, cwd, skip_libraries: bool = True) -> tuple[str, str] | None:
    """The innermost frame not autotune's or threading's (`skip_libraries`: nor torch's or the standard
    library's: the program's own, or a library's it called) as (qualified function, "file:line")."""
    for file, line, function in frames:
        if _skipped(file) or skip_libraries and file.startswith(_roots()):
            continue
        source = file if os.path.isabs(file) or not cwd else os.path.join(cwd, file)  # a script run by its name
        return qualified(source, int(line), function), f"{_shown(file, cwd)}:{line}"
    return None


@functools.cache
def _roots() -> tuple[str, ...]:
    """torch's package dir and the standard library's (found without importing torch)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    torch_dir = str(Path(spec.origin).parent) + "/" if spec and spec.origin else "\0"
    return torch_dir, sysconfig.get_paths()["stdlib"] + "/"


@functools.lru_cache(maxsize=64)
def qualified(file: str, line: int, function: str) -> str:
    """`function` named with its class, where `file` defines it in one at `line` (faulthandler writes the bare
    name): `Corpus.__getitem__`; the bare name where the source cannot say."""
    try:
        node: ast.AST = ast.parse(Path(file).read_text())
    except (OSError, SyntaxError, ValueError):
        return function
    path: list[ast.AST] = []
    while True:  # down the definitions that hold the line, to the innermost
        node = next(
            (
                n
                for n in ast.iter_child_nodes(node)
                if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.lineno <= line <= (n.end_lineno or n.lineno)
            ),
            None,
        )
        if node is None:
            break
        path.append(node)
    if len(path) >= 2 and path[-1].name == function and isinstance(path[-2], ast.ClassDef):
        return f"{path[-2].name}.{function}"
    return function


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


def _skipped(file: str) -> bool:
    return file.startswith(_SKIPPED[0]) or file == _SKIPPED[1]


def main_frames(log: str) -> list[tuple[str, str, str]]:
    """The main thread's frames in faulthandler's last dump in `log` (a trial.log, or one process's dump),
    innermost first, each (file, line, function). The main thread: the thread running a module's top level
    (`<module>`), else the thread the dump ran on ("Current thread"). Empty without a dump."""
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
    return main[1] if main else []


def main_thread(log: str, cwd: str | Path | None = None) -> tuple[str, str] | None:
    """Where the main thread was in faulthandler's last dump in `log`: its innermost frame that is not
    autotune's or threading's, as (function, "file:line"), the file relative to `cwd` where it is under it.
    None without a dump."""
    for file, line, function in main_frames(log):
        if not _skipped(file):
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
