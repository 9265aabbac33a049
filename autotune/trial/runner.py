"""One trial: build the workload, apply the knobs, warm up, time a window, report.

Needs torch only (no Ray, MLflow, Optuna or pydantic), so a trial runs anywhere:

    python -m autotune.trial CONFIG.json [-o RESULT.json] [--set knob=value ...]

CONFIG is a JSON object: {"workload": {"name": "tiny_cnn", "args": {}},
"knobs": {...}, "warmup_steps": 5, "measure_steps": 10, "device": "auto",
"seed": 0}. Knobs left out take PyTorch's defaults. The result is a
`TrialResult` (autotune.trial.result), built from the trial's first line and
written as one JSON object: status ("ok", "oom" or "error"), the knobs, the
device, and metrics whose names carry their units.

Measurement rules (docs/design.md): warm-up steps (worker start, compile, cuDNN
autotuning, allocator growth) are never timed; the window is timed with the
device synchronized at its two ends only; per-step times come from CUDA events
(device side, no sync) or, on the CPU, from the host clock.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import json
import math
import os
import signal
import socket
import tempfile
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune import knobs as K
from autotune.trial import compiled
from autotune.trial import measure as M
from autotune.trial import memory
from autotune.trial import ranks as R
from autotune.trial import sides
from autotune.trial import trace
from autotune import workload as W
from autotune.trial.diagnose import diagnose
from autotune.trial.disturbance import verdict
from autotune.trial.request import (  # noqa: F401  (DEFAULTS and window_rule: the runner's contract)
    DEFAULTS,
    TrialConfigError,
    check_config,
    max_steps,
    parse_set,
    window_rule,
)
from autotune.safety.rank_parity import rank_parity
from autotune.trial import tokens
from autotune.trial.result import DeviceInfo, TrialResult, unit_of
from autotune.safety.levels import needs_parity, trial_parity


def detect_device(requested: str = "auto") -> K.Device:
    """The device, and the host's CPUs (what num_workers and num_threads may use)."""
    import torch

    cpus = len(os.sched_getaffinity(0))
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
    accum_steps: int = 1  # micro-batches per optimizer step
    micro_step: int = 0
    world_size: int = 1  # ranks in the trial's process group
    unsynced: bool = False  # every backward without gradient synchronization (ranks.comm_share)
    memory_cap: Any = None  # a forced memory limit's sampler (memory.cap), checked after every backward
    scheduler: Any = None  # the workload's LR scheduler, stepped after every optimizer step

    def sync(self) -> None:
        """Wait for the device (a no-op on the CPU, where work is synchronous),
        then, with ranks, for every rank (so a window starts and ends together)."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
        if self.world_size > 1:
            torch.distributed.barrier()

    def device_batch(self, batch):
        """A loader batch as the model sees it: on the device (non_blocking when
        pinned), preprocessed, 4-D inputs in channels_last when that knob is on."""
        batch = K.to_device(batch, self.device, non_blocking=self.knobs["pin_memory"])
        if self.workload.preprocess is not None:
            batch = self.workload.preprocess(batch)
        return K.to_channels_last(batch) if self.knobs["channels_last"] else batch

    def step(self, batch):
        k = self.knobs
        batch = self.device_batch(batch)
        with K.autocast(k, self.device.type):
            loss = self.workload.loss(self.model, batch)
        scaled = loss / self.accum_steps if self.accum_steps > 1 else loss
        micro = self.unsynced or (self.micro_step + 1) % self.accum_steps != 0  # no all-reduce on a micro-step
        with K.no_sync(self.model, self.world_size > 1 and micro):
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        self.micro_step += 1
        if self.memory_cap is not None:
            self.memory_cap.check()
        if self.micro_step % self.accum_steps:
            return loss  # accumulating: the optimizer steps once per accum_steps micro-batches
        if self.workload.clip is not None:  # on unscaled gradients (a fused optimizer unscales inside its step)
            if self.scaler is not None and not getattr(self.optimizer, "_step_supports_amp_scaling", False):
                self.scaler.unscale_(self.optimizer)
            self.workload.clip(self.model, self.optimizer, k["precision"])
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=k["set_to_none"])
        return loss


def prepare(
    workload: W.Workload,
    knobs: dict[str, Any],
    device: K.Device,
    steps: int,
    *,
    seed: int = 0,
    accum_steps: int = 1,
    blocks: list[str] | None = None,
) -> Session:
    """Apply the knobs stage by stage: process (threads), backend flags, model
    (checkpointing, device, memory format, compile, then DDP/FSDP with ranks:
    `K.wrap`), optimizer, loader. The loader samples exactly `steps` full batches
    in a seeded random order, so every trial sees the same data (each rank its own)."""
    import torch

    torch.manual_seed(seed)  # the same initial weights on every rank
    K.apply_process_flags(knobs)
    K.apply_backend_flags(knobs)
    dev = torch.device(device.type)
    world = R.world_size()
    model = K.wrap(workload.model(), knobs, dev, world, blocks)
    optimizer = K.build_optimizer(workload, model, knobs)
    loader = K.seeded_loader(workload, knobs, steps, seed + R.rank())
    scheduler = workload.scheduler(optimizer) if workload.scheduler is not None else None
    return Session(
        workload,
        knobs,
        dev,
        model,
        optimizer,
        loader,
        K.grad_scaler(knobs, device.type),
        accum_steps,
        world_size=world,
        scheduler=scheduler,
    )


def _measure(workload, knobs, device, cfg, result: TrialResult, started: float) -> None:
    """Warm up (untimed), the timed window, the profiled window, then the two
    sides apart (sides.two_sides), FLOPs and the 2x-batch probe (the compute
    side at twice the batch: sides.double_batch_probe); each adds to
    `result` as soon as it has its numbers. A compiled model is compiled once:
    the profiled window, the two sides and FLOPs (on the uncompiled module) run
    on it at the timed window's shape; the 2x-batch probe (a new shape, compiled
    again) is skipped; `compile_s` is torch's own account of its compile (the timed window's, measure.Window).
    Loss parity (safety.loss_parity) builds its own sessions from the seeded
    initial weights, so it compiles its candidate again. A
    window clearly slower than `prune_below` ends early and the trial stops
    there (status "pruned": its throughput is measured, the rest skipped).
    On the CPU, a memory window after the timed one samples the allocator's peak."""
    rule = window_rule(cfg, knobs["batch_size"], device.type)
    if device.ranks > 1:  # every rank runs the same steps (a collective waits for all), sized after warm-up
        rule = R.fixed_rule(max_steps(cfg))
    steps = (
        max(cfg["warmup_steps"], M.queue_batches(knobs["num_workers"], knobs["prefetch_factor"]))
        + rule.max_steps * (1 + (device.ranks > 1))
        + cfg["profile_steps"]
        + 3
        + memory.MEMORY_STEPS
    )
    phase = M.phase_clock(result, started)  # where the trial's seconds go: setup (workload, session), warm-up, ...
    session = prepare(
        workload, knobs, device, steps, seed=cfg["seed"], accum_steps=cfg["accum_steps"], blocks=cfg["blocks"]
    )
    session.memory_cap = memory.cap(cfg["memory_limit_gib"])  # samples the allocator from here on
    try:
        _Measurement(session, rule, workload, knobs, device, cfg, result, started, phase).run()
    finally:
        if session.memory_cap is not None:
            session.memory_cap.stop()


@dataclass
class _Measurement:
    """One trial's measurement in progress: the session it steps, the window rule, and the result it fills in
    (`phase` marks where its seconds go)."""

    session: Any
    rule: M.WindowRule
    workload: Any
    knobs: dict[str, Any]
    device: K.Device
    cfg: dict[str, Any]
    result: TrialResult
    started: float
    phase: Any

    def run(self) -> None:
        import torch

        session, result = self.session, self.result
        result.optimizer = type(session.optimizer).__name__
        result.optimizer_fused = all(bool(g.get("fused")) for g in session.optimizer.param_groups)
        result.has_batchnorm = any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in session.model.modules()
        )
        batches = iter(session.loader)  # starts the loader workers: part of warm-up
        self.window(batches, *self.warm_up(batches))
        if self.rule.pruned:
            result.status = "pruned"
            return
        self.after_window(batches)

    def warm_up(self, batches) -> tuple[float, float, int, float | None, float | None]:
        """The untimed steps: `warmup_steps` (on one CPU rank without compile, `warmup_min_s` may end them
        sooner), and never fewer than the loader's queue (`measure.loader_queue`: a window that starts on the
        batches its workers made ahead over-reads its loader). Returns when they began, their seconds, their count, the time to the first step and its end."""
        session, cfg, device, knobs = self.session, self.cfg, self.device, self.knobs
        t = time.perf_counter()
        first_step_s = first_step_done = None
        warmed, warm_tokens = 0, 0
        short = (
            cfg["warmup_min_s"] is not None
            and device.type == "cpu"
            and knobs["compile"] == "none"
            and device.ranks == 1
        )
        queue = M.loader_queue(session.loader)  # the batches its workers made ahead: the window starts past them
        while warmed < max(cfg["warmup_steps"], queue):
            batch = next(batches)
            counted = W.count_tokens(self.workload, batch)  # a language model's: the rule's thresholds are in tokens
            warm_tokens = None if counted is None or warm_tokens is None else warm_tokens + counted[0]
            session.step(batch)
            warmed += 1
            if warmed == 1:  # time to first step: imports, model, compile, loader start
                session.sync()
                first_step_s = time.perf_counter() - self.started
                first_step_done = time.perf_counter()
            elif short and warmed >= queue and time.perf_counter() - t >= cfg["warmup_min_s"]:  # warm by time
                break  # (request.WARMUP_MIN_S)
        session.sync()
        warmup_s = time.perf_counter() - t
        if device.ranks > 1:  # min_window_s at the warm-up's step time (its first step, which builds, left out)
            step_s = (time.perf_counter() - first_step_done) / (warmed - 1) if warmed > 1 else None
            self.rule = R.fixed_rule(R.window_steps(step_s, cfg, self.rule.max_steps, device.type))
        elif warm_tokens is not None and (per_step := self.tokens_per_step(warm_tokens, warmed)):
            self.rule = window_rule(cfg, per_step, device.type)  # a language model: its thresholds are tokens/s
        self.phase("setup", t)
        self.phase("warmup")
        return t, warmup_s, warmed, first_step_s, first_step_done

    def tokens_per_step(self, tokens, steps: int) -> float | None:
        """A language model's tokens a step (the unit of the search's thresholds, result.unit_of), from the
        warm-up's; without a warm-up step, from a batch of its own (None: not a language model)."""
        if not steps:
            batch = next(iter(K.seeded_loader(self.workload, {"batch_size": self.knobs["batch_size"]}, 1, seed=1)))
            counted = W.count_tokens(self.workload, batch)
            if counted is None:
                return None
            tokens, steps = counted[0], 1
        return float(tokens) / steps

    def window(self, batches, t, warmup_s, warmed, first_step_s, first_step_done) -> None:
        """The timed window, and what the warm-up told: the time to the first step, a compiled model's compile."""
        cfg, result = self.cfg, self.result
        metrics = result.metrics = {
            **M.timed_window(self.session, batches, self.rule),
            "warmup_s": warmup_s,  # the warm-up's steps; any that went on into the window: warmup_extended_*
            "warmup_steps_run": warmed,
        }
        self.phase("window")
        unit = unit_of(metrics)
        if cfg["predicted"]:
            metrics[unit.key("predicted")] = cfg["predicted"]  # the rate model's, in the search's unit
        metrics.update(tokens.flop_metrics(self.session.model, metrics, self.device.name, self.knobs["precision"]))
        result.disturbed = verdict(metrics, self.device.type) or None  # load from outside the trial during its window
        if first_step_s is not None:
            metrics["first_step_s"] = first_step_s

    def after_window(self, batches) -> None:
        """After the window: the memory window (CPU), the ranks' communication share, then for an incumbent: the
        profiled window, the two sides, FLOPs, the 2x-batch probe and the diagnosis, and loss parity."""
        session, knobs, device, cfg, result = self.session, self.knobs, self.device, self.cfg, self.result
        metrics = result.metrics
        if device.type == "cpu":  # the allocator's peak, sampled in a window of its own (autotune.trial.memory)
            metrics.update(memory.memory_window(session, batches))
        if device.ranks > 1:  # profile, two sides and parity of a multi-rank trial: not yet (issue 24)
            metrics.update(R.comm_share(session, batches, self.rule.max_steps, metrics))
            if cfg["diagnose"]:  # from the timed windows (communication-bound)
                result.diagnosis = diagnose(metrics, knobs, device)
            return
        if _not_incumbent(cfg, metrics, self.rule, result):
            return
        carry = cfg["carry"] if cfg["diagnose"] else None  # the compute side measured already (Strategy.carry_for)
        if cfg["profile_steps"] and not carry:
            with tempfile.TemporaryDirectory() as tmp:
                profile = M.profile_window(
                    session, batches, cfg["profile_steps"], cfg["trace_path"] or f"{tmp}/trace.json"
                )
            result.profile = profile
            metrics.update(trace.profile_metrics(profile, metrics["step_ms_mean"]))
            self.phase("profile")
        batch = next(batches)
        del batches  # shuts the loader workers down
        if carry:
            metrics.update({**carry["metrics"], "apart_from_trial": carry["trial"]})
        elif cfg["diagnose"]:
            metrics.update(
                sides.two_sides(session, batch, device, cfg["seed"])
            )  # compute on a cached batch; the loader alone
            self.phase("two_sides")
        if cfg["diagnose"]:
            self.diagnose(batch, carry)
        parity = cfg["parity"]
        if parity and needs_parity(knobs, parity["baseline"]):
            result.parity = trial_parity(self.workload, cfg["workload"], parity, knobs, device, cfg["seed"])
            metrics["parity_max_rel_dev"] = result.parity["max_rel_dev"]
            metrics["parity_skipped_steps"] = result.parity["skipped_steps"]
            metrics["parity_s"] = result.parity["parity_s"]
            if result.parity.get("reference_s"):  # built here: paid once per search
                metrics["parity_reference_s"] = result.parity["reference_s"]
            self.phase("parity")

    def diagnose(self, batch, carry) -> None:
        """FLOPs per sample, the compute side at twice the batch (not compiled: a new shape compiles again), and
        the diagnosis: advice for what the model eats."""
        session, knobs, device, cfg, result = self.session, self.knobs, self.device, self.cfg, self.result
        metrics = result.metrics
        flops = M.flops_per_sample(
            session,
            batch,
            W.count_samples(self.workload, batch),
            cfg["flops_cache"],
            {
                "workload": cfg["workload"],
                "device": device.type,
                "blocks": cfg["blocks"],
                **{k: knobs[k] for k in ("batch_size", "activation_checkpointing")},
            },
        )
        counted = trace.flop_metrics(flops, metrics["samples_per_s"], device.name, knobs["precision"])
        if "flops_per_token" in metrics:  # a language model's achieved TFLOP/s and MFU are its tokens' (window())
            counted = {"flops_per_sample": counted["flops_per_sample"]}
        metrics.update(counted)
        self.phase("flops")
        if knobs["compile"] == "none" and not carry:
            batch2x = next(iter(K.seeded_loader(self.workload, {"batch_size": 2 * knobs["batch_size"]}, 1, seed=1)))
            metrics.update(sides.double_batch_probe(session, batch2x, metrics["compute_ceiling_step_ms"]))
        result.diagnosis = diagnose(metrics, knobs, device, W.batch_kind(batch))
        self.phase("probe")


def _not_incumbent(cfg, metrics: dict, rule: M.WindowRule, result: TrialResult) -> bool:
    """With `incumbent_above`: a window at or below it cannot make this config
    the incumbent, so the trial pays for nothing more (no profile, diagnosis or
    loss parity; `result.skipped` says so); nor can a tied window above it of
    a config riskier than the incumbent (`tie_keeps_incumbent`: metric `tie_kept`)
    whose mean lies inside the incumbent's interval above it (`rule.screen_ci`).
    A mean beyond leads by more than the incumbent is known: adopted as any tie
    above the bar, as it may open moves the incumbent cannot (a quickstart: bf16
    at batch 32 read +13.5% against +-9.8%, the tie kept the baseline, bf16 at
    batch 64, 1.6x, was never tried, the baseline was exported). A screened,
    promoted or tied window is marked."""
    for mark in ("screened", "promoted", "tied"):
        if getattr(rule, mark):
            metrics[mark] = 1.0
    unit = unit_of(metrics)
    above, value = cfg["incumbent_above"], metrics[unit.metric]
    kept = (
        above is not None and above < value <= above * (1 + rule.screen_ci) and rule.tied and cfg["tie_keeps_incumbent"]
    )
    if above is None or value > above and not kept:
        return False
    if kept:  # and the trial the tie went to, where known (autotune.decide.checked reopens it should that one fall)
        metrics.update(
            tie_kept=1.0,
            **({} if cfg.get("incumbent_trial") is None else {"tie_kept_incumbent": float(cfg["incumbent_trial"])}),
        )
    result.skipped = f"profile, diagnosis and loss parity: {value:.4g} {unit.label} " + (
        f"ties with the incumbent (its {above:.4g} with min_improvement), the safer config, which stays"
        if kept
        else f"does not beat the {above:.4g} that would make it the incumbent"
    )
    return True


def _parity_check(workload, knobs, device, cfg, result, started) -> None:
    """`parity_only`: the config's loss parity against the baseline, no window
    (a late check of a config the search is about to export); with ranks, on every rank."""
    if device.ranks > 1:  # against the baseline's math at the global batch (autotune.safety.rank_parity)
        result.parity = rank_parity(
            workload, cfg["workload"], cfg["parity"], knobs, device, seed=cfg["seed"], blocks=cfg["blocks"]
        )
    else:
        result.parity = trial_parity(workload, cfg["workload"], cfg["parity"], knobs, device, cfg["seed"])
    result.metrics = {
        "parity_max_rel_dev": result.parity["max_rel_dev"],
        "parity_s": result.parity.get("parity_s", time.perf_counter() - started),
    }


def run_trial(config: dict[str, Any], base_dir: str = ".") -> TrialResult:
    """Run one trial; never raises for a failing workload: the result says what failed.
    `base_dir`: where a pickled factory's relative `file` starts (the config's dir)."""
    started = time.perf_counter()
    cfg = check_config(config)
    if cfg["workload"].get("command"):
        raise TrialConfigError(
            "workload.command: a program's trial is the program itself, run by autotune's launcher "
            "(`autotune search SPEC`); this runner runs factories (`name`, `factory` or `file`)"
        )
    import torch

    device = detect_device(cfg["device"])
    if cfg["ranks"] > 1:
        why = R.unavailable(R.local_ranks(cfg["ranks"]), device.type, device.cpus, cfg["backend"])
        if why:
            raise TrialConfigError(why)
        if R.world_size() == 1:  # the trial's process: run its ranks, one result (or, launched as one rank, its own)
            result = (
                R.run_rank(int(os.environ["RANK"]), cfg, lambda c: run_trial(c, base_dir), device.type)
                if R.launched(cfg["ranks"])
                else R.run_ranks(cfg, lambda c: run_trial(c, base_dir), device.type)
            )
            result.trial_s = time.perf_counter() - started
            return result
        device = dataclasses.replace(device, ranks=R.world_size())  # a rank: decides the DDP/FSDP knobs
    wl = cfg["workload"]
    result = TrialResult(
        status="ok",
        knobs=dict(cfg["knobs"]),
        metrics={},
        device=DeviceInfo(device.type, device.name, device.cpus),
        host=socket.gethostname(),
        torch=str(torch.__version__),  # a str, not torch's TorchVersion (which YAML cannot write)
    )
    try:
        workload = W.load(W.trial_source(wl, base_dir), wl.get("args"))
        knobs = dict(cfg["knobs"])
        if knobs["batch_size"] is None:
            knobs["batch_size"] = workload.batch_size
        result.knobs = knobs
        if knobs["batch_size"] > len(workload.dataset):
            raise TrialConfigError(
                f"knobs.batch_size={knobs['batch_size']} is larger than the dataset "
                f"({len(workload.dataset)} samples): a batch would repeat samples"
            )
        device = dataclasses.replace(device, optimizer=K.optimizer_of(workload))  # decides fused_optimizer
        for name, value in knobs.items():
            why = K.KNOBS[name].unavailable(value, device)
            if why:
                raise TrialConfigError(f"knobs.{name}={value!r} cannot apply on {device.type}: {why}")
        (_parity_check if cfg["parity_only"] else _measure)(workload, knobs, device, cfg, result, started)
        result.device.torch_threads = torch.get_num_threads()  # in effect during the window
        if not math.isfinite(result.metric("loss_last") or 0.0):
            result.status, result.error_type, result.error = "error", "NonFiniteLoss", "the loss is NaN or inf"
    except K.BlockError as e:  # the model lacks what the knobs need: bad input
        raise TrialConfigError(str(e)) from e
    except Exception as e:  # a failing workload is a result, not a crash
        traceback.print_exc()  # in trial.log too, beside the workload's own output
        if memory.is_oom(e):  # infeasible: record the memory at the failure with the knobs
            result.metrics = {**(result.metrics or {}), **memory.at_failure(e, device)}
        result.status = "oom" if memory.is_oom(e) else "error"
        result.error_type = type(e).__name__
        result.error = str(e).strip().splitlines()[0][:500] if str(e).strip() else type(e).__name__
        result.traceback = traceback.format_exc()[-4000:]
    result.trial_s = time.perf_counter() - started
    return result


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
    # a trial past its timeout gets SIGUSR1 first (autotune.execution.launcher): its stacks go to its log
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        text = sys.stdin.read() if args.config == "-" else open(args.config).read()
        config = json.loads(text)
        config["knobs"] = {**config.get("knobs", {}), **parse_set(args.set)}
        result = run_trial(config, os.path.dirname(os.path.abspath(args.config)) if args.config != "-" else ".")
    except (OSError, json.JSONDecodeError, R.ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.out:
        if result.status == "ok" and (result.metrics or {}).get("compile_s"):  # for production (trial.compiled)
            compiled.save(Path(args.out).resolve().parent, result.device.name)
        result.write(args.out)  # the contract (autotune.trial.result), checked
    else:
        print(json.dumps(result.checked(), indent=2))
    return 0 if result.status in ("ok", "pruned") else 1


if __name__ == "__main__":
    sys.exit(main())
