"""What ends a program's trial before its timeout (autotune.execution.watch): no first step within its limit, and
the one line that says what the program did and where its main thread was, from a real faulthandler dump. The
launcher's use of it on real trials is test_launcher's; the probe's refusal through the CLI, test_program's."""

import signal
import subprocess
import sys
import time

from autotune.execution.watch import NO_FIRST_STEP, Limits, Watch, main_thread, saw
from autotune.trial import progress

PROGRAM = """\
import faulthandler
import signal
import sys
import threading
import time

faulthandler.register(signal.SIGUSR1, all_threads=True)
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # a thread beside the main one


def wait_forever():
    print("ready", flush=True)
    while True:
        time.sleep(1)


wait_forever()
"""


def dump(tmp_path) -> str:
    """A real faulthandler dump of PROGRAM (its stderr, as a trial's log has it)."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    proc = subprocess.Popen(
        [sys.executable, "prog.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.3)  # past the print, into the loop's sleep (the line the test names)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
    finally:
        proc.kill()
    return proc.communicate(timeout=30)[1]


def test_a_watch_ends_a_trial_with_no_first_step_in_its_limit_and_stands_down_at_its_first_step(tmp_path):
    late, early, unlimited = (
        Watch(tmp_path / "a", Limits(0.2)),
        Watch(tmp_path / "b", Limits(0.2)),
        Watch(tmp_path, None),
    )
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for watch in (late, early, unlimited):
        watch.start()
    (tmp_path / "b" / progress.FIRST_STEP_FILE).write_text("0.1\n")  # its first step, in time
    assert late.check() is None and early.check() is None  # neither is past its limit yet
    time.sleep(0.3)
    assert late.check() == NO_FIRST_STEP and late.ended == NO_FIRST_STEP
    assert early.check() is None and early.stepped  # once stepped, the first-step limit is done with
    assert unlimited.check() is None


def test_what_the_program_did_is_said_up_to_the_next_thing_it_did_not_do():
    assert saw([]) == "it never imported torch"
    assert saw(["torch imported"]) == "it imported torch, but made no optimizer"
    assert saw(["torch imported", "an optimizer made", "a DataLoader iterated"]) == (
        "it imported torch, made an optimizer and iterated a DataLoader, but ran no forward"
    )
    # a loop with no DataLoader (a get_batch): what it did not do on the way is not the news
    assert saw(["torch imported", "an optimizer made", "a forward run"]) == (
        "it imported torch, made an optimizer and ran a forward, but ran no backward"
    )
    assert saw(list(progress.FACTS)).endswith("ran a forward and ran a backward, but stepped no optimizer")


def test_the_main_thread_is_found_in_a_real_faulthandler_dump_beside_another_thread(tmp_path):
    log = dump(tmp_path)
    assert log.count("(most recent call first):") == 2  # the main thread and the other one
    line = PROGRAM.splitlines().index("        time.sleep(1)") + 1
    assert main_thread(log, tmp_path) == ("wait_forever", f"prog.py:{line}")
    assert main_thread(log) == ("wait_forever", f"{tmp_path / 'prog.py'}:{line}")  # the path as Python has it
    # the program's own output around it, and a second dump after the first: the last one's
    assert main_thread("step 1\n" + log + "loss 0.3\n" + log.replace(f"line {line}", "line 99"), tmp_path) == (
        "wait_forever",
        "prog.py:99",
    )
    assert main_thread("no dump here\nTraceback (most recent call last):\n") is None
