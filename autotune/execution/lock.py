"""One local search per device at a time: two searches timing trials on the same
cores or GPU measure each other (two quickstarts 20 s apart on 2 cores: baselines
4107 and 3768 samples/s, winners 1.30x and 1.59x, and neither knew). A search on
this host holds an exclusive lock on its device for its whole run; a second one
says whose it is and waits."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator


def lock_path(device_type: str) -> Path:
    """One lock per device of this host: the CPUs, or the GPUs this process sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "-") or "none"
    name = "cpu" if device_type == "cpu" else f"cuda-{visible}"
    return Path(tempfile.gettempdir()) / f"autotune-{name}.lock"


@contextlib.contextmanager
def device_lock(device_type: str, run_dir: Path, on_wait: Callable[[str], None] | None = None) -> Iterator[float]:
    """Hold the device's lock while the block runs; yields the seconds spent waiting."""
    path = lock_path(device_type)
    with open(path, "a+") as f:
        waited = 0.0
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "{}"
            try:
                who = json.loads(holder)
                who = f"pid {who.get('pid')}, {who.get('run_dir')}"
            except json.JSONDecodeError:
                who = "unknown"
            if on_wait:
                on_wait(
                    f"another autotune search is measuring on this {device_type} ({who}); waiting for it to "
                    "finish, so neither times its trials while the other runs (Ctrl-C to stop)"
                )
            t = time.monotonic()
            fcntl.flock(f, fcntl.LOCK_EX)
            waited = time.monotonic() - t
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "run_dir": str(run_dir)}))
        f.flush()
        try:
            yield waited
        finally:
            f.seek(0)
            f.truncate()
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)
