import os
import subprocess
import sys

import pytest

from autotune.host import procfs

pytestmark = pytest.mark.skipif(not procfs.available(), reason="Linux /proc")


def test_the_processes_their_parents_command_lines_and_cpu_time():
    child = subprocess.Popen([sys.executable, "-c", "import time; sum(range(10**6)); time.sleep(30)"])
    try:
        procs = procfs.processes(live=True)
        me = procs[os.getpid()]
        assert me.ppid == os.getppid() and me.state in "RS" and me.cpu_s > 0
        assert procs[child.pid].ppid == os.getpid() and procs[child.pid].start_ticks >= me.start_ticks
        assert child.pid in procfs.descendants(os.getpid(), procs) and "time.sleep(30)" in procfs.cmdline(child.pid)
        assert procfs.cwd(child.pid) == procfs.cwd(os.getpid())
        assert procfs.kib("self/status", "VmHWM") > 0 and procfs.kib("meminfo", "MemAvailable") > 0
        assert len(procfs.host_cpu_ticks()) >= 8
    finally:
        child.kill()
        child.wait()
    assert procfs.process(child.pid) is None and procfs.cmdline(child.pid) == "" and procfs.kib("0/status", "X") is None


def test_a_process_threads_their_names_cpu_time_and_core():
    import threading

    summed, done = threading.Event(), threading.Event()

    def spin():
        sum(range(3 * 10**6))  # ~50 ms of CPU: several clock ticks
        summed.set()
        done.wait(30)

    worker = threading.Thread(target=spin)
    worker.start()
    try:
        assert summed.wait(30)
        found = {t.tid: t for t in procfs.threads(os.getpid())}
        assert os.getpid() in found and worker.native_id in found  # the main thread's tid is the pid
        assert found[worker.native_id].cpu_s > 0 and found[worker.native_id].last_cpu in os.sched_getaffinity(0)
    finally:
        done.set()
        worker.join()
    assert procfs.threads(2**22 + 1) == []  # no such process


def test_a_zombie_is_not_live():
    child = subprocess.Popen(["true"])
    while procfs.process(child.pid).state != "Z":  # ended, not yet waited for
        pass
    assert child.pid in procfs.processes() and child.pid not in procfs.processes(live=True)
    child.wait()


def test_a_listening_socket_is_seen_with_its_address_and_its_process():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        inode = os.fstat(s.fileno()).st_ino
        assert procfs.listening_tcp()[inode] == f"127.0.0.1:{port}"
        assert inode in procfs.socket_inodes(os.getpid())
    assert inode not in procfs.listening_tcp()
    assert procfs.process("self").session == os.getsid(0)


def test_a_session_members_their_names_and_the_signals_they_catch():
    import signal

    code = (
        "import faulthandler, signal, subprocess, sys, time\n"
        "faulthandler.register(signal.SIGUSR1)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    leader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        child = int(leader.stdout.readline())
        members = procfs.in_session(leader.pid)
        assert [p.pid for p in members] == [leader.pid, child]  # the leader first, then in the order they started
        assert members[0].name == "python" or members[0].name.startswith("python")
        assert procfs.catches(leader.pid, signal.SIGUSR1)  # faulthandler's handler
        assert not procfs.catches(child, signal.SIGUSR1) and not procfs.catches(2**22 + 1, signal.SIGUSR1)
        assert procfs.in_session(2**22 + 1) == []  # no such session
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
