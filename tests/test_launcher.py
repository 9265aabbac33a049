"""Trials start warm (a fork server) and still start clean: nothing one trial
leaves in its process reaches the next."""

import json
import time
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.execution.launcher import Launch, SharedForkServer, _servers, run_in_process, trial_env
from autotune.host import procfs
from autotune.trial.result import TrialResult

ROOT = str(Path(__file__).resolve().parent.parent)
CONFIG = {
    "workload": {"factory": "tests.workloads:make_leaky"},
    "knobs": {},
    "warmup_steps": 1,
    "measure_steps": 3,
    "min_window_s": 0.1,
    "max_window_s": 0.3,
    "profile_steps": 0,
    "diagnose": False,
}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("launcher", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])  # spawn: the fallback
def test_each_trial_starts_from_a_clean_process(tmp_path, launcher):
    seen = []
    for i in range(3):
        result = run_in_process(CONFIG, tmp_path / str(i), 120, str(tmp_path.cwd()), {}, launch=Launch(launcher))
        assert result.status == "ok" and result.launcher == launcher, result
        seen.append(json.loads((tmp_path / str(i) / "seen.json").read_text()))
        if launcher == "fork" and i == 0:  # a group's SIGTERM or Ctrl-C reaches the server: the driver's to handle
            [signalled] = [s for key, s in _servers.items() if "tests.workloads" in key[1]]
            for sig in (signal.SIGTERM, signal.SIGINT):
                os.kill(signalled.proc.pid, sig)
            time.sleep(0.2)
    assert len({s["pid"] for s in seen}) == 3  # a process per trial
    assert all(s["sigterm_default"] for s in seen)  # the trials get SIGTERM back
    for s in seen:  # every trial finds the defaults the trial before it changed
        assert (s["cudnn_benchmark"], s["cuda_matmul_tf32"], s["matmul_precision"]) == (False, False, "highest")
        assert s["leaked_tensors"] == 0 and s["threads"] == seen[0]["threads"]  # the leak set 1
    if launcher == "fork":  # one warm server served them all, and never ran a trial itself
        [server] = [s for key, s in _servers.items() if "tests.workloads" in key[1]]
        assert server.alive() and server.proc.pid not in {s["pid"] for s in seen}
        assert server is signalled  # the signals did not end it (a new one would have served the rest)
        # the server's imports are frozen out of the collector: a full collection in a
        # trial would touch every page it shares with the server (a ~200-ms copy-on-write
        # stall inside a tiny_cnn window: step-time CV 1.2 against 0.1 spawned)
        assert all(s["frozen"] > 10_000 for s in seen)


@pytest.mark.slow  # CI tier: the timed-out trial below and test_reliability's faults (a hang with loader workers) kill hangs
@pytest.mark.timeout(120)
def test_a_hung_trial_is_killed_at_its_timeout_with_the_fork_server(tmp_path):
    config = {
        "workload": {"factory": "tests.workloads:make_faulty"},
        "knobs": {"batch_size": 64, "num_workers": 1},
        "warmup_steps": 1,
        "measure_steps": 3,
        "profile_steps": 0,
        "diagnose": False,
    }
    result = run_in_process(config, tmp_path, 8, str(tmp_path.cwd()), {}, launch=Launch("fork"))
    assert (result.status, result.error) == ("timeout", "trial ran past timeout_s=8 and was killed")
    assert 8 <= result.trial_wall_s < 30


@pytest.mark.timeout(200)
def test_one_shared_fork_server_serves_every_process_of_a_search(tmp_path):
    """A local search's driver starts one server (autotune.execution.driver); its trials'
    actors and the driver itself fork from it. Each trial is a fresh child of a
    handler, with exactly its request's environment (not the server's), and
    nothing outlives the server's lifeline."""
    cwd = str(tmp_path.cwd())
    server = SharedForkServer({**trial_env(cwd, {}), "AUTOTUNE_TEST_SERVER_ONLY": "1"}, ("tests.workloads",))
    try:
        results = [
            run_in_process(
                CONFIG,
                tmp_path / str(i),
                120,
                cwd,
                {},
                env={"AUTOTUNE_TEST_MARK": str(i)},
                launch=Launch(shared=server.path),
            )
            for i in range(2)
        ]
        # a SIGTERM to the search's process group (`timeout`'s, a scheduler's) reaches the server and this process's
        # handler: the driver stops the search, and they serve on until their lifeline ends (a README walk: the
        # server died first, and the pair in flight was recorded as failed, "the fork server exited")
        handler = json.loads((tmp_path / "1" / "seen.json").read_text())["ppid"]
        for pid in (server.proc.pid, handler):
            os.kill(pid, signal.SIGTERM)
        time.sleep(0.2)
        assert server.proc.poll() is None and procfs.process(handler)
        # another process of the search (a Ray actor's, in a search)
        script = (
            f"from autotune.execution.launcher import Launch, run_in_process; import json; print(json.dumps(run_in_process("
            f"{CONFIG!r}, {str(tmp_path / '2')!r}, 120, {cwd!r}, {{}}, env={{'AUTOTUNE_TEST_MARK': '2'}}, "
            f"launch=Launch(shared={server.path!r})).to_dict()))"
        )
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=cwd)
        results.append(TrialResult.from_dict(json.loads(out.stdout.strip().splitlines()[-1])))
        assert [(r.status, r.launcher) for r in results] == [("ok", "shared")] * 3, results
        seen = [json.loads((tmp_path / str(i) / "seen.json").read_text()) for i in range(3)]
        assert [s["mark"] for s in seen] == ["0", "1", "2"] and not any(s["server_only"] for s in seen)
        assert len({s["pid"] for s in seen}) == 3 and {s["grandparent"] for s in seen} == {server.proc.pid}
        for s in seen:  # every trial finds the defaults the trial before it changed, SIGTERM's too
            assert (s["cudnn_benchmark"], s["matmul_precision"], s["leaked_tensors"]) == (False, "highest", 0)
            assert s["sigterm_default"]
        handlers = {s["ppid"] for s in seen}
        assert len(handlers) == 2  # one per connection: this process's (reused), the other process's
    finally:
        server.close()
    assert server.proc.returncode is not None and not os.path.exists(server.dir)
    assert not any(procfs.process(pid) for pid in handlers)


def test_a_shared_server_that_is_not_there_falls_back_to_this_process_own(tmp_path):
    result = run_in_process(
        CONFIG, tmp_path, 120, str(tmp_path.cwd()), {}, launch=Launch(shared=str(tmp_path / "no-socket"))
    )
    assert (result.status, result.launcher) == ("ok", "fork"), result


@pytest.mark.slow  # in CI: the CLI's local searches through the shared fork server (test_program's no-spec search,
# test_local's), and a trial's text in its log (the failed and timed-out trials' tests here)
@pytest.mark.timeout(300)
def test_a_search_of_a_program_that_prints_runs_to_the_end_with_its_text_in_each_trial_log(tmp_path):
    """As a user runs it (the CLI: no Ray of the caller's, so the search's shared
    fork server forks every trial), a model that prints when built and a loss
    that writes to stderr: every trial runs to its end, its text in its trial.log.
    On the local backend: the server and its handlers' descriptors (the old EBADF)
    are the driver's on either backend, and a Ray start is ~10 s here."""
    from tests.conftest import write_spec

    spec = write_spec(
        tmp_path / "spec.yaml",
        workload={"factory": "tests.workloads:make_talking"},
        search_space={"preset": None, "knobs": {"set_to_none": [True, False]}},
        search={"n_trials": 2, "confirm_rounds": 0},
        output_dir=str(tmp_path / "run"),
    )
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "search", str(spec), "--quiet", "--backend", "local"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = sorted((tmp_path / "run" / "trials").rglob("result.json"))  # the baseline's re-read too
    assert len({p.relative_to(tmp_path / "run" / "trials").parts[0] for p in results}) == 2, results
    for path in results:
        result = TrialResult.read(path)
        assert result.status in ("ok", "pruned"), result  # pruned: measured, slower than the baseline
        log = (path.parent / "trial.log").read_text()
        assert "forkserver --listen " in log, log  # the search's shared server
        assert "number of parameters: 260\n" in log and "warning: labels look unbalanced\n" in log, log


def in_shared_server(config: dict, tmp_path, timeout_s: float = 120) -> tuple[TrialResult, str]:
    """A trial forked by a search's shared fork server; its result and its trial.log."""
    server = SharedForkServer(trial_env(ROOT, {}), ("tests.workloads",))
    try:
        result = run_in_process(config, tmp_path, timeout_s, ROOT, {}, launch=Launch(shared=server.path))
    finally:
        server.close()
    assert result.launcher in ("shared", "program-shared"), result
    return result, (tmp_path / "trial.log").read_text()


@pytest.mark.timeout(200)
def test_a_failed_trial_leaves_its_output_and_traceback_in_its_log(tmp_path):
    result, log = in_shared_server({**CONFIG, "workload": {"factory": "tests.workloads:make_failing"}}, tmp_path)
    assert result.status == "error" and result.error_type == "ValueError", result
    assert "Traceback (most recent call last):" in log and f"ValueError: {result.error}" in log, log
    assert 'tests/workloads.py", line' in log and "in bad_loss" in log  # the user's own line


@pytest.mark.timeout(300)
def test_a_two_rank_trial_leaves_every_rank_output_and_the_failing_rank_traceback_in_its_log(tmp_path):
    config = {
        **CONFIG,
        "workload": {"factory": "tests.workloads:make_talking", "args": {"fail_rank": 1}},
        "ranks": 2,
        "device": "cpu",
        "dist_timeout_s": 200,
    }
    result, log = in_shared_server(config, tmp_path, 240)
    assert result.status == "error" and result.error.startswith("rank 1: rank 1 cannot build its model"), result
    assert "rank 0 builds its model\n" in log and "rank 1 builds its model\n" in log, log
    assert "Traceback (most recent call last):" in log and "RuntimeError: rank 1 cannot build its model" in log, log


@pytest.mark.slow  # ~8 s of waiting for timeout_s: in CI, a hung trial killed at its timeout and recorded so in a
# search (test_reliability's every fault), and a trial's output and traceback in its log (the failed trials' here)
@pytest.mark.timeout(120)
def test_a_timed_out_trial_leaves_its_output_and_where_it_hung_in_its_log(tmp_path):
    config = {**CONFIG, "workload": {"factory": "tests.workloads:make_talking", "args": {"hang": True}}}
    result, log = in_shared_server(config, tmp_path, 8)
    assert (result.status, result.error) == ("timeout", "trial ran past timeout_s=8 and was killed"), result
    assert "number of parameters: 260\n" in log, log
    # every thread's stack at the timeout (faulthandler), the hanging line of the user's loss first
    assert "Current thread" in log and 'tests/workloads.py", line' in log and "in loss" in log, log
    assert log.endswith("autotune: the trial ran past timeout_s=8 and was killed\n"), log


# a torchrun-style program whose rank 1 fails after joining the group, while rank 0 waits for it in a collective
FAILING_RANK = """
import torch.distributed as dist

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} joined", flush=True)
if dist.get_rank() == 1:
    raise RuntimeError("rank 1 cannot go on")
dist.barrier()
"""


@pytest.mark.timeout(300)
def test_a_two_rank_program_is_forked_warm_a_rank_each_and_a_failing_rank_ends_the_other(tmp_path):
    """A program of 2 ranks forked from the search's shared server, as torchrun would start it: both ranks
    measured, one intra-op thread each (torch read the server's count at import), the ranks' CPU the trial's own;
    a rank that fails takes the other down at once (not left waiting in its barrier) with both outputs in one log."""
    import shutil

    shutil.copy(Path(ROOT) / "tests" / "programs" / "ddp_loop.py", tmp_path / "ddp_loop.py")  # it saves model.pt
    (tmp_path / "failing.py").write_text(FAILING_RANK)
    trial = {"warmup_steps": 2, "measure_steps": 5, "min_window_s": 0.2, "max_window_s": 1.0, "profile_steps": 0}
    program = {"command": ["python", "ddp_loop.py", "--steps", "2000", "--batch_size", "16"], "dir": str(tmp_path)}
    config = {**trial, "workload": program, "knobs": {}, "ranks": 2, "device": "cpu", "dist_timeout_s": 200}
    result, log = in_shared_server(config, tmp_path / "ok", 240)
    assert result.status == "ok" and result.launcher == "program-shared", (result, log)
    assert [(r.rank, r.status) for r in result.ranks] == [(0, "ok"), (1, "ok")]
    assert result.device.torch_threads == 1 and not result.disturbed, result.device
    failing = {**config, "workload": {"command": ["python", "failing.py"], "dir": str(tmp_path)}}
    result, log = in_shared_server(failing, tmp_path / "failing", 240)
    # the instrumentation's loop on each rank (torch imported) records the exception that ended rank 1
    assert result.status == "error" and result.error_type == "RuntimeError" and result.launcher == "program-shared"
    assert "rank 1 cannot go on" in result.error, result.error
    assert "rank 0 joined\n" in log and "rank 1 joined\n" in log and "RuntimeError: rank 1 cannot go on" in log, log
    assert result.trial_wall_s < 60  # rank 0 killed, not left in its barrier until the group's timeout


ENV_STEPS = """
import os
import autotune

cfg = autotune.config()
with open(os.path.join(os.environ["AUTOTUNE_TRIAL_DIR"], "alloc.txt"), "w") as f:
    f.write(os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "unset"))
for _ in range(100000):
    cfg.step(samples=1)
"""


# a program trial's shortest window: a step of warm-up, two timed, no profile or diagnosis
ONE_STEP_WINDOW = {
    "warmup_steps": 1,
    "measure_steps": 2,
    "min_window_s": 0.0,
    "max_window_s": 0.2,
    "profile_steps": 0,
    "diagnose": False,
}


@pytest.mark.timeout(200)
def test_an_environment_knob_starts_its_trial_fresh_with_the_variable_set(tmp_path):
    """expandable_segments is read when torch's CUDA allocator starts: its trial is a process started with
    PYTORCH_CUDA_ALLOC_CONF (the user's own setting kept beside it), never a fork of the warm server. (On this
    CPU the variable does nothing: the launch is what is checked.)"""
    (tmp_path / "env_steps.py").write_text(ENV_STEPS)
    config = {"workload": {"command": ["python", "env_steps.py"], "dir": str(tmp_path)}, **ONE_STEP_WINDOW}
    seen = {}
    for on in (False, True):
        trial = tmp_path / str(on)
        knobs = {"expandable_segments": True} if on else {}
        result = run_in_process({**config, "knobs": knobs}, trial, 120, ROOT, {}, launch=Launch("fork"))
        assert result.status == "ok", result.error
        seen[on] = (result.launcher, (trial / "alloc.txt").read_text())
    assert seen[False] == ("program-fork", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "unset"))
    assert seen[True] == ("program", "expandable_segments:True")


LAUNCHED_STEPS = """
import json, os
import torch
import autotune

cfg = autotune.config()
names = ("ACCELERATE_MIXED_PRECISION", "RANK", "WORLD_SIZE", "MASTER_ADDR")
seen = {"threads": torch.get_num_threads(), **{k: os.environ.get(k) for k in names}}
with open(os.path.join(os.environ["AUTOTUNE_TRIAL_DIR"], "seen.json"), "w") as f:
    json.dump(seen, f)
for _ in range(100000):
    cfg.step(samples=1)
"""


@pytest.mark.timeout(200)
def test_a_launchers_one_rank_is_forked_warm_with_the_environment_the_launcher_gives_it(tmp_path):
    """`torchrun --nproc-per-node 1` / `accelerate launch --multi_gpu`'s rank (workload.launcher, autotune.spec
    .launched): forked from the warm server with the launcher's environment, torchrun's at one rank, and the
    launcher's OMP_NUM_THREADS as torch's threads (the server read its own at import)."""
    (tmp_path / "launched.py").write_text(LAUNCHED_STEPS)
    launcher = {"command": ["torchrun"], "env": {"OMP_NUM_THREADS": "1", "ACCELERATE_MIXED_PRECISION": "bf16"}}
    config = {
        "workload": {
            "command": ["python", "launched.py"],
            "dir": str(tmp_path),
            "launcher": {**launcher, "rank_env": True},
        },
        "knobs": {},
        **ONE_STEP_WINDOW,
    }
    result = run_in_process(config, tmp_path / "t", 120, ROOT, {"OMP_NUM_THREADS": None}, launch=Launch("fork"))
    assert (result.status, result.launcher) == ("ok", "program-fork"), result.error
    seen = json.loads((tmp_path / "t" / "seen.json").read_text())
    assert seen == {"threads": 1, "ACCELERATE_MIXED_PRECISION": "bf16", "RANK": "0", "WORLD_SIZE": "1",
                    "MASTER_ADDR": "127.0.0.1"}  # fmt: skip


@pytest.mark.timeout(200)
# forked warm (run_ranks), or plain processes (_wait_procs: slow, ~11 s; in CI the same Watch ends forked ranks here,
# and a fresh process's trial is waited on by _wait_procs in test_launcher's environment-knob test)
@pytest.mark.parametrize("launcher", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_a_program_with_no_first_step_in_its_limit_is_ended_with_its_stacks_and_says_what_it_did(tmp_path, launcher):
    """Two ranks of a program that builds its model and optimizer, then waits forever: ended at its first-step
    limit (autotune.execution.watch), not at its timeout, every rank's stacks in its log, one line that says
    what it did and where its main thread was (the facts as torch's hooks noted them; the stacks from the
    faulthandler the instrumentation registers in a trial)."""
    from autotune.execution.watch import Limits
    from tests.test_program import NO_STEP, NO_STEP_LINE

    (tmp_path / "prog.py").write_text(NO_STEP)
    config = {**CONFIG, "workload": {"command": ["python", "prog.py"], "dir": str(tmp_path)}, "ranks": 2}
    trial = tmp_path / "trial"
    limit = 3 if launcher == "fork" else 10  # a fresh process imports torch in it: 2-3 s here, more under load
    result = run_in_process(config, trial, 120, ROOT, {}, launch=Launch(launcher), limits=Limits(limit))
    assert (result.status, result.error_type) == ("hung", "NoStep"), result
    assert result.launcher == ("program-fork" if launcher == "fork" else "program")
    said = (
        f"the program finished no optimizer step within its first-step limit of 0:{limit:02d} (`--first-step-limit` "
        "or trial.first_step_s sets it): it imported torch and made an optimizer, but iterated no DataLoader"
    )
    where = f"; every rank's main thread was in `wait_forever` (prog.py:{NO_STEP_LINE})"
    log = (trial / "trial.log").read_text()
    assert result.error == f"{said}{where}; see {trial / 'trial.log'}"
    assert result.hung == {"kind": "main", "where": f"wait_forever (prog.py:{NO_STEP_LINE})", "rank": 0}
    assert log.count("Current thread") == 2, log  # each rank's stacks (the instrumentation's faulthandler)
    for rank in (0, 1):  # one at a time, each after a line that names it
        assert log.count(f"autotune: the stacks of rank {rank} (pid ") == 1, log
    assert log.endswith(f"autotune: ended (hung): {result.error}\n"), log
    assert TrialResult.read(trial / "result.json").hung == result.hung  # what a resumed search reads back
    assert limit <= result.trial_wall_s < limit + 15, result.trial_wall_s


def processes_in(path: Path) -> list[int]:
    """PIDs whose working directory is under `path` (a trial's processes run in its trial dir or its program's)."""
    return [pid for pid in procfs.processes(live=True) if str(procfs.cwd(pid)).startswith(str(path))]


@pytest.mark.slow  # in CI: test_program's search of the same program (hung, the worker's frame and stacks, no
# process left), test_watch's stacks of a worker and of the main process waiting for it
@pytest.mark.timeout(200)
def test_a_program_whose_loader_worker_never_returns_a_batch_is_hung_naming_the_worker_frame(tmp_path):
    """tests/programs/hang_loop.py with a loader worker (the trial's num_workers, through torch's hooks): its
    worker waits forever in its Dataset. Ended at its first-step limit as `hung`, every process's stacks in its
    log after a line naming it, the line naming the worker's frame; no process left behind."""
    import shutil

    from autotune.execution.watch import Limits

    shutil.copy(Path(ROOT) / "tests" / "programs" / "hang_loop.py", tmp_path / "hang_loop.py")
    program = {"command": ["python", "hang_loop.py", "--steps", "100000"], "dir": str(tmp_path)}
    config = {**ONE_STEP_WINDOW, "workload": program, "knobs": {"num_workers": 1}, "device": "cpu"}
    trial = tmp_path / "trial"
    result = run_in_process(config, trial, 120, ROOT, {}, limits=Limits(first_step_s=5))
    assert (result.status, result.error_type) == ("hung", "NoStep"), result
    assert result.hung == {"kind": "loader", "where": "loader worker 0 in Windows.__getitem__"}
    line = (tmp_path / "hang_loop.py").read_text().splitlines().index(
        "                self.filled.wait_for(lambda: i in self.cache)  # in a forked worker: no thread fills it"
    ) + 1
    assert f"; waiting for loader worker 0, which is in `Windows.__getitem__` (hang_loop.py:{line}); " in result.error
    assert result.error.startswith("the program finished no optimizer step within its first-step limit of 0:05")
    log = (trial / "trial.log").read_text()
    assert (
        "autotune: the stacks of the main process (pid " in log
        and "autotune: the stacks of loader worker 0 (pid " in log
    )
    assert result.trial_wall_s < 5 + 30
    assert processes_in(tmp_path) == []  # the program and its worker


@pytest.mark.timeout(300)
def test_a_rank_that_stops_stepping_ends_its_trial_hung_and_leaves_no_process(tmp_path):
    """tests/programs/rank_hang.py on 2 ranks: rank 1 stops after 20 steps, rank 0 waits in its all-reduce. The
    gap past the stall limit ends the trial `hung`, naming rank 1's frame, within 30 s of its last step; every
    rank's process is gone at once. (Its search, with the default stall limit from the probe: test_watch's.)"""
    import shutil

    from autotune.execution.watch import Limits

    shutil.copy(Path(ROOT) / "tests" / "programs" / "rank_hang.py", tmp_path / "rank_hang.py")
    program = {"command": ["python", "rank_hang.py", "--steps", "2000"], "dir": str(tmp_path)}
    window = {**ONE_STEP_WINDOW, "warmup_steps": 5, "min_window_s": 60.0, "max_window_s": 120.0}  # past step 20
    config = {**window, "workload": program, "knobs": {}, "ranks": 2, "device": "cpu", "dist_timeout_s": 200}
    trial = tmp_path / "trial"
    result = run_in_process(config, trial, 240, ROOT, {}, limits=Limits(first_step_s=60, stall_s=5))
    ended = time.time()
    assert (result.status, result.error_type) == ("hung", "Stalled"), result
    assert result.hung == {"kind": "rank", "where": "rank 1 in wait_for_checkpoint", "rank": 1}
    line = (tmp_path / "rank_hang.py").read_text().splitlines().index("    go.wait()  # nothing ever sets it") + 1
    assert result.error.startswith("no optimizer step for 0:05 after ")
    assert (
        f"; rank 1 stopped in `wait_for_checkpoint` (rank_hang.py:{line}) while the other ranks waited" in result.error
    )
    last_step = max((trial / f"beat.{r}").stat().st_mtime for r in (0, 1))
    assert ended - last_step < 30
    assert processes_in(tmp_path) == []


@pytest.mark.timeout(200)
def test_a_built_in_trial_that_hangs_at_its_first_step_and_one_the_budget_cuts(tmp_path):
    """The built-in runner's trials are watched too: make_faulty's batch 64 from a loader worker hangs in its loss
    (its main thread, named); a trial running at the budget's end (`cut_unix`) is cut there, recorded `cut`."""
    from autotune.execution.watch import Limits

    config = {
        **CONFIG,
        "workload": {"factory": "tests.workloads:make_faulty"},
        "knobs": {"batch_size": 64, "num_workers": 1},
    }
    result = run_in_process(config, tmp_path / "hung", 120, ROOT, {}, limits=Limits(first_step_s=3))
    assert (result.status, result.error_type, result.hung["kind"]) == ("hung", "NoStep", "main"), result
    assert "; its main thread was in `loss` (" in result.error and "tests/workloads.py:" in result.error
    assert result.trial_wall_s < 3 + 30
    endless = {**CONFIG, "min_window_s": 120.0, "max_window_s": 240.0, "measure_steps": 10**6}
    result = run_in_process(endless, tmp_path / "cut", 120, ROOT, {}, limits=Limits(cut_unix=time.time() + 6))
    assert (result.status, result.error_type) == ("cut", "Cut"), result
    assert result.error.startswith("the search's time budget ended 0:0") and result.trial_wall_s < 6 + 15
    assert TrialResult.read(tmp_path / "cut" / "result.json").status == "cut"  # a resumed search reads it back
    assert processes_in(tmp_path) == []
