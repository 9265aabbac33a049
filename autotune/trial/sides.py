"""The two sides of a step, measured apart (what a performance engineer does with
synthetic data): the compute ceiling on a batch already on the device (no
loader), and the loader's rate alone (no model). The bottleneck is then a
comparison of two measured rates."""

from __future__ import annotations

import time


def host_cpus_per_gpu(cpus: int) -> int:
    """The host's CPUs per GPU: what the loader workers of one GPU's trial may use
    (NVML counts every GPU of the host, even where CUDA_VISIBLE_DEVICES hides some)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        gpus = pynvml.nvmlDeviceGetCount()
    except Exception:  # no NVML: the GPUs this process sees
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return max(1, cpus // gpus) if gpus else cpus


def compute_ceiling(session, batch, min_steps: int = 10, min_s: float = 0.5, max_s: float = 5.0) -> dict[str, float]:
    """The compute side alone: training steps on one batch cached on the device
    (no loader, no host-to-device copy), synchronized at the window's ends only.
    The batch has the timed window's shape, so a compiled model is not compiled
    again. What the step would reach if the loader were infinitely fast."""
    from autotune import knobs as K
    from autotune.workload import count_samples

    cached = K.to_device(batch, session.device, non_blocking=False)
    samples = count_samples(session.workload, batch)
    session.step(cached)  # the copy and any lazy allocation, untimed
    session.sync()
    steps, t0 = 0, time.perf_counter()
    while steps < min_steps or time.perf_counter() - t0 < min_s:
        session.step(cached)
        steps += 1
        if time.perf_counter() - t0 >= max_s:
            break
    session.sync()
    elapsed = time.perf_counter() - t0
    return {
        "compute_ceiling_samples_per_s": steps * samples / elapsed,
        "compute_ceiling_step_ms": elapsed / steps * 1e3,
    }


def loader_rate(
    workload,
    batch_size: int,
    *,
    seed: int = 0,
    max_batch: int = 32,
    min_batches: int = 3,
    min_s: float = 0.5,
    max_s: float = 3.0,
    max_batches: int = 200,
) -> dict[str, float]:
    """The input side alone: one loader worker's rate, without a model. Batches
    are made in this process as a worker makes them (one torch thread: DataLoader
    workers run with one), at a batch of at most `max_batch` (per-sample work does
    not depend on the batch; a small one keeps the probe short), for `min_s` to
    `max_s` seconds or `max_batches` batches."""
    import torch

    from autotune import knobs as K

    batch = min(batch_size, max_batch)
    loader = K.seeded_loader(workload, {"batch_size": batch, "num_workers": 0}, max_batches + 1, seed + 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        batches = iter(loader)
        next(batches)  # lazy dataset set-up, untimed
        n, t0 = 0, time.perf_counter()
        for _ in batches:
            n += 1
            elapsed = time.perf_counter() - t0
            if (n >= min_batches and elapsed >= min_s) or elapsed >= max_s:
                break
        elapsed = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    per_worker = n * batch / elapsed
    return {"loader_samples_per_s_per_worker": per_worker, "loader_batches_per_s_per_worker": per_worker / batch_size}


def double_batch_probe(session, batch2x, ceiling_step_ms: float) -> dict[str, float]:
    """The compute side at twice the batch: steps on one cached batch of 2x the
    samples (`batch2x`, the workload's own loader at 2x), over the compute
    ceiling's step at the batch. Far below 2 means a fixed per-step cost
    (overhead) dominates; it reads no loader, so an input-bound trial's probe
    times its model, not its decoding. OOM says the batch is at the memory limit."""
    import torch

    from autotune.trial.memory import is_oom

    try:
        at2x = compute_ceiling(session, batch2x, min_steps=5, min_s=0.25)
        return {"batch2x_step_ratio": at2x["compute_ceiling_step_ms"] / ceiling_step_ms}
    except Exception as e:
        if not is_oom(e):
            raise
        return {"batch2x_oom": 1.0}
    finally:
        if session.device.type == "cuda":
            torch.cuda.empty_cache()


def two_sides(session, batch, device, seed: int = 0) -> dict[str, float]:
    """The compute ceiling, one loader worker's rate and the host's CPUs per GPU:
    a bottleneck as a comparison of two measured rates (autotune.trial.diagnose)."""
    out = compute_ceiling(session, batch)
    out.update(loader_rate(session.workload, session.knobs["batch_size"], seed=seed))
    out["host_cpus_per_gpu"] = float(host_cpus_per_gpu(device.cpus) if device.type == "cuda" else device.cpus)
    return out
