"""What ends a trial before its timeout (autotune.execution.watch): no first step within its limit, a gap between
steps past its stall limit (a compile's work has its own), the budget's end; the steps' beats it reads
(autotune.trial.progress); every process's stacks, one at a time; and the one line that says what the program did
and where it waited, from real faulthandler dumps (a DataLoader whose worker never returns a batch). The
launcher's use of it on real trials is test_launcher's; the probe's refusal through the CLI, test_program's."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.execution.watch import (
    CUT,
    NO_FIRST_STEP,
    STALLED,
    Hang,
    Limits,
    Stacks,
    Watch,
    dump_stacks,
    main_thread,
    qualified,
    saw,
)
from autotune.host import procfs
from autotune.trial import progress

PROGRAMS = Path(__file__).resolve().parent / "programs"

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


@pytest.fixture
def beats_to(tmp_path, monkeypatch):
    """This process's beats into `tmp_path` (as a trial's go to its trial dir), forgotten after the test."""
    monkeypatch.setenv("AUTOTUNE_TRIAL_DIR", str(tmp_path))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    progress.reset()
    yield tmp_path
    monkeypatch.delenv("AUTOTUNE_TRIAL_DIR", raising=False)
    progress.reset()


def test_steps_beat_into_the_trial_dir_at_most_every_half_second_and_say_what_is_not_stepping(beats_to):
    assert progress.beats(beats_to) == {}
    progress.beat()  # the first step: written at once
    assert progress.beats(beats_to) == {"beat": (1, "")}
    for _ in range(10_000):  # no I/O per step: a counter and a clock read
        progress.beat()
    assert progress.beats(beats_to) == {"beat": (1, "")}
    time.sleep(progress.BEAT_S)
    progress.beat()
    assert progress.beats(beats_to) == {"beat": (10_002, "")}
    progress.mark(progress.COMPILING)  # said at once
    assert progress.beats(beats_to) == {"beat": (10_002, "compiling")}
    progress.mark("")
    progress.mark(progress.MEASURED)  # the measured steps are done: for good
    progress.mark("")
    assert progress.beats(beats_to) == {"beat": (10_002, "measured")}
    assert [p.name for p in beats_to.iterdir()] == ["beat"]  # written whole (its .tmp replaced it)


def test_a_rank_beats_into_its_own_file_and_production_into_none(beats_to, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    progress.beat()
    assert progress.beats(beats_to) == {"beat.1": (1, "")}
    monkeypatch.delenv("AUTOTUNE_TRIAL_DIR")  # `autotune run`: no trial dir, no watch, nothing written
    progress.reset()
    progress.beat()
    progress.mark(progress.COMPILING)
    assert progress.beats(beats_to) == {"beat.1": (1, "")}


def test_a_gap_past_the_stall_limit_ends_a_trial_unless_it_compiles_or_its_measured_steps_are_done(beats_to):
    watch = Watch(beats_to, Limits(first_step_s=60, stall_s=0.5, compile_s=1.5))
    watch.start()
    assert watch.check() is None and not watch.stepped
    progress.beat()
    assert watch.check() is None and watch.stepped
    progress.mark(progress.COMPILING)  # torch.compile at work mid-run: the compile's limit
    watch.check()
    time.sleep(0.8)
    assert watch.check() is None
    progress.mark("")  # compiled: stepping again, the stall limit from here
    assert watch.check() is None
    time.sleep(0.8)
    assert watch.check() == STALLED and watch.stalled == "beat"
    assert watch.why().startswith("no optimizer step for 0:00 after 1 step or more (its stall limit: trial.stall_s")
    done = Watch(beats_to, Limits(first_step_s=60, stall_s=0.5))
    progress.mark(progress.MEASURED)  # the built-in trial's profile, diagnosis and parity: its timeout's
    done.check()
    time.sleep(0.8)
    assert done.check() is None


def test_a_compile_before_the_first_step_has_the_compile_limit_and_the_budget_end_cuts_any_trial(beats_to):
    watch = Watch(beats_to, Limits(first_step_s=0.3, compile_s=5))
    watch.start()
    progress.mark(progress.COMPILING)
    assert watch.check() is None  # it sees the compile start (it looks every WATCH_S)
    time.sleep(0.5)
    assert watch.check() is None and not watch.stepped  # past its first-step limit, inside the compile's
    progress.mark("")  # compiled: its first-step clock goes on from where the compile stopped it
    assert watch.check() is None
    time.sleep(0.5)
    assert watch.check() == NO_FIRST_STEP  # 0.3 s of its own past the compile
    late = Watch(beats_to, Limits(first_step_s=0.3, compile_s=5, first_step_by=time.monotonic()))  # the probe's budget
    assert late.check() == NO_FIRST_STEP
    cut = Watch(beats_to, Limits(first_step_s=60, cut_unix=time.time() - 1))
    assert cut.check() == CUT
    assert cut.why() == "the search's time budget ended 0:00 into it: cut; `--budget` sets the budget"


LOADER = """\
import faulthandler
import signal
import sys

sys.path.insert(0, {programs!r})
faulthandler.register(signal.SIGUSR1, all_threads=True)  # as a trial's instrumentation does
from torch.utils.data import DataLoader
from hang_loop import Windows

print("ready", flush=True)
for batch in DataLoader(Windows(10_000, 8, 16), batch_size=4, num_workers=2):
    pass
"""


@pytest.mark.timeout(120)
def test_every_process_writes_its_stacks_in_turn_and_the_line_names_the_worker_the_main_thread_waits_for(tmp_path):
    """A DataLoader whose workers never return a batch (tests/programs/hang_loop.py's Windows): the main process
    and each worker dump in turn after a line that names it, and the line names the worker 0's own frame."""
    (tmp_path / "main.py").write_text(LOADER.format(programs=str(PROGRAMS)))
    log = tmp_path / "trial.log"
    with open(log, "a") as out:
        proc = subprocess.Popen(
            [sys.executable, "main.py"], cwd=tmp_path, stdout=out, stderr=out, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 90
        while sum(p.name == "pt_data_worker" for p in procfs.in_session(proc.pid)) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()
            time.sleep(0.2)
        time.sleep(1.0)  # each worker into its first batch
        stacks = dump_stacks(log, [proc.pid])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert [s.label for s in stacks] == ["the main process", "loader worker 0", "loader worker 1"]
    text = log.read_text()
    for s in stacks:  # each dump whole, right after its line
        assert s.text.count("(most recent call first):") >= 1
        assert f"autotune: the stacks of {s.label} (pid {s.pid}):\n{s.text}" in text
    line = (PROGRAMS / "hang_loop.py").read_text().splitlines().index(
        "                self.filled.wait_for(lambda: i in self.cache)  # in a forked worker: no thread fills it"
    ) + 1
    hang = Hang.of(stacks, PROGRAMS)
    assert hang == Hang(
        "loader",
        f"waiting for loader worker 0, which is in `Windows.__getitem__` (hang_loop.py:{line})",
        "loader worker 0 in Windows.__getitem__",
    )


def test_the_rank_that_stopped_is_the_one_not_waiting_in_torch():
    import importlib.util

    torch_dir = Path(importlib.util.find_spec("torch").origin).parent

    def dump(*frames):
        return "Current thread 0x00007f (most recent call first):\n" + "".join(
            f'  File "{f}", line {n} in {fn}\n' for f, n, fn in frames
        )

    waiting = dump((torch_dir / "autograd/graph.py", 824, "_engine_run_backward"), ("/w/train.py", 40, "main"))
    stopped = dump(("/w/train.py", 22, "wait_for_checkpoint"), ("/w/train.py", 36, "main"))
    stacks = [Stacks(1, "rank 0", waiting, True, 0), Stacks(2, "rank 1", stopped, True, 1)]
    assert Hang.of(stacks, "/w") == Hang(
        "rank",
        "rank 1 stopped in `wait_for_checkpoint` (train.py:22) while the other ranks waited for it",
        "rank 1 in wait_for_checkpoint",
        1,
    )
    both = [Stacks(1, "rank 0", stopped, True, 0), Stacks(2, "rank 1", stopped, True, 1)]
    assert Hang.of(both, "/w").line == "every rank's main thread was in `wait_for_checkpoint` (train.py:22)"


def test_a_function_is_named_with_its_class_where_its_source_says(tmp_path):
    (tmp_path / "m.py").write_text(
        "class Corpus:\n    def __getitem__(self, i):\n        def inner():\n            return i\n"
        "        return inner()\n\n\ndef main():\n    pass\n"
    )
    path = str(tmp_path / "m.py")
    assert qualified(path, 5, "__getitem__") == "Corpus.__getitem__"
    assert qualified(path, 4, "inner") == "inner" and qualified(path, 9, "main") == "main"
    assert qualified(str(tmp_path / "gone.py"), 1, "f") == "f"
