"""The warm fork server: a process that has imported torch, torchvision, the trial
runner and the workload's module (and never touched CUDA), and forks one child
per trial. The child is a fresh process from the fork on: no cuDNN flag, compile
cache or allocator state of an earlier trial can reach it, because the server
never runs a trial itself; it only skips the imports every trial would repeat.

    python -m autotune.execution.forkserver [MODULE ...]                 # on its stdin/stdout
    python -m autotune.execution.forkserver --listen SOCKET [MODULE ...]  # for every process of a search

A user's Python program (`workload.command` is `python FILE ...` or `python -m
MODULE ...`) is forked the same way: the request's `program` ({"argv", "cwd"})
runs it in the child as the interpreter would (runpy, as `__main__`, sys.argv
and sys.path[0] set, the zero-code instrumentation installed as its
sitecustomize would, atexit handlers run at its end), so its trial does not pay
torch's import either.

Protocol, one JSON object per line: the launcher writes {"dir", "env", "argv"}
(or {"dir", "env", "program"});
the server answers {"pid": N} once the child runs, then {"pid": N, "status": S}
(the raw wait status) when it has ended. One trial at a time per stream; the
child's environment is exactly the request's `env`.

A program of several ranks (a torchrun-style program, `resources.ranks_per_trial`)
is one request with `ranks`, an environment per rank: a child is forked per rank,
all writing to one trial.log (as torchrun's ranks write to its output), each with
AUTOTUNE_TRIAL_PID set to this process, their parent (the ranks' CPU is the
trial's own, autotune.trial.disturbance), and its intra-op threads set from its
OMP_NUM_THREADS (torch read the server's at import); once one rank fails the
others are killed (they would wait in a collective). Answers: {"pids": [...]},
then {"pids", "statuses", "killed"} (the ranks killed because another failed).

With `--listen`, a local search's driver starts one server for the whole search
(autotune.execution.launcher.start_shared): it listens on a Unix socket in a private dir
(bound before the imports, so a connection made meanwhile waits in the backlog),
forks a handler per connection (each a warm copy that serves its stream as
above), and its stdin is only a lifeline: when the driver goes, the server and
its handlers go (a handler's running trial watches its parent and follows).
"""

from __future__ import annotations

import fcntl
import gc
import importlib
import json
import os
import select
import signal
import socket
import sys

PRELOAD = ("torch", "torch.utils.data", "torch._dynamo", "torchvision", "autotune.trial.runner")


def _std_fds(null: int, log: int) -> None:
    """fd 0 on `null`, fds 1 and 2 on `log`, wherever those two were opened: an
    open takes the lowest free descriptor, which may be 0, 1 or 2 itself (a
    handler of the shared server has none on 0), so both move above 2 first."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3) for fd in (null, log)]
    for fd in (null, log):
        os.close(fd)
    for target, fd in ((0, high[0]), (1, high[1]), (2, high[1])):
        os.dup2(fd, target)
    for fd in high:
        os.close(fd)


def _child(request: dict, rank: bool = False) -> None:
    """In the forked child: own session (so a timeout kills its loader workers
    too), the trial dir, its log on stdout/stderr (appended to, so the launcher's
    lines between its processes' stacks are never written over), the request's
    environment; then the trial. `rank`: one of several, appending to the log the
    server emptied, its threads from its OMP_NUM_THREADS (so too a child whose
    OMP_NUM_THREADS is not the server's: a launcher's, accelerate's)."""
    try:
        os.setsid()
        os.chdir(request["dir"])
        mode = os.O_APPEND | (0 if rank else os.O_TRUNC)
        _std_fds(os.open(os.devnull, os.O_RDONLY), os.open("trial.log", os.O_WRONLY | os.O_CREAT | mode, 0o644))
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        server_threads = os.environ.get("OMP_NUM_THREADS")
        os.environ.clear()
        os.environ.update(request["env"])
        threads = os.environ.get("OMP_NUM_THREADS", "")
        if (rank or threads != server_threads) and threads.isdigit() and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(threads))  # torch read the server's
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's SIG_IGN is not the trial's (`_drivers_signals`)
        if "program" in request:
            code = _program(**request["program"])
        else:
            from autotune.trial.runner import main

            code = main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _program(argv: list[str], cwd: str) -> int:
    """`python *argv` from `cwd`, in this (forked) process: its exit code."""
    import atexit
    import faulthandler
    import runpy

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # its stacks in trial.log where the launcher ends it
    os.chdir(cwd)
    if os.environ.get("AUTOTUNE_TRIAL"):  # what the instrumentation's sitecustomize does at a fresh start
        from autotune import instrument

        instrument.install()
    module = argv[1] if argv[0] == "-m" else None
    if module is None and not os.path.exists(argv[0]):
        print(
            f"{sys.executable}: can't open file {os.path.abspath(argv[0])!r}: No such file or directory",
            file=sys.stderr,
        )
        return 2
    sys.argv = [module or argv[0], *argv[2 if module else 1 :]]
    sys.path.insert(0, os.getcwd() if module else os.path.dirname(os.path.abspath(argv[0])))
    code = 0
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())  # the measured loop's hook writes the trial's error (autotune.trial.loop)
        code = 1
    atexit._run_exitfuncs()  # as the interpreter's exit would (a loop that ended early says so)
    return code


def _wait(pid: int, fd: int) -> int | None:
    """Wait for the child; if the launcher goes away meanwhile (its end of `fd`
    closes), kill the child's process group and return None."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        readable, _, _ = select.select([fd], [], [], 0.2)
        # the launcher writes nothing while a trial runs: readable here means end of file
        if readable and not os.read(fd, 1):  # EOF: the launcher's process is gone
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None


def _wait_ranks(pids: list[int], fd: int) -> tuple[list[int], list[int]] | None:
    """Wait for every rank; once one fails, kill the others' groups. (raw wait
    statuses, the ranks killed because another failed); None (all killed) if
    the launcher goes away meanwhile."""
    statuses: list[int | None] = [None] * len(pids)
    killed: list[int] = []
    while None in statuses:
        for r, pid in enumerate(pids):
            if statuses[r] is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    statuses[r] = status
        if not killed and any(s for s in statuses if s is not None):  # one failed: the rest would hang
            killed = [r for r, s in enumerate(statuses) if s is None]
            for r in killed:
                kill_group(pids[r])
        readable, _, _ = select.select([fd], [], [], 0.05)
        if readable and not os.read(fd, 1):  # EOF: the launcher's process is gone
            for r, pid in enumerate(pids):
                if statuses[r] is None:
                    kill_group(pid)
                    os.waitpid(pid, 0)
            return None
    return statuses, killed


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """`sig` to the process group `pid` leads (a trial's, a rank's), which may have ended already."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:  # it ended meanwhile
        pass


def _serve_stream(fd_in: int, out) -> None:
    """Serve one launcher's stream until it closes: a trial per request line."""
    from autotune.trial.disturbance import TRIAL_PID

    reader = os.fdopen(os.dup(fd_in), "r", buffering=1)

    def fork(request: dict, rank: bool = False) -> int:
        pid = os.fork()
        if pid == 0:  # the trial keeps none of the stream's descriptors
            reader.close()
            if fd_in > 2:
                os.close(fd_in)
            _child(request, rank)
        return pid

    while True:
        line = reader.readline()  # the launcher waits for the answer: never two requests in the buffer
        if not line:  # the launcher's process is gone
            return
        request = json.loads(line)
        if "ranks" in request:
            open(os.path.join(request["dir"], "trial.log"), "w").close()  # one log, the ranks append
            envs = request.pop("ranks")
            pids = [fork({**request, "env": {**env, TRIAL_PID: str(os.getpid())}}, rank=True) for env in envs]
            print(json.dumps({"pids": pids}), file=out, flush=True)
            waited = _wait_ranks(pids, fd_in)
            if waited is None:
                return
            print(json.dumps({"pids": pids, "statuses": waited[0], "killed": waited[1]}), file=out, flush=True)
            continue
        pid = fork(request)
        print(json.dumps({"pid": pid}), file=out, flush=True)
        status = _wait(pid, fd_in)
        if status is None:
            return
        print(json.dumps({"pid": pid, "status": status}), file=out, flush=True)


def _preload(modules: list[str]) -> None:
    for name in [*PRELOAD, *modules]:
        try:
            importlib.import_module(name)
        except Exception as e:  # the child will import it again and report the error as the trial's
            print(json.dumps({"preload_failed": name, "error": f"{type(e).__name__}: {e}"}), file=sys.stderr)
    # out of the collector's reach: a full collection in a forked trial would otherwise
    # write to every page the child shares with the server, one copy-on-write fault
    # each (a ~200-ms stall inside a 6-ms-step window; scripts/bench/bench_overhead.py)
    gc.freeze()


def _drivers_signals() -> None:
    """Ctrl-C and SIGTERM are the driver's to handle: a scheduler's or `timeout`'s SIGTERM, and a terminal's Ctrl-C,
    reach the driver's whole process group, a server in it. It died first, and the trial or pair in flight was
    recorded as failed, "the fork server exited", where the search was being stopped (a README walk). Its lifeline
    (stdin) ends it; its trials get both back (`_child`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def serve(preload: list[str]) -> None:
    """Single-threaded on purpose: a fork copies only the forking thread."""
    _drivers_signals()
    _preload(preload)
    print(json.dumps({"ready": os.getpid()}), file=sys.stdout, flush=True)
    _serve_stream(sys.stdin.fileno(), sys.stdout)


def listen(path: str, preload: list[str]) -> None:
    """Serve every connection to the Unix socket `path` until stdin closes."""
    _drivers_signals()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    _preload(preload)
    handlers: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([sys.stdin, server], [], [], 1.0)
            for pid in list(handlers):  # reap the handlers whose launcher has gone
                if os.waitpid(pid, os.WNOHANG)[0]:
                    handlers.discard(pid)
            if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):  # the driver has gone
                return
            if server in readable:
                conn, _ = server.accept()
                pid = os.fork()
                if pid == 0:  # the handler: a warm copy serving this connection alone
                    server.close()
                    null = os.open(os.devnull, os.O_RDONLY)  # on fd 0, not the lifeline (and never free)
                    os.dup2(null, 0)
                    os.close(null)
                    _serve_stream(conn.fileno(), conn.makefile("w", buffering=1))
                    os._exit(0)
                conn.close()
                handlers.add(pid)
    finally:
        for pid in handlers:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        server.close()
        os.unlink(path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--listen"]:
        listen(sys.argv[2], sys.argv[3:])
    else:
        serve(sys.argv[1:])
