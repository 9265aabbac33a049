"""A local search is not reachable from the network: every socket that any process
of the search listens on (the driver, Ray's GCS, raylet and workers, the trial
processes) is on loopback. Read from /proc while a real search runs."""

import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import write_spec


def _listening() -> dict[int, str]:
    """socket inode -> "address:port" for every listening TCP socket on this host."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_ip)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(raw)
            ip = getattr(ip, "ipv4_mapped", None) or ip
            out[int(fields[9])] = f"{ip}:{int(hex_port, 16)}"
    return out


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.rsplit(":", 1)[0]).is_loopback


def _tree(root: int) -> dict[int, str]:
    """pid -> command line of `root`'s session and all its descendants."""
    procs = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cmd = " ".join([os.path.basename(argv[0]), *argv[1:]]).strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        procs[int(entry.name)] = (int(fields[1]), int(fields[3]), cmd)  # ppid, session, cmd
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, session, _) in procs.items():
            if pid not in tree and (ppid in tree or session == root):
                tree.add(pid)
                grew = True
    return {pid: procs[pid][2] for pid in tree if pid in procs}


def _sockets_of(pids) -> set[tuple[str, str]]:
    """(address, command) of every listening socket these processes hold."""
    listening = _listening()
    found = set()
    for pid, cmd in pids.items():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inode = int(link[8:-1])
                if inode in listening:
                    found.add((listening[inode], cmd[:60]))
    return found


@pytest.mark.parametrize(
    "ray_first", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["cli", "ray-imported-first"]
)
@pytest.mark.timeout(240)
def test_a_local_search_listens_on_loopback_only(tmp_path, ray_first):
    spec = write_spec(
        tmp_path / "s.yaml",
        output_dir=str(tmp_path / "run"),
        search_space={"preset": None, "knobs": {"batch_size": [16, 32]}},
        trial={
            "warmup_steps": 2,
            "measure_steps": 5,
            "min_window_s": 2.0,
            "max_window_s": 3.0,
            "profile_steps": 0,
            "diagnose": False,
        },
    )
    # the user's environment, not the test suite's (conftest sets Ray's loopback flag)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    # ray-imported-first: user code that imported Ray before autotune (Ray read its flag then)
    code = ("import ray\n" if ray_first else "") + "from autotune.cli.main import app\napp()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "search", str(spec), "-q"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    seen, commands = set(), set()
    while proc.poll() is None:
        tree = _tree(proc.pid)
        commands.update(tree.values())
        seen |= _sockets_of(tree)
        time.sleep(0.3)
    output = proc.stdout.read().decode()
    assert proc.returncode == 0, output[-3000:]
    # the trial processes ran (forked by the warm fork server, or started from scratch)
    assert any("gcs_server" in c for c in commands), commands
    assert any("autotune.execution.forkserver" in c or "autotune.trial" in c for c in commands), commands
    assert any("gcs_server" in cmd for _, cmd in seen), f"no Ray server socket seen: {seen}"
    exposed = sorted(s for s in seen if not _is_loopback(s[0]))
    assert not exposed, f"listening beyond loopback: {exposed}"
