"""The warm fork server: a process that has imported torch, torchvision, the trial
runner and the workload's module (and never touched CUDA), and forks one child
per trial. The child is a fresh process from the fork on: no cuDNN flag, compile
cache or allocator state of an earlier trial can reach it, because the server
never runs a trial itself; it only skips the imports every trial would repeat.

    python -m autotune.forkserver [MODULE ...]   # started by autotune.launcher

Protocol, one JSON object per line: the launcher writes {"dir", "env", "argv"};
the server answers {"pid": N} once the child runs, then {"pid": N, "status": S}
(the raw wait status) when it has ended. One trial at a time.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import sys

PRELOAD = ("torch", "torch.utils.data", "torch._dynamo", "torchvision", "autotune.trial")


def _child(request: dict) -> None:
    """In the forked child: own session (so a timeout kills its loader workers
    too), the trial dir, its log on stdout/stderr, its env; then the trial."""
    try:
        os.setsid()
        os.chdir(request["dir"])
        log = os.open("trial.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.update(request["env"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from autotune.trial import main

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


def _wait(pid: int) -> int | None:
    """Wait for the child; if the launcher goes away meanwhile (its end of our
    stdin closes), kill the child's process group and return None."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        readable, _, _ = select.select([sys.stdin], [], [], 0.2)
        # the launcher writes nothing while a trial runs: readable here means end of file
        if readable and not os.read(sys.stdin.fileno(), 1):  # EOF: the launcher's process is gone
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None


def serve(preload: list[str]) -> None:
    """Single-threaded on purpose: a fork copies only the forking thread."""
    for name in [*PRELOAD, *preload]:
        try:
            importlib.import_module(name)
        except Exception as e:  # the child will import it again and report the error as the trial's
            print(json.dumps({"preload_failed": name, "error": f"{type(e).__name__}: {e}"}), file=sys.stderr)
    out = sys.stdout
    print(json.dumps({"ready": os.getpid()}), file=out, flush=True)
    while True:
        line = sys.stdin.readline()
        if not line:  # the launcher's process is gone
            return
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), file=out, flush=True)
        status = _wait(pid)
        if status is None:
            return
        print(json.dumps({"pid": pid, "status": status}), file=out, flush=True)


if __name__ == "__main__":
    serve(sys.argv[1:])
