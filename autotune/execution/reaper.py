"""Nothing left behind when a search's driver dies. A `kill -9` of the driver
leaves what it started running: Ray's DashboardAgent and RuntimeEnvAgent
(children of the raylet, about 100 MB each) were still alive after the resumed
search had ended. The reaper is a small process in its own session that the
driver starts once it has started Ray: every half second it notes the driver's
descendants that started after the search did (Ray's processes, the fork server,
trials and their loader workers; never a process the user had running before),
and when the driver dies, it kills those still alive. A process is known by its
pid and its start time, so a reused pid is never touched.

    proc = reaper.start()        # the driver, before it starts a local Ray
    ...
    reaper.stop(proc)            # after ray.shutdown()

A driver that ends normally says so on the reaper's stdin, then closes it (Ray
is shut down by then): the reaper exits without touching anything. A bare EOF is
a driver that died: a killed process's pipes close before /proc shows it gone
(a CI run saw the reaper read EOF, find the driver still listed, take it for a
normal end, and leave Ray's two agents running).

    python -m autotune.execution.reaper PID    # started by `watching`; reads stdin until EOF
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys

from autotune.host import procfs

POLL_S = 0.5
NORMAL_END = b"x"  # what a driver ending normally writes before it closes the reaper's stdin


def _procs() -> dict[int, int]:
    """pid -> start time (clock ticks since boot) of the live processes. A zombie is not live: a killed driver stays
    one until its parent waits for it, and must count as gone."""
    return {pid: p.start_ticks for pid, p in procfs.processes(live=True).items()}


def descendants(pid: int, since: int, procs: dict[int, procfs.Process] | None = None) -> set[tuple[int, int]]:
    """(pid, start time) of every live descendant of `pid` that started at or after `since`."""
    procs = procfs.processes(live=True) if procs is None else procs
    return {(c, procs[c].start_ticks) for c in procfs.descendants(pid, procs) - {pid} if procs[c].start_ticks >= since}


def watch(driver: int) -> None:
    """Note the driver's new descendants until the driver says it ends normally
    (NORMAL_END on stdin: leave), or dies (EOF alone, or gone from /proc): then
    kill the noted ones that are still the same processes."""
    procs = _procs()
    if driver not in procs:
        return
    started = procs[driver]
    since = procs[os.getpid()]  # what started after this reaper: the search's, not the user's
    noted: set[tuple[int, int]] = set()
    while True:
        live = procfs.processes(live=True)
        if driver not in live or live[driver].start_ticks != started:
            break  # the driver is gone
        noted = {p for p in noted if p[0] in live and live[p[0]].start_ticks == p[1]} | descendants(driver, since, live)
        readable, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if readable:
            if os.read(sys.stdin.fileno(), 1) == NORMAL_END:
                return  # the driver said so: a normal end
            break  # EOF alone: the driver died (it may still be listed in /proc for a moment)
    procs = _procs()
    for pid, start in noted:
        if pid != os.getpid() and procs.get(pid) == start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start() -> subprocess.Popen | None:
    """A reaper watching this process (Linux; elsewhere None)."""
    if not procfs.available():
        return None
    return subprocess.Popen(
        [sys.executable, "-m", "autotune.execution.reaper", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen | None) -> None:
    """A normal end: the reaper leaves, touching nothing."""
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):  # writes, closes stdin (a reaper gone already: no
            proc.communicate(NORMAL_END, timeout=5)  # error), then waits for it


if __name__ == "__main__":
    watch(int(sys.argv[1]))
