"""One trial: build the workload, apply the knobs, warm up, time a window, report.

Needs torch only (no Ray, MLflow, Optuna or pydantic), so a trial runs anywhere:

    python -m autotune.trial CONFIG.json [-o RESULT.json] [--set knob=value ...]

CONFIG is a JSON object: {"workload": {"name": "tiny_cnn", "args": {}},
"knobs": {...}, "warmup_steps": 5, "measure_steps": 30, "device": "auto",
"cpus": null, "seed": 0}. Knobs left out take PyTorch's defaults. The result is
one JSON object: status ("ok", "oom" or "error"), the knobs, the device, and
metrics whose names carry their units.

Measurement rules (DESIGN.md): warm-up steps (worker start, compile, cuDNN
autotuning, allocator growth) are never timed; the window is timed with the
device synchronized at its two ends only; per-step times come from CUDA events
(device side, no sync) or, on the CPU, from the host clock.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from autotune import knobs as K
from autotune import workload as W

DEFAULTS = {"warmup_steps": 5, "measure_steps": 30, "min_window_s": 1.0, "device": "auto", "cpus": None, "seed": 0}
MAX_STEPS_FACTOR = 50  # the window stops at measure_steps * this, however short


class TrialConfigError(ValueError):
    """A trial config that cannot run; the message names the field."""


def check_config(config: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and check a trial config (the runner needs no pydantic)."""
    unknown = set(config) - set(DEFAULTS) - {"workload", "knobs"}
    if unknown:
        raise TrialConfigError(f"unknown trial config keys {sorted(unknown)}; allowed: workload, knobs, {', '.join(DEFAULTS)}")
    wl = config.get("workload")
    if not isinstance(wl, dict) or not (wl.get("name") or wl.get("factory")):
        raise TrialConfigError("`workload` must be an object with `name` (built-in) or `factory` (pkg.module:fn), and optional `args`")
    cfg = {**DEFAULTS, **config}
    given = dict(config.get("knobs") or {})
    for name, value in given.items():
        knob = K.KNOBS.get(name)
        if knob is None:
            raise TrialConfigError(f"unknown knob `{name}`; knobs are: {', '.join(K.KNOBS)}")
        if type(value) is not knob.type or (knob.choices and value not in knob.choices):
            allowed = " | ".join(knob.choices) if knob.choices else knob.type.__name__
            raise TrialConfigError(f"knobs.{name}: {value!r} is not allowed; expected {allowed}")
    cfg["knobs"] = {**K.pytorch_defaults(None), **given}
    for key in ("warmup_steps", "measure_steps"):
        if not isinstance(cfg[key], int) or cfg[key] < (0 if key == "warmup_steps" else 2):
            raise TrialConfigError(f"`{key}` must be an int >= {0 if key == 'warmup_steps' else 2}, got {cfg[key]!r}")
    return cfg


def detect_device(requested: str = "auto", cpus: int | None = None) -> K.Device:
    import torch

    cpus = cpus or len(os.sched_getaffinity(0))
    use_cuda = torch.cuda.is_available() if requested == "auto" else requested == "cuda"
    if use_cuda:
        if not torch.cuda.is_available():
            raise TrialConfigError("device `cuda` requested but torch sees no CUDA device")
        return K.Device("cuda", cpus, torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    return K.Device("cpu", cpus, "cpu")


@dataclass
class Session:
    """A training job with the knobs applied; `step` is one optimizer step."""

    workload: W.Workload
    knobs: dict[str, Any]
    device: Any  # torch.device
    model: Any
    optimizer: Any
    loader: Any
    scaler: Any

    def step(self, batch):
        k = self.knobs
        batch = K.to_device(batch, self.device, non_blocking=k["pin_memory"])
        if self.workload.preprocess is not None:
            batch = self.workload.preprocess(batch)
        if k["channels_last"]:
            batch = K.to_channels_last(batch)
        with K.autocast(k, self.device.type):
            loss = self.workload.loss(self.model, batch)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=k["set_to_none"])
        return loss


def prepare(workload: W.Workload, knobs: dict[str, Any], device: K.Device, steps: int, seed: int = 0) -> Session:
    """Apply the knobs in order: backend flags, model (device, memory format,
    compile), optimizer, loader. The loader samples exactly `steps` full batches
    in a seeded random order, so every trial sees the same data."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    torch.manual_seed(seed)
    K.apply_backend_flags(knobs)
    dev = torch.device(device.type)
    model = K.prepare_model(workload.model(), knobs, dev)
    optimizer = workload.build_optimizer(model.parameters())
    sampler = RandomSampler(
        workload.dataset, num_samples=steps * knobs["batch_size"], generator=torch.Generator().manual_seed(seed)
    )
    loader = DataLoader(
        workload.dataset, sampler=sampler, drop_last=True, collate_fn=workload.collate_fn, **K.loader_kwargs(knobs)
    )
    return Session(workload, knobs, dev, model, optimizer, loader, K.grad_scaler(knobs, device.type))


class _GpuUtilSampler:
    """Samples NVML GPU utilization (what nvidia-smi shows) in a thread."""

    def __init__(self, enabled: bool, period_s: float = 0.05):
        import torch

        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = None
        try:
            if not enabled:
                return
            torch.cuda.utilization()  # needs nvidia-ml-py
        except Exception:
            return
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)

    def _run(self, period_s):
        import torch

        while not self._stop.wait(period_s):
            self.samples.append(torch.cuda.utilization())

    def __enter__(self):
        if self._thread:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join()

    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None


def _percentile(sorted_values: list[float], q: float) -> float:
    i = (len(sorted_values) - 1) * q
    lo, hi = math.floor(i), math.ceil(i)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (i - lo)


def measure(session: Session, warmup_steps: int, measure_steps: int, min_window_s: float = 0.0) -> dict[str, float]:
    """Warm up (untimed), then time at least `measure_steps` steps and at least
    `min_window_s` seconds between two device syncs. The host clock decides when
    to stop (no sync); the window is what the synchronized ends measure."""
    import torch

    cuda = session.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    clock = time.perf_counter

    t = clock()
    batches = iter(session.loader)  # starts the loader workers: part of warm-up
    for _ in range(warmup_steps):
        session.step(next(batches))
    sync()
    warmup_s = clock() - t

    if cuda:
        torch.cuda.reset_peak_memory_stats()
        events = []
    host_starts, data_wait, samples = [], 0.0, 0
    max_steps = measure_steps * MAX_STEPS_FACTOR
    with _GpuUtilSampler(enabled=cuda) as util:
        sync()
        t0 = clock()
        while len(host_starts) < max_steps and (len(host_starts) < measure_steps or clock() - t0 < min_window_s):
            host_starts.append(clock())
            batch = next(batches)
            data_wait += clock() - host_starts[-1]
            samples += W.count_samples(session.workload, batch)
            if cuda:
                events.append(torch.cuda.Event(enable_timing=True))
                events[-1].record()
            loss = session.step(batch)
        if cuda:
            events.append(torch.cuda.Event(enable_timing=True))
            events[-1].record()
        sync()
        window = clock() - t0
    del batches  # shuts the loader workers down
    steps = len(host_starts)

    if cuda:
        steps_ms = [events[i].elapsed_time(events[i + 1]) for i in range(steps)]
    else:
        ends = host_starts[1:] + [t0 + window]
        steps_ms = [(e - s) * 1e3 for s, e in zip(host_starts, ends)]
    ordered = sorted(steps_ms)
    mean_ms = sum(steps_ms) / len(steps_ms)
    std_ms = math.sqrt(sum((x - mean_ms) ** 2 for x in steps_ms) / (len(steps_ms) - 1))
    metrics = {
        "samples_per_s": samples / window,
        "steps_per_s": steps / window,
        "step_ms_mean": window / steps * 1e3,
        "step_ms_p50": _percentile(ordered, 0.5),
        "step_ms_p95": _percentile(ordered, 0.95),
        "step_time_cv": std_ms / mean_ms,
        "data_wait_frac": data_wait / window,
        "warmup_s": warmup_s,
        "window_s": window,
        "window_steps": steps,
        "loss_last": float(loss.detach().float()),
    }
    if cuda:
        metrics["mem_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        metrics["mem_peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
        if util.mean() is not None:
            metrics["gpu_util_pct"] = util.mean()
    return metrics


def _is_oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def run_trial(config: dict[str, Any]) -> dict[str, Any]:
    """Run one trial; never raises for a failing workload: the result says what failed."""
    started = time.perf_counter()
    cfg = check_config(config)
    import torch

    if cfg["cpus"]:
        torch.set_num_threads(int(cfg["cpus"]))  # the trial's CPU reservation
    device = detect_device(cfg["device"], cfg["cpus"])
    wl = cfg["workload"]
    result: dict[str, Any] = {
        "status": "ok",
        "knobs": dict(cfg["knobs"]),
        "device": {"type": device.type, "name": device.name, "cpus": device.cpus, "torch_threads": torch.get_num_threads()},
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "metrics": {},
    }
    try:
        workload = W.load(wl.get("factory") or wl["name"], wl.get("args"))
        knobs = dict(cfg["knobs"])
        if knobs["batch_size"] is None:
            knobs["batch_size"] = workload.batch_size
        result["knobs"] = knobs
        for name, value in knobs.items():
            why = K.KNOBS[name].unavailable(value, device)
            if why:
                raise TrialConfigError(f"knobs.{name}={value!r} cannot apply on {device.type}: {why}")
        steps = cfg["warmup_steps"] + cfg["measure_steps"] * MAX_STEPS_FACTOR
        session = prepare(workload, knobs, device, steps, cfg["seed"])
        result["metrics"] = measure(session, cfg["warmup_steps"], cfg["measure_steps"], cfg["min_window_s"])
        if not math.isfinite(result["metrics"]["loss_last"]):
            result.update(status="error", error_type="NonFiniteLoss", error="the loss is NaN or inf")
    except Exception as e:  # a failing workload is a result, not a crash
        result.update(
            status="oom" if _is_oom(e) else "error",
            error_type=type(e).__name__,
            error=str(e).strip().splitlines()[0][:500] if str(e).strip() else type(e).__name__,
            traceback=traceback.format_exc()[-4000:],
        )
    result["trial_s"] = time.perf_counter() - started
    return result


def _parse_set(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep:
            raise TrialConfigError(f"--set expects knob=value, got `{item}`")
        try:
            out[name] = json.loads(raw)
        except json.JSONDecodeError:
            out[name] = raw
    return out


def _exit_with_parent() -> None:
    """Under a search, die with the Ray worker that started us (and take the
    loader workers along), so a cancelled trial leaves no process behind."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os.killpg(0, 9)

    threading.Thread(target=watch, daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autotune.trial", description="Run one measured training trial.")
    p.add_argument("config", help="trial config JSON file ('-' for stdin)")
    p.add_argument("-o", "--out", help="write the result JSON here (default: stdout)")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", help="override a knob")
    args = p.parse_args(argv)
    if os.environ.get("AUTOTUNE_WATCH_PARENT") == "1":
        _exit_with_parent()
    try:
        text = sys.stdin.read() if args.config == "-" else open(args.config).read()
        config = json.loads(text)
        config["knobs"] = {**config.get("knobs", {}), **_parse_set(args.set)}
        result = run_trial(config)
    except (OSError, json.JSONDecodeError, TrialConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
