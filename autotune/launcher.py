"""Starting trial processes. Every trial is a fresh process in its own session,
in its trial dir (config.json, result.json, trial.log, trace.json), killed with
its whole process group (loader workers included) at the timeout; compile caches
are per trial (a warm cache from an earlier trial would hide compile time).

Two ways to start one:
- `fork` (default): a warm fork server (`autotune.forkserver`) that has imported
  torch, torchvision, the runner and the workload's module forks the trial, so a
  trial does not pay the imports again (measured in scripts/bench_overhead.py);
  the server never runs a trial, so nothing of one trial reaches the next;
- `spawn`: `python -m autotune.trial` from scratch (also what users run by hand).
Set AUTOTUNE_LAUNCHER=spawn to force the second.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


class ForkServer:
    """A running `python -m autotune.forkserver`, started with a search's env."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...]):
        self.proc = subprocess.Popen([sys.executable, "-m", "autotune.forkserver", *preload], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        ready = self._read(timeout=120)
        if not ready or "ready" not in ready:
            self.close()
            raise RuntimeError("the fork server did not start")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self, timeout: float | None) -> dict | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server exited")
        return json.loads(line)

    def run(self, trial_dir: Path, env: dict[str, str], timeout_s: float) -> int:
        """Fork a trial; wait for it, killing its process group at the timeout.
        Returns its exit code (negative: killed by that signal)."""
        self.proc.stdin.write(json.dumps({"dir": str(trial_dir), "env": env,
                                          "argv": ["config.json", "-o", "result.json"]}) + "\n")
        self.proc.stdin.flush()
        pid = self._read(timeout=60)["pid"]
        try:
            done = self._read(timeout=timeout_s)
            if done is None:
                os.killpg(pid, signal.SIGKILL)
                done = self._read(timeout=60)
        except BaseException:  # the caller was cancelled: take the process group along
            os.killpg(pid, signal.SIGKILL)
            raise
        return os.waitstatus_to_exitcode(done["status"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_servers: dict[tuple, ForkServer] = {}


def _server(env: dict[str, str], preload: tuple[str, ...]) -> ForkServer:
    """One server per (environment, preloaded modules) in this process, reused by its trials."""
    key = (tuple(sorted(env.items())), preload)
    server = _servers.get(key)
    if server is None or not server.alive():
        server = _servers[key] = ForkServer(env, preload)
    return server


def _spawn(trial_dir: Path, env: dict[str, str], timeout_s: float) -> int:
    with open(trial_dir / "trial.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "autotune.trial", "config.json", "-o", "result.json"],
                                cwd=trial_dir, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except BaseException:  # the caller was cancelled: take the process group along
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    return proc.returncode


def preload_for(config: dict[str, Any]) -> tuple[str, ...]:
    """The workload's module, for the fork server to import once."""
    from autotune.workload import BUILTINS

    wl = config.get("workload") or {}
    ref = BUILTINS.get(wl.get("name") or "", wl.get("factory") or "")
    return (ref.partition(":")[0],) if ":" in ref else ()


def run_in_process(config: dict[str, Any], trial_dir, timeout_s: float, pythonpath: str | None = None,
                   thread_env: dict[str, str | None] | None = None, launcher: str | None = None,
                   env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one trial in a fresh process (see the module doc); the result is its
    result.json, or what killed it, with `trial_wall_s` (what the trial cost,
    start-up included) and `launcher`. `env`: this trial's own variables (a
    rank's RANK, MASTER_ADDR...; the fork server stays the search's)."""
    launcher = launcher or os.environ.get("AUTOTUNE_LAUNCHER", "fork")
    if launcher not in LAUNCHERS:
        raise ValueError(f"AUTOTUNE_LAUNCHER={launcher!r}; allowed: {', '.join(LAUNCHERS)}")
    trial_dir = Path(trial_dir).resolve()
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    out = trial_dir / "result.json"
    own = env or {}
    env = trial_env(pythonpath, thread_env)
    caches = {"TORCHINDUCTOR_CACHE_DIR": str(trial_dir / "inductor-cache"), "TRITON_CACHE_DIR": str(trial_dir / "triton-cache"),
              **own}
    started = time.perf_counter()
    try:
        if launcher == "fork":
            try:
                server = _server(env, preload_for(config))
            except (OSError, RuntimeError):  # no server: start the trial from scratch
                launcher = "spawn"
        code = (server.run(trial_dir, caches, timeout_s) if launcher == "fork"
                else _spawn(trial_dir, {**env, **caches}, timeout_s))
    finally:
        for cache in ("inductor-cache", "triton-cache"):  # ~150 MB per compile trial
            shutil.rmtree(trial_dir / cache, ignore_errors=True)
    wall = time.perf_counter() - started
    if code == -signal.SIGKILL and not out.exists():
        result = {"status": "timeout", "error_type": "Timeout",
                  "error": f"trial ran past timeout_s={timeout_s:g} and was killed"}
    elif out.exists():
        result = json.loads(out.read_text())
    else:
        tail = (trial_dir / "trial.log").read_text()[-1500:].strip().splitlines()
        result = {"status": "error", "error_type": "TrialProcessDied",
                  "error": f"trial process exited with code {code}: {tail[-1] if tail else 'no output'}"}
    result["trial_wall_s"] = wall
    result["launcher"] = launcher
    return result
