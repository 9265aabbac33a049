import subprocess
import sys
import time

import pytest

from autotune.execution import reaper
from autotune.host import procfs

DRIVER = "import subprocess, sys, time; sys.stdin.readline(); print(subprocess.Popen(['sleep', '60']).pid, flush=True); time.sleep(60)"


def alive(pid: int) -> bool:
    return pid in procfs.processes(live=True)  # a zombie is not alive


@pytest.fixture
def driver_with_child():
    """A stand-in driver with its reaper, and a child it started after the reaper (as Ray's processes are)."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "autotune.execution.reaper", str(driver.pid)],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    time.sleep(1.0)  # the reaper's start: what starts after it is the search's
    driver.stdin.write("go\n")
    driver.stdin.flush()
    child = int(driver.stdout.readline())
    time.sleep(3 * reaper.POLL_S)  # noted by the reaper
    yield driver, watcher, child
    for pid in (child, driver.pid):
        subprocess.run(["kill", "-9", str(pid)], capture_output=True)
    driver.wait(timeout=10)


@pytest.mark.timeout(60)
def test_a_normal_end_touches_nothing(driver_with_child):
    driver, watcher, child = driver_with_child
    reaper.stop(watcher)
    assert watcher.returncode == 0 and alive(child) and alive(driver.pid)


@pytest.mark.timeout(60)
def test_eof_without_the_normal_end_is_a_dead_driver_even_while_it_is_still_listed(driver_with_child):
    """A killed driver's pipes close before /proc shows it gone: the bare EOF decides, and what the driver started
    is killed (a CI run saw Ray's DashboardAgent and RuntimeEnvAgent survive a `kill -9` of the driver)."""
    driver, watcher, child = driver_with_child
    watcher.stdin.close()  # the driver still runs: the moment between its pipes closing and its exit
    watcher.wait(timeout=10)
    deadline = time.time() + 5
    while alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(child) and alive(driver.pid)
