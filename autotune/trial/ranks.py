"""Multi-rank trials: one trial of N ranks on this node, one result.

The trial process (forked by the launcher's warm server, or spawned) forks one
fresh child per rank before it builds anything, sets the environment torchrun
sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,
MASTER_PORT), and each child joins one process group (gloo on the CPU, nccl on
CUDA, one device each) with an explicit timeout, runs the single-rank runner on
its share of the data and writes rank<R>.json (in a temporary dir). Teardown is symmetric: each rank
leaves the group in its own `finally`, and when one rank fails or dies the
others are killed at once rather than left waiting in a collective.

Like torchrun, a rank runs one intra-op thread unless OMP_NUM_THREADS is set
(or the num_threads knob says otherwise).

What a multi-rank trial measures (`merge`): every rank runs the same number
of steps, agreed after warm-up (`window_steps`: enough for min_window_s at the
warm-up's pace; a window cut on time or confidence would end one rank's window
before another's); the window starts after a barrier and ends with a device sync
and a barrier on every rank (`Session.sync`), so it is the slowest rank's.
Throughput is the global samples/s (all ranks' samples over that window), the
step time the slowest rank's, plus each rank's own throughput, the exposed
communication share (the step's time above the same steps without gradient
synchronization) and peak memory (peak RSS per rank on the CPU, CUDA max
allocated on a GPU).

Needs torch only inside the rank processes; importable without it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import time
from datetime import timedelta
from typing import Any, Callable

from autotune.trial.disturbance import TRIAL_PID
from autotune.trial.result import RankResult, TrialResult, failed

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
RANK_FILE = "rank{}.json"
STATUS_ORDER = ("error", "timeout", "hung", "cut", "oom", "pruned", "ok")  # the worst rank's status is the trial's
# summed over ranks (a rate of the whole trial); the rest: the slowest rank's (max) or rank 0's
SUMMED = ("samples_per_s", "steps_per_s", "tokens_per_s")
SLOWEST = (
    "step_ms_mean",
    "step_ms_p50",
    "step_ms_p95",
    "step_ms_max",
    "window_s",
    "warmup_s",
    "first_step_s",
    "mem_inuse_peak_gib",
    "mem_inuse_step_gib",
    "comm_frac",
    "mem_rss_peak_gib",
    "mem_peak_allocated_gib",
    "mem_peak_reserved_gib",
    "data_wait_frac",
)


class ConfigError(ValueError):
    """A multi-rank trial that cannot run as asked (the runner's TrialConfigError)."""


def world_size() -> int:
    """The process group's size in this process (1: none)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def unavailable(ranks: int, device_type: str, cpus: int, backend: str | None = None) -> str | None:
    """Why `ranks` ranks cannot run on this host, or None (bad input: one line)."""
    import torch
    import torch.distributed as dist

    backend = backend or BACKENDS[device_type]
    if device_type == "cuda" and ranks > torch.cuda.device_count():
        return f"ranks={ranks}: more ranks than CUDA devices ({torch.cuda.device_count()}); one device per rank"
    if device_type == "cpu" and ranks > cpus:
        return f"ranks={ranks}: more ranks than CPUs ({cpus}) on this CPU host; at most {cpus}"
    if backend not in BACKENDS.values():
        return f"backend={backend!r}: allowed: {', '.join(sorted(set(BACKENDS.values())))}"
    if backend == "nccl" and device_type != "cuda":
        return "backend='nccl' needs CUDA devices and this trial runs on the CPU; use gloo (the default on the CPU)"
    if not dist.is_available() or not getattr(dist, f"is_{backend}_available")():
        return (
            f"backend={backend!r}: this torch build has no {backend} (available: "
            + ", ".join(
                b
                for b in sorted(set(BACKENDS.values()))
                if dist.is_available() and getattr(dist, f"is_{b}_available")()
            )
            + ")"
        )
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def torchrun_env(r: int, ranks: int, port: int) -> dict[str, str]:
    """What torchrun sets for rank `r` of `ranks` on one node."""
    return {
        "RANK": str(r),
        "LOCAL_RANK": str(r),
        "WORLD_SIZE": str(ranks),
        "LOCAL_WORLD_SIZE": str(ranks),
        "GROUP_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _rank_child(r: int, cfg: dict[str, Any], run_one: Callable[[dict], TrialResult], device_type: str, out: str) -> int:
    """In rank `r`'s forked process: `run_rank`, then write rank<r>.json."""
    result = run_rank(r, cfg, run_one, device_type)
    path = os.path.join(out, RANK_FILE.format(r))
    result.write(path + ".tmp")
    os.replace(path + ".tmp", path)
    return 0 if result.status in ("ok", "pruned") else 1  # failed: the others are stopped


def run_rank(r: int, cfg: dict[str, Any], run_one: Callable[[dict], TrialResult], device_type: str) -> TrialResult:
    """In rank `r`'s process (its torchrun environment set): join the group, run,
    leave the group. Never raises: the rank's result says what failed."""
    import torch
    import torch.distributed as dist

    try:
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", r)))
        if "OMP_NUM_THREADS" not in os.environ and int(os.environ.get("LOCAL_WORLD_SIZE", cfg["ranks"])) > 1:
            os.environ["OMP_NUM_THREADS"] = "1"  # as torchrun does with several processes per node
            torch.set_num_threads(1)  # torch has read the variable already (the num_threads knob still wins)
        dist.init_process_group(
            cfg.get("backend") or BACKENDS[device_type],
            rank=r,
            world_size=cfg["ranks"],
            timeout=timedelta(seconds=cfg["dist_timeout_s"]),
        )
        try:
            result = run_one(cfg)
            result.ended_unix = time.time()  # before leaving the group (which may fail the others)
        finally:
            dist.destroy_process_group()
    except BaseException as e:  # the group could not form (or broke): the rank's result says why
        import traceback

        traceback.print_exc()
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:500]
        result = failed("error", type(e).__name__, why, metrics={}, ended_unix=time.time())
    result.rank = r
    return result


def launched(ranks: int) -> bool:
    """Whether this process was started as one rank of `ranks` (torchrun's
    environment: `torchrun -m autotune.trial`, or a rank on another node,
    autotune.execution.spread), rather than as the trial that starts its ranks."""
    return "RANK" in os.environ and os.environ.get("WORLD_SIZE") == str(ranks)


def local_ranks(ranks: int) -> int:
    """The ranks of this trial on this node (one device or CPU each)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", ranks)) if launched(ranks) else ranks


def run_ranks(cfg: dict[str, Any], run_one: Callable[[dict], TrialResult], device_type: str) -> TrialResult:
    """Fork cfg["ranks"] ranks in the current dir, each running `run_one(cfg)` in
    the process group; wait for all, tear down symmetrically, merge their results."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ranks") as out:  # the ranks' results, read back here
        return _run_ranks(cfg, run_one, device_type, out)


def _run_ranks(cfg, run_one, device_type: str, out: str) -> TrialResult:
    ranks, port = cfg["ranks"], free_port()
    started = time.perf_counter()
    pids = {}
    for r in range(ranks):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ.update(torchrun_env(r, ranks, port))
                # the trial's own CPU: every rank's (autotune.trial.disturbance)
                os.environ[TRIAL_PID] = str(os.getppid())
                code = _rank_child(r, cfg, run_one, device_type, out)
            finally:
                os._exit(code)
        pids[pid] = r
    merged = collect(out, ranks, _wait_all(pids))
    merged.ranks_wall_s = time.perf_counter() - started
    return merged


def collect(out: str, ranks: int, died: dict[int, str]) -> TrialResult:
    """The trial's result from its ranks' rank<R>.json in `out` (a rank without one:
    `died`'s reason), merged (`merge`)."""
    results = []
    for r in range(ranks):
        path = os.path.join(out, RANK_FILE.format(r))
        if os.path.exists(path):
            results.append(TrialResult.read(path))
        else:
            why = died.get(r) or "the rank ended without a result"
            results.append(failed("error", "RankDied", why, rank=r, metrics={}))
    bad = next((x for x in results if x.error_type == "TrialConfigError"), None)
    if bad:  # bad input found in a rank (no repeated block): one line, as for a single-rank trial
        raise ConfigError(bad.error)
    return merge(results)


def _wait_all(pids: dict[int, int]) -> dict[int, str]:
    """Wait for every rank; once one fails, kill the rest (they would wait in a
    collective until the group's timeout). Returns rank -> why it ended badly."""
    died: dict[int, str] = {}
    alive = dict(pids)
    while alive:
        pid, status = os.wait()
        r = alive.pop(pid, None)
        if r is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            died[r] = f"rank {r} exited with code {code}" + (
                " (killed: another rank failed)" if code == -9 and died else ""
            )
            for other in alive:
                try:
                    os.kill(other, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    return died


def merge(results: list[TrialResult]) -> TrialResult:
    """One trial result from its ranks' results: the worst status, global
    throughput, the slowest rank's times, and a per-rank part (`ranks`)."""
    results = sorted(results, key=lambda x: x.rank or 0)
    # the worst status; of failed ranks, the first to fail (the others failed or were killed for it)
    worst = min(
        results,
        key=lambda x: (
            STATUS_ORDER.index(x.status) if x.status in STATUS_ORDER else 0,
            x.ended_unix if x.ended_unix is not None else float("inf"),
        ),
    )
    first = next((x for x in results if x.metrics), results[0])
    error = worst.error
    if worst is not first and worst.status != "ok":  # say which rank
        error = f"rank {worst.rank}: {worst.error or ''}"
    all_metrics = [x.metrics or {} for x in results]
    metrics = dict(first.metrics or {})
    complete = all(all(k in m for m in all_metrics) for k in ("samples_per_s", "window_s"))
    if complete:
        window = max(m["window_s"] for m in all_metrics)  # the slowest rank's (the barrier makes them equal)
        samples = sum(m["samples_per_s"] * m["window_s"] for m in all_metrics)
        metrics["samples_per_s"] = samples / window
        metrics["steps_per_s"] = min(m["steps_per_s"] for m in all_metrics)
        metrics["rank_samples_per_s_min"] = min(m["samples_per_s"] for m in all_metrics)
        metrics["rank_samples_per_s_max"] = max(m["samples_per_s"] for m in all_metrics)
        if all("tokens_per_s" in m for m in all_metrics):  # a language model's: global, as samples/s, and a device's
            metrics["tokens_per_s"] = sum(m["tokens_per_s"] * m["window_s"] for m in all_metrics) / window
            metrics["tokens_per_s_per_device"] = metrics["tokens_per_s"] / len(all_metrics)
    for key in SLOWEST:
        values = [m[key] for m in all_metrics if key in m]
        if values:
            metrics[key] = max(values)
    if all("mem_rss_peak_gib" in m for m in all_metrics):
        metrics["mem_rss_peak_total_gib"] = sum(m["mem_rss_peak_gib"] for m in all_metrics)
    metrics["ranks"] = len(results)
    kept = (*SUMMED, *SLOWEST, "loss_last", "window_steps")
    return dataclasses.replace(
        first,
        status=worst.status,
        error_type=worst.error_type,
        error=error,
        traceback=worst.traceback,
        metrics=metrics,
        rank=None,
        ended_unix=None,
        ranks=[
            RankResult(
                x.rank, x.status, x.host, {k: v for k, v in (x.metrics or {}).items() if k in kept}, x.error or None
            )
            for x in results
        ],
    )


def window_steps(step_s: float | None, cfg: dict[str, Any], cap: int, device_type: str) -> int:
    """The steps of a multi-rank window, the same on every rank: enough for
    `min_window_s` at the warm-up's step time (`step_s`; None: `measure_steps`),
    at least `measure_steps`, at most `cap` and `max_window_s`; every rank
    proposes its count and all take the largest (an all-reduce)."""
    import math

    import torch
    import torch.distributed as dist

    steps = cfg["measure_steps"]
    if step_s and step_s > 0:
        steps = max(steps, min(math.ceil(cfg["min_window_s"] / step_s), int(cfg["max_window_s"] / step_s), cap))
    count = torch.tensor([steps], device="cuda" if device_type == "cuda" else "cpu")
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def fixed_rule(steps: int):
    """A window of exactly `steps` steps on every rank: no stop on time, confidence
    or pruning, which would end one rank's window before another's, and no warm-up extended on one rank alone."""
    from autotune.trial.measure import WindowRule

    return WindowRule(min_steps=steps, min_s=0.0, target_ci=0.0, max_steps=steps, max_s=float("inf"), settle=False)


def comm_share(session, batches, steps: int, metrics: dict[str, float]) -> dict[str, float]:
    """The exposed communication share: the same steps again with every backward
    unsynchronized (DDP's no_sync; FSDP2 without its reduce-scatter, its
    all-gathers stay), side by side in the same ranks; the share is the synced
    step's time above the unsynced one's, as a fraction of the synced step."""
    from autotune.trial.measure import timed_window

    session.unsynced = True
    try:
        alone = timed_window(session, batches, fixed_rule(steps))
    finally:
        session.unsynced = False
    synced = metrics["step_ms_mean"]
    return {
        "step_ms_unsynced": alone["step_ms_mean"],
        "comm_frac": max(0.0, 1 - alone["step_ms_mean"] / synced) if synced else 0.0,
    }


def search_problem(
    device, workload, blocks: list[str] | None, lists: dict[str, list], baseline: dict[str, Any]
) -> str | None:
    """Why a search's multi-rank settings cannot run (bad input, before any trial):
    more ranks than a node's CPUs on a CPU host, or FSDP / checkpointing asked of
    a model with no repeated block. None when they can."""
    ranks = device.ranks
    if device.type == "cpu" and ranks > device.cpus:
        return (
            f"resources.ranks_per_trial: {ranks} ranks, but the largest node has {device.cpus} CPUs; on a CPU "
            f"host at most {device.cpus} (one process each)"
        )
    wants = [
        f"{name}={value!r}"
        for name, values in (("sharding", ("fsdp",)), ("activation_checkpointing", ("full", "selective")))
        for value in values
        if value in lists.get(name, ()) or baseline.get(name) == value
    ]
    if wants or blocks:
        from autotune.knobs import find_blocks

        if not find_blocks(workload.model(), blocks):
            named = (
                f"no module of class {', '.join(blocks)}"
                if blocks
                else "no module class with two or more instances holding parameters"
            )
            return (
                f"{' and '.join(wants) or 'resources.blocks'} needs the model's repeated blocks, and it has "
                f"{named}; name the block class in resources.blocks" + (", or leave those values out" if wants else "")
            )
    return None
