"""Starting trial processes. Every trial is a fresh process in its own session,
in its trial dir (config.json, result.json, trial.log, trace.json), killed with
its whole process group (loader workers included) at the timeout. Its inductor and
Triton caches are the search's (`Launch.compile_cache`, one in the run dir): a graph
one trial compiled is a cache hit in the next, as it will be in production, which
loads the winner's compiled artifacts (autotune.trial.compiled); the trial records
what its compile cost with that cache (`compile_s`), and its window never includes
it. Without a search's cache (a trial run alone, on another node), each trial has
its own, removed after it.

Two ways to start one:
- `fork` (default): a warm fork server (`autotune.execution.forkserver`) that has imported
  torch, torchvision, the runner and the workload's module forks the trial, so a
  trial does not pay the imports again (measured in scripts/bench/bench_overhead.py);
  the server never runs a trial, so nothing of one trial reaches the next. A
  local search shares one server (`SharedForkServer`, started by the driver
  beside Ray) among its trials' actors and its re-measurements; otherwise each
  process that launches trials keeps its own;
- `spawn`: `python -m autotune.trial` from scratch (also what users run by hand).
Set AUTOTUNE_LAUNCHER=spawn to force the second.

A user's program (`workload.command`) is forked from the same server where it is
Python (`python FILE ...`, `python -m MODULE ...`; `forks_program`) with no
environment knob of its own, a process per rank where it has several; otherwise
(another command, an environment knob, spawn) it runs as plain processes. A
launcher's line (`torchrun ...`, `accelerate launch ...`) is its ranks' command
(autotune.spec.launched), forked the same way: the environment the launcher gives
a rank (accelerate's ACCELERATE_*, read by the program when it runs) is in the
child's, its OMP_NUM_THREADS as torch's intra-op threads (`forkserver`).

A trial with a built-in environment knob on (`expandable_segments`: its
PYTORCH_CUDA_ALLOC_CONF, `autotune.knobs.environment`) is never forked, program or
not: it starts as a fresh process with the variable in its environment, as
`autotune run` starts the program in production. The server never touched CUDA,
and torch reads the variable when its caching allocator first initializes, so a
fork would likely honour it; but where torch parses it (2.9 moved it into a shared
accelerator allocator config, which may be read at import) is its internals,
unchecked without a GPU, and a warm fork would time the server's allocator if it
were read early. A fresh process costs the imports (2-3 s here), on a CUDA device
only.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.execution.forkserver import kill_group
from autotune.execution.watch import WATCH_S, Limits, Watch, saw
from autotune.trial import progress
from autotune.trial.compiled import CACHE_DIRS
from autotune.trial.result import TrialResult, failed as failed_result

# thread-count variables a launcher may set (Ray sets OMP_NUM_THREADS in its workers):
# a trial process gets the user's own values, so what is timed is what the user runs
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
LAUNCHERS = ("fork", "spawn")


def user_thread_env() -> dict[str, str | None]:
    """The thread settings of this (the user's) process, for its trials."""
    return {name: os.environ.get(name) for name in THREAD_ENV}


def trial_env(pythonpath: str | None, thread_env: dict[str, str | None] | None) -> dict[str, str]:
    """The environment of every trial of a search: this one, the user's module path
    first, the user's own thread settings, and a watch on the parent."""
    env = dict(os.environ, AUTOTUNE_WATCH_PARENT="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    for name, value in (thread_env or {}).items():  # the user's, not the launcher's
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def _time_out(*pids: int) -> None:
    """A trial past its timeout: every process of its groups (a rank each) writes
    its threads' stacks to trial.log (the SIGUSR1 of autotune.trial's
    faulthandler), then the groups are killed."""
    for pid in pids:  # one group at a time: ranks dumping at once into one log interleave their lines
        kill_group(pid, signal.SIGUSR1)
        time.sleep(STACKS_S if len(pids) == 1 else STACKS_S / 2)
    for pid in pids:
        kill_group(pid, signal.SIGKILL)


STACKS_S = 0.5  # the dump is a few ms; a loaded host's scheduler may take longer


class _Lines:
    """JSON lines read from a descriptor with no buffer that select cannot see."""

    def __init__(self, fd: int):
        self.fd, self.buf = fd, b""

    def read(self, timeout: float | None) -> dict | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buf:
            ready, _, _ = select.select(
                [self.fd], [], [], None if deadline is None else max(0.0, deadline - time.monotonic())
            )
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise RuntimeError("the fork server exited")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)


class _Stream:
    """A stream to a fork server (autotune.execution.forkserver's protocol): one trial at a time."""

    lines: _Lines
    first_answer_s = 60.0  # the server is ready: a fork is quick

    def send(self, data: bytes) -> None:
        raise NotImplementedError

    def run(
        self,
        trial_dir: Path,
        env: dict[str, str],
        timeout_s: float,
        program: dict | None = None,
        watch: Watch | None = None,
    ) -> int:
        """Fork a trial with exactly `env` (`program`: a user's Python program's {"argv", "cwd"}
        instead of the runner); wait for it, killing its process group at the timeout, or
        where `watch` says so. Returns its exit code (negative: killed by that signal)."""
        request = {"dir": str(trial_dir), "env": env}
        request.update({"program": program} if program else {"argv": ["config.json", "-o", "result.json"]})
        done = self._request(request, timeout_s, lambda answer: [answer["pid"]], watch)
        return os.waitstatus_to_exitcode(done["status"])

    def run_ranks(
        self, trial_dir: Path, envs: list[dict[str, str]], timeout_s: float, program: dict, watch: Watch | None = None
    ) -> tuple[int, dict[int, str]]:
        """Fork a program once per rank (`envs`, a rank's each), all killed once one fails,
        at the timeout, or where `watch` says so: (the first nonzero exit code, rank -> why it
        ended badly), as `_processes` gives for ranks started fresh."""
        request = {"dir": str(trial_dir), "env": envs[0], "ranks": envs, "program": program}
        done = self._request(request, timeout_s, lambda answer: answer["pids"], watch)
        codes = [os.waitstatus_to_exitcode(s) for s in done["statuses"]]
        died = {
            r: f"rank {r} exited with code {c}" + (" (killed: another rank failed)" if r in done["killed"] else "")
            for r, c in enumerate(codes)
            if c
        }
        return next((c for c in codes if c), 0), died

    def _request(self, request: dict, timeout_s: float, pids_of, watch: Watch | None = None) -> dict:
        """Send one request; wait for its end, killing its process groups at the timeout, or
        where `watch` (checked every WATCH_S) says so."""
        self.send((json.dumps(request) + "\n").encode())
        answer = self.lines.read(timeout=self.first_answer_s)
        if answer is None:
            raise RuntimeError("the fork server did not answer")
        pids, deadline = pids_of(answer), time.monotonic() + timeout_s
        if watch:  # forked: its program has started
            watch.start()
        try:
            while True:
                left = deadline - time.monotonic()
                done = self.lines.read(timeout=max(0.0, min(left, WATCH_S) if watch else left))
                if done is not None:
                    break
                if time.monotonic() >= deadline or (watch and watch.check()):
                    _time_out(*pids)
                    done = self.lines.read(timeout=60)
                    break
        except BaseException:  # the caller was cancelled: take the process groups along
            for pid in pids:
                kill_group(pid)
            raise
        return done


class ForkServer(_Stream):
    """A running `python -m autotune.execution.forkserver`, started with a search's env, on its pipes."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...]):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.execution.forkserver", *preload],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.lines = _Lines(self.proc.stdout.fileno())
        ready = self.lines.read(timeout=120)
        if not ready or "ready" not in ready:
            self.close()
            raise RuntimeError("the fork server did not start")

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Connection(_Stream):
    """A stream to the search's shared fork server (`SharedForkServer`), from any
    process of the search on its host: a Ray Tune trial's actor or the driver."""

    first_answer_s = 300.0  # the first connection may wait while the server imports torch

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self.lines = _Lines(self.sock.fileno())

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def alive(self) -> bool:
        """Not closed by the server (which never writes between trials: readable means gone)."""
        if self.sock.fileno() < 0:
            return False
        readable, _, _ = select.select([self.sock], [], [], 0)
        return not readable or self.sock.recv(1, socket.MSG_PEEK) != b""

    def close(self) -> None:
        self.sock.close()


class SharedForkServer:
    """One warm fork server for every trial of a local search and its re-measurements
    (`python -m autotune.execution.forkserver --listen`): started by the driver before Ray, so its
    imports overlap Ray's start, and never paid again by the re-measurement. Its socket
    sits in a private dir (0700); its stdin is its lifeline to the driver."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...]):
        self.dir = tempfile.mkdtemp(prefix="autotune-fork-")
        self.path = os.path.join(self.dir, "socket")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.execution.forkserver", "--listen", self.path, *preload],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not os.path.exists(self.path) and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # bound before its imports: Python's own start, ~0.1 s

    def close(self) -> None:
        mine = _servers.pop(("shared", self.path), None)  # this process's own connection
        if mine:
            mine.close()
        self.proc.stdin.close()  # the lifeline: the server kills its handlers and goes
        try:
            self.proc.wait(timeout=2)  # at once, unless it is still importing (then its trials never came)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_servers: dict[tuple, _Stream] = {}


def _server(env: dict[str, str], preload: tuple[str, ...], shared: str | None = None) -> _Stream:
    """The shared server's stream when the search has one (`shared`: its socket),
    else one server per (environment, preloaded modules) in this process; either
    is reused by this process's trials."""
    key = ("shared", shared) if shared else (tuple(sorted(env.items())), preload)
    server = _servers.get(key)
    if server is None or not server.alive():
        server = _servers[key] = Connection(shared) if shared else ForkServer(env, preload)
    return server


def _spawn(trial_dir: Path, env: dict[str, str], timeout_s: float) -> int:
    with open(trial_dir / "trial.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autotune.trial", "config.json", "-o", "result.json"],
            cwd=trial_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _time_out(proc.pid)
            proc.wait()
        except BaseException:  # the caller was cancelled: take the process group along
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    return proc.returncode


def program_env(trial_dir: Path) -> dict[str, str]:
    """What a user's program gets in a trial beside AUTOTUNE_TRIAL (README, "Your own
    program as the trial"): its trial dir, and its own tracking and hub traffic
    off or pointed there, so a trial leaves no run, upload or download behind."""
    return {
        "AUTOTUNE_TRIAL": str(trial_dir / "config.json"),
        "AUTOTUNE_TRIAL_DIR": str(trial_dir),
        "WANDB_MODE": "disabled",
        "WANDB_DIR": str(trial_dir),
        "MLFLOW_TRACKING_URI": (trial_dir / "mlruns").as_uri(),
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONUNBUFFERED": "1",
    }


# launchers run as modules of the interpreter autotune runs in: what they start is what the trials ran
LAUNCHER_MODULES = {"torchrun": "torch.distributed.run", "accelerate-launch": "accelerate.commands.launch"}


def program_command(command: list[str]) -> list[str]:
    """The program's command, `python`/`python3` as the interpreter autotune runs in
    (the one that has torch and autotune; `sys.executable`), and so `torchrun` and
    `accelerate launch` (as `python -m` their modules), whose ranks the trials ran there."""
    if command[0] in ("python", "python3"):
        return [sys.executable, *command[1:]]
    if command[0] == "accelerate" and command[1:2] == ["launch"]:
        return [sys.executable, "-m", LAUNCHER_MODULES["accelerate-launch"], *command[2:]]
    if command[0] in LAUNCHER_MODULES:
        return [sys.executable, "-m", LAUNCHER_MODULES[command[0]], *command[1:]]
    return list(command)


NO_STEP = (
    "a trial measures a torch optimizer's steps (a loop that steps none reports its own: `cfg = "
    "autotune.config()`, then `cfg.step(samples=n, loss=loss)` at the end of each step)"
)


def _program(
    trial_dir: Path,
    env: dict[str, str],
    timeout_s: float,
    workload: dict[str, Any],
    ranks: int | None = None,
    server: _Stream | None = None,
    *,
    limits: Limits | None = None,
) -> tuple[int | None, TrialResult | None]:
    """Run the user's program (`workload.command`, from `workload.dir`) as this trial's
    process: its exit code, and a failed result where it never reached a measured
    step (what to add, in one line), or was ended by its `limits` (its first step
    too late: `autotune.execution.watch`); otherwise its measured loop wrote result.json
    (autotune.trial.loop), or it died, and the trial is classified as any other.
    `ranks` (a multi-rank search's trials, its scaling reference's 1 too): one process
    a rank under torchrun's environment, as `torchrun --nproc-per-node` starts them
    (one thread each unless OMP_NUM_THREADS is set), all killed once one fails; their
    rank<R>.json merged into result.json (`ranks.merge`); a launcher's line (`workload.launcher`,
    autotune.spec.launched) gives each rank its environment (accelerate's), and torchrun's at one rank
    too. `server`: a warm fork server to fork a Python program from (`forks_program`)."""
    from autotune import instrument  # a Trainer script's zero-code instrumentation on its path
    from autotune.trial import ranks as R
    from autotune.trial.disturbance import TRIAL_PID
    from autotune.trial.progress import FIRST_STEP_FILE, SEEN_FILE

    for left in (FIRST_STEP_FILE, SEEN_FILE):  # an earlier run's in this dir (a resumed search's probe)
        (trial_dir / left).unlink(missing_ok=True)
    watch = Watch(trial_dir, limits)
    command = program_command(workload["command"])
    launcher = workload.get("launcher") or {}  # a launcher's line: the environment it gives each rank
    env = {**env, **program_env(trial_dir), **launcher.get("env", {}), **(workload.get("env") or {})}  # searched last
    env = instrument.with_env({k: v for k, v in env.items() if v != ""})  # '': left unset; a Trainer script's
    # zero-code instrumentation first on its path (autotune.instrument)
    envs = [env]
    ranks = ranks or (1 if launcher.get("rank_env") else None)  # `torchrun --nproc-per-node 1`: its one rank's too
    if ranks:
        port = R.free_port()
        # one thread a rank, as torchrun sets; the ranks' CPU is the trial's own (autotune.trial.disturbance)
        several = {} if ranks == 1 else {TRIAL_PID: str(os.getpid()), "OMP_NUM_THREADS": "1"}
        envs = [{**several, **env, **R.torchrun_env(r, ranks, port)} for r in range(ranks)]
    cwd = workload.get("dir") or str(trial_dir)
    if server is not None:  # forked warm (`forkserver._program`), a process per rank
        started, program = time.monotonic(), {"argv": command[1:], "cwd": cwd}
        if len(envs) > 1:
            code, died = server.run_ranks(trial_dir, envs, timeout_s, program, watch)
        else:
            code, died = server.run(trial_dir, envs[0], timeout_s, program, watch), {}
        timed_out = code == -signal.SIGKILL and time.monotonic() - started >= timeout_s
    else:
        try:
            code, timed_out, died = _processes(command, envs, cwd, trial_dir / "trial.log", timeout_s, watch)
        except OSError as e:
            return None, failed_result(
                "error",
                "CommandNotFound",
                f"workload.command: cannot run `{command[0]}`: {e.strerror}; give a command that "
                "runs your training program, e.g. `python train.py`",
            )
    if watch.ended:  # its limits ended it: what it did, and where it was (its stacks, in its log)
        failed = failed_result("error", "NoStep", watch.why(cwd))
        with open(trial_dir / "trial.log", "a") as log:
            print(f"autotune: ended: {failed.error}", file=log)
        return code, failed
    if (ranks or 1) > 1 and any((trial_dir / R.RANK_FILE.format(r)).exists() for r in range(ranks)):
        R.collect(str(trial_dir), ranks, died).write(trial_dir / "result.json")
    if (trial_dir / "result.json").exists() or (trial_dir / FIRST_STEP_FILE).exists():
        return code, None  # its own result, or it ended after its first step: classified as any trial
    tail = (trial_dir / "trial.log").read_text(errors="replace")[-1500:].strip().splitlines()
    how = (
        f"ran past timeout_s={timeout_s:g}"
        if timed_out
        else f"exited with code {code}" + (f" ({tail[-1][:200]})" if code and tail else "")
    )
    return code, failed_result(
        "error",
        "NoStep",
        f"the program {how} before its first optimizer step ({saw(progress.seen(trial_dir))}): {NO_STEP}; "
        f"see {trial_dir / 'trial.log'}",
    )


def _processes(
    command: list[str],
    envs: list[dict[str, str]],
    cwd: str,
    log_path: Path,
    timeout_s: float,
    watch: Watch | None = None,
) -> tuple[int, bool, dict[int, str]]:
    """`command` once per environment in `envs` (a rank each), each in a session of its own, all
    writing to one log (as torchrun's ranks do to its output), ended at the timeout or where
    `watch` says so: (the first nonzero exit code, timed out, rank -> why it ended badly)."""
    procs: list[subprocess.Popen] = []
    with open(log_path, "w") as log:
        try:
            if watch:
                watch.start()
            for env in envs:
                procs.append(
                    subprocess.Popen(
                        command,
                        cwd=cwd,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=env,
                        start_new_session=True,
                    )
                )
            timed_out, died = _wait_procs(procs, timeout_s, watch)
        finally:  # its loader workers, or anything else it started, go with it (and all of it when cancelled)
            _kill(procs)
    # timed out: killed, as a forked trial is (its stacks' SIGUSR1 may have ended it first, where nothing caught it)
    return -signal.SIGKILL if timed_out else next((p.returncode for p in procs if p.returncode), 0), timed_out, died


def _wait_procs(
    procs: list[subprocess.Popen], timeout_s: float, watch: Watch | None = None
) -> tuple[bool, dict[int, str]]:
    """Wait for every process (a rank each); once one fails, kill the others (they would
    wait in a collective until the group's timeout). At the timeout, or where `watch` says
    so, their stacks go to the log and they are killed (`_time_out`). (timed out, rank ->
    why it ended badly)."""
    deadline, died = time.monotonic() + timeout_s, {}
    while any(p.poll() is None for p in procs):
        timed_out = time.monotonic() > deadline
        if timed_out or (watch and watch.check()):
            _time_out(*(p.pid for p in procs))
            return timed_out, died
        for r, p in enumerate(procs):
            if p.poll() not in (None, 0) and r not in died:
                died[r] = f"rank {r} exited with code {p.returncode}" + (
                    " (killed: another rank failed)" if died else ""
                )
                _kill(procs)
        time.sleep(0.05)
    for r, p in enumerate(procs):
        if p.returncode and r not in died:
            died[r] = f"rank {r} exited with code {p.returncode}"
    return False, died


def _kill(procs: list[subprocess.Popen]) -> None:
    """Each process's whole group (it ran in a session of its own), reaped."""
    for p in procs:
        kill_group(p.pid)
        p.wait()


def forks_program(workload: dict[str, Any]) -> bool:
    """Whether a program's trial can be forked from the warm server: `python FILE ...` or
    `python -m MODULE ...` (a process per rank), and no environment of its own (a forked
    child keeps its parent's OpenMP and allocator, which the environment would change; a
    rank's one intra-op thread is set in the child, `forkserver`)."""
    command = workload["command"]
    python = command[0] in ("python", "python3") and len(command) > 1
    runnable = python and (command[1] == "-m" and len(command) > 2 or not command[1].startswith("-"))
    return runnable and not workload.get("env")


def preload_for(config: dict[str, Any]) -> tuple[str, ...]:
    """The workload's module, for the fork server to import once."""
    from autotune.workload import BUILTINS

    wl = config.get("workload") or {}
    ref = BUILTINS.get(wl.get("name") or "", wl.get("factory") or "")
    return (ref.partition(":")[0],) if ":" in ref else ()


@dataclass(frozen=True)
class Launch:
    """How a trial's process starts (the module doc's two ways)."""

    launcher: str | None = None
    """`fork` or `spawn` (LAUNCHERS; None: AUTOTUNE_LAUNCHER, else fork)"""
    shared: str | None = None
    """the socket of the search's shared fork server (`SharedForkServer`), forked from when it answers; otherwise
    this process's own"""
    compile_cache: str | None = None
    """the search's compile cache (its `inductor` and `triton` dirs, shared by its trials: the module doc); None:
    the trial's own in its dir, removed after it"""


def compile_caches(trial_dir: Path, shared: str | None = None) -> dict[str, str]:
    """A trial's inductor and Triton cache dirs, as their variables: the search's (`shared`), else its own."""
    root = Path(shared) if shared else trial_dir
    return {var: str(root / (name if shared else f"{name}-cache")) for var, name in CACHE_DIRS.items()}


def run_in_process(
    config: dict[str, Any],
    trial_dir,
    timeout_s: float,
    pythonpath: str | None = None,
    thread_env: dict[str, str | None] | None = None,
    *,
    launch: Launch | None = None,
    env: dict[str, str] | None = None,
    limits: Limits | None = None,
) -> TrialResult:
    """Run one trial in a fresh process (see the module doc), started as `launch` says; the result is its
    result.json, or what killed it, with `trial_wall_s` (what the trial cost,
    start-up included) and `launcher`. `env`: this trial's own variables (a
    rank's RANK, MASTER_ADDR...; the fork server stays the search's). `limits`: a user's program's
    (`autotune.execution.watch`: its first step in time)."""
    launch = launch or Launch()
    launcher, shared = launch.launcher or os.environ.get("AUTOTUNE_LAUNCHER", "fork"), launch.shared
    if launcher not in LAUNCHERS:
        raise ValueError(f"AUTOTUNE_LAUNCHER={launcher!r}; allowed: {', '.join(LAUNCHERS)}")
    trial_dir = Path(trial_dir).resolve()
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    out = trial_dir / "result.json"
    own = env or {}
    base = trial_env(pythonpath, thread_env)  # the search's (a fork server's); then this trial's own
    from autotune.knobs import environment

    knob_env = environment(config.get("knobs") or {}, base)  # an environment knob: a fresh process (module doc)
    caches = compile_caches(trial_dir, launch.compile_cache)
    env = {**base, **caches, **knob_env, **own}
    started = time.perf_counter()
    program, failed = bool((config.get("workload") or {}).get("command")), None
    try:
        server = None
        # the user's own program: forked too where it is Python, else a fresh process of its own
        if launcher == "fork" and not knob_env and (not program or forks_program(config["workload"])):
            for where in (shared, None) if shared else (None,):
                try:
                    server = _server(base, preload_for(config), where)
                    launcher = "shared" if where else "fork"
                    break
                except (OSError, RuntimeError):  # not there: this process's own server, else from scratch
                    continue
        launcher = launcher if server else "spawn"
        if program:
            launcher = f"program-{launcher}" if server else "program"
            code, failed = _program(
                trial_dir, env, timeout_s, config["workload"], config.get("ranks"), server, limits=limits
            )
        else:
            code = server.run(trial_dir, env, timeout_s) if server else _spawn(trial_dir, env, timeout_s)
    finally:
        if not launch.compile_cache:  # the trial's own (~150 MB per compile trial)
            for cache in caches.values():
                shutil.rmtree(cache, ignore_errors=True)
    wall = time.perf_counter() - started
    if failed:
        result = failed
    elif code == -signal.SIGKILL and not out.exists():
        result = failed_result("timeout", "Timeout", f"trial ran past timeout_s={timeout_s:g} and was killed")
        with open(trial_dir / "trial.log", "a") as log:  # after its stacks: where it was
            print(f"autotune: the {result.error}", file=log)
    elif out.exists():
        result = TrialResult.read(out)
    else:
        tail = (trial_dir / "trial.log").read_text()[-1500:].strip().splitlines()
        why = f"trial process exited with code {code}: {tail[-1] if tail else 'no output'}"
        result = failed_result("error", "TrialProcessDied", why)
    result.trial_wall_s, result.launcher = wall, launcher
    return result


def start_shared(
    workload: dict[str, Any], pythonpath: str | None, thread_env: dict[str, str | None] | None
) -> SharedForkServer | None:
    """The shared fork server of a local search, already importing (None where
    AUTOTUNE_LAUNCHER=spawn asks for trials from scratch)."""
    if os.environ.get("AUTOTUNE_LAUNCHER", "fork") != "fork":
        return None
    return SharedForkServer(trial_env(pythonpath, thread_env), preload_for({"workload": workload}))
