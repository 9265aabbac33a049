"""Linux's /proc, the one module that reads it: the live processes (parent, session, name, start time, CPU time, command
line, open sockets, threads), the host's CPU counters, listening TCP sockets, memory figures and CPU model. Where /proc is absent (macOS) or a process is gone, each read
says so (empty, None or 0) rather than raising. The standard library only, so every part may use it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Process:
    pid: int
    ppid: int
    state: str  # R, S, D, Z (a zombie: ended, not yet waited for), ...
    start_ticks: int  # clock ticks since boot: with the pid, names one process even after the pid is reused
    cpu_s: float  # user + system
    session: int = 0  # the session id: a process started with start_new_session leads its own
    name: str = ""  # its main thread's name (`comm`: a DataLoader worker names itself pt_data_worker)


def available() -> bool:
    return (PROC / "self" / "stat").exists()


def _stat(path: Path) -> tuple[str, list[str]]:
    """A `stat` file (a process's or a thread's): its text and its fields after the command name, which may hold
    spaces and parentheses (so the split is at the last ")"): [0] state, [1] ppid, ... [11] utime, [12] stime."""
    text = path.read_text()
    return text, text.rsplit(")", 1)[1].split()


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / TICK  # user + system


def process(pid: int | str) -> Process | None:
    """The process `pid` ("self" for this one), None when it is gone or /proc is absent."""
    try:
        text, fields = _stat(PROC / str(pid) / "stat")
        name = text[text.index("(") + 1 : text.rindex(")")]
        return Process(
            int(text.split(None, 1)[0]),
            int(fields[1]),
            fields[0],
            int(fields[19]),
            _cpu_s(fields),
            int(fields[3]),
            name,
        )
    except (OSError, IndexError, ValueError):
        return None


def processes(live: bool = False) -> dict[int, Process]:
    """Every process by pid; with `live`, zombies left out (a killed process stays one until its parent waits)."""
    found = (process(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()) if PROC.is_dir() else ()
    return {p.pid: p for p in found if p is not None and not (live and p.state == "Z")}


def descendants(root: int, procs: dict[int, Process] | None = None) -> set[int]:
    """`root` and every process below it."""
    procs = processes() if procs is None else procs
    tree, grew = {root}, True
    while grew:
        grew = False
        for p in procs.values():
            if p.ppid in tree and p.pid not in tree:
                tree.add(p.pid)
                grew = True
    return tree


def in_session(leader: int, procs: dict[int, Process] | None = None) -> list[Process]:
    """The live processes of the session `leader` leads (a trial's, a rank's: each starts one), the leader first,
    then the others in the order they started."""
    procs = processes(live=True) if procs is None else procs
    members = [p for p in procs.values() if p.session == leader and p.state != "Z"]
    return sorted(members, key=lambda p: (p.pid != leader, p.start_ticks, p.pid))


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler of its own for `signum` (its `SigCgt` mask): a signal it does not catch
    takes its default action (SIGUSR1's ends it). False when it is gone or not ours to read."""
    try:
        with open(PROC / str(pid) / "status") as f:
            mask = next((int(line.split()[1], 16) for line in f if line.startswith("SigCgt:")), 0)
    except (OSError, ValueError, IndexError):
        return False
    return bool(mask >> (signum - 1) & 1)


@dataclass(frozen=True)
class Thread:
    tid: int
    name: str
    cpu_s: float  # user + system
    last_cpu: int  # the core it last ran on


def threads(pid: int) -> list[Thread]:
    """The process's threads (empty when it is gone or not ours to read)."""
    out = []
    try:
        tids = [entry.name for entry in (PROC / str(pid) / "task").iterdir()]
    except OSError:
        return out
    for tid in tids:
        try:
            task = PROC / str(pid) / "task" / tid
            _, fields = _stat(task / "stat")
            out.append(Thread(int(tid), (task / "comm").read_text().strip(), _cpu_s(fields), int(fields[36])))
        except (OSError, IndexError, ValueError):
            continue  # ended while read
    return out


def cmdline(pid: int) -> str:
    """The process's command line, its arguments joined by spaces ("" when it is gone or not ours to read)."""
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets the process holds open (empty when it is gone or not ours to read)."""
    fd_dir = PROC / str(pid) / "fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return set()
    out = set()
    for fd in fds:
        try:
            link = os.readlink(fd_dir / fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def listening_tcp() -> dict[int, str]:
    """Socket inode -> "address:port" of every listening TCP socket on this host, IPv4 and IPv6 (an IPv4-mapped
    address as its IPv4 one)."""
    import ipaddress

    out = {}
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (PROC / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_ip)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word in host order
            ip = ipaddress.ip_address(raw)
            ip = getattr(ip, "ipv4_mapped", None) or ip
            out[int(fields[9])] = f"{ip}:{int(hex_port, 16)}"
    return out


def cwd(pid: int) -> Path | None:
    try:
        return Path(os.readlink(PROC / str(pid) / "cwd"))
    except OSError:
        return None


def environ(pid: int) -> dict[str, str]:
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def host_cpu_ticks() -> list[int] | None:
    """The host's CPU time counters (user, nice, system, idle, iowait, irq, softirq, steal, ...) in ticks."""
    try:
        with open(PROC / "stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def kib(file: str, key: str) -> int | None:
    """A `Key:   123 kB` line of a /proc file (`self/status`, `meminfo`, `<pid>/smaps_rollup`), in KiB."""
    try:
        with open(PROC / file) as f:
            return next((int(line.split()[1]) for line in f if line.startswith(key + ":")), None)
    except (OSError, ValueError, IndexError):
        return None


def cpu_model() -> str:
    try:
        with open(PROC / "cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def reset_peak_rss() -> None:
    """Restart this process's peak RSS (VmHWM) from its current RSS; a no-op without /proc."""
    try:
        with open(PROC / "self" / "clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
