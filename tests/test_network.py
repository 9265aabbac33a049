"""A local search is not reachable from the network: every socket that any process
of the search listens on (the driver, Ray's GCS, raylet and workers, the trial
processes) is on loopback. Read from /proc (autotune.host.procfs) while a real search runs."""

import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.host import procfs
from tests.conftest import write_spec
from tests.test_program import loader_loop_searched

PROGRAMS = Path(__file__).parent / "programs"


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.rsplit(":", 1)[0]).is_loopback


def _tree(root: int) -> dict[int, str]:
    """pid -> command line of `root`'s session and all its descendants."""
    procs = procfs.processes()
    tree, grew = {root}, True
    while grew:
        grew = False
        for p in procs.values():
            if p.pid not in tree and (p.ppid in tree or p.session == root):
                tree.add(p.pid)
                grew = True
    return {pid: _short(procfs.cmdline(pid)) for pid in tree if pid in procs}


def _short(cmd: str) -> str:
    """The command line with its program's directory left out (Ray's servers live deep in site-packages)."""
    program, _, args = cmd.partition(" ")
    return f"{os.path.basename(program)} {args}".strip()


def _sockets_of(pids) -> set[tuple[str, str]]:
    """(address, command) of every listening socket these processes hold."""
    listening = procfs.listening_tcp()
    return {(listening[i], cmd[:60]) for pid, cmd in pids.items() for i in procfs.socket_inodes(pid) if i in listening}


@pytest.mark.parametrize(
    "ray_first", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["cli", "ray-imported-first"]
)
@pytest.mark.timeout(240)
def test_a_local_search_listens_on_loopback_only(tmp_path, ray_first):
    """A program's search through Ray (the one test_program leaves to this one: a Ray start is ~10 s here): its
    sockets, and the program searched to the end (a DataLoader program's knobs, its own settings the baseline)."""
    (tmp_path / "loader_loop.py").write_text((PROGRAMS / "loader_loop.py").read_text())
    spec = write_spec(
        tmp_path / "s.yaml",
        output_dir=str(tmp_path / "run"),
        workload={"command": "python loader_loop.py --steps 400 --batch_size 16"},
        # the attention kernel: asked for, and fixed, since its model is no transformers model
        search_space={"preset": None, "knobs": {"num_workers": [0, 1], "attention": ["sdpa", "eager"]}},
        search={"n_trials": 2, "confirm_rounds": 0},
        trial={
            "warmup_steps": 2,
            "measure_steps": 5,
            "min_window_s": 1.0,
            "max_window_s": 1.5,
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
    loader_loop_searched(tmp_path)  # the program's trials, through Ray, each measured
