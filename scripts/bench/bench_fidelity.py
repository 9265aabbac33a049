"""Can a trial's numbers be trusted? Three checks, each on fresh processes:

1. repeatability: one config, N fresh trials -> coefficient of variation of throughput;
2. trial vs a plain hand-written PyTorch loop for the same config (interleaved
   with the trials, so drift hits both alike) -> ratio of medians;
3. profiler overhead: step time inside the profiled window vs the timed window.

Needs torch only. Prints a table; the last line is one JSON object.

    python scripts/bench/bench_fidelity.py --workload tiny_cnn --reps 5
    python scripts/bench/bench_fidelity.py --workload resnet18_cifar --set num_workers=8 --set pin_memory=true
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from autotune.trial.result import TrialResult  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def plain_loop(config: dict, steps: int) -> dict:
    """The same training job written by hand with plain PyTorch: no autotune code
    in the step, the knobs applied directly."""
    import torch
    from torch.utils.data import DataLoader

    from autotune.workload import load

    k = config["knobs"]
    if k.get("num_threads"):
        torch.set_num_threads(k["num_threads"])
    cuda = torch.cuda.is_available() and config.get("device", "auto") != "cpu"
    device = torch.device("cuda" if cuda else "cpu")
    wl = load(config["workload"].get("factory") or config["workload"]["name"], config["workload"].get("args"))
    batch_size = k.get("batch_size") or wl.batch_size
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = bool(k.get("cudnn_benchmark"))
    model = wl.model().to(device)
    if k.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
    optimizer = wl.build_optimizer(model.parameters())
    if k.get("compile", "none") != "none":
        model = torch.compile(model, mode=None if k["compile"] == "default" else k["compile"])
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(k.get("precision"))
    scaler = torch.amp.GradScaler("cuda") if k.get("precision") == "16-mixed" else None
    loader = DataLoader(
        wl.dataset,
        batch_size=batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=k.get("num_workers", 0),
        pin_memory=bool(k.get("pin_memory")),
        generator=torch.Generator().manual_seed(0),
    )
    pin = bool(k.get("pin_memory"))

    def step(images, labels):
        images = images.to(device, non_blocking=pin)
        labels = labels.to(device, non_blocking=pin)
        if wl.preprocess is not None:
            images, labels = wl.preprocess((images, labels))
        if k.get("channels_last"):
            images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = wl.loss(model, (images, labels))
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=k.get("set_to_none", True))

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    it = iter(loader)
    for _ in range(config.get("warmup_steps", 5)):
        step(*next(it)[:2])
    sync()
    t = time.perf_counter()
    for _ in range(steps):
        step(*next(it)[:2])
    sync()
    window = time.perf_counter() - t
    return {"samples_per_s": steps * batch_size / window, "steps": steps}


def run_child(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, timeout=1800)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout[proc.stdout.index("{") :])


def run_trial_child(config_path) -> TrialResult:
    """`python -m autotune.trial CONFIG` in a fresh process: its result, read by the one reader."""
    return TrialResult.from_dict(run_child(["-m", "autotune.trial", str(config_path)]))


def main() -> None:
    from autotune.trial.runner import parse_set

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="tiny_cnn")
    p.add_argument(
        "--args", default="{}", metavar="JSON", help="workload factory arguments, e.g. '{\"gpu_normalize\": true}'"
    )
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument(
        "--cpus",
        type=int,
        default=None,
        help="torch threads for the trial and the plain loop (the num_threads knob; default: torch's)",
    )
    p.add_argument("--mode", choices=["all", "repeat"], default="all", help="repeat: skip the plain-loop comparison")
    p.add_argument("--min-window-s", type=float, default=2.0)
    p.add_argument("--max-window-s", type=float, default=10.0)
    p.add_argument("--plain-child", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.plain_child:
        print(json.dumps(plain_loop(json.loads(Path(args.plain_child).read_text()), args.steps)))
        return

    knobs = {**parse_set(args.set), **({"num_threads": args.cpus} if args.cpus else {})}
    config = {
        "workload": {"name": args.workload, "args": json.loads(args.args)},
        "knobs": knobs,
        "warmup_steps": 5,
        "measure_steps": 30,
        "min_window_s": args.min_window_s,
        "max_window_s": args.max_window_s,
        "profile_steps": 5,
        "diagnose": False,
    }
    tmp = Path(tempfile.mkdtemp(prefix="fidelity"))
    (tmp / "trial.json").write_text(json.dumps(config))
    trials, plains = [], []
    print(f"{'rep':>3}  {'trial samples/s':>15}  {'steps':>6}  {'±CI95':>6}  {'profiler':>8}  {'plain samples/s':>15}")
    for rep in range(args.reps):
        # alternate which runs first, so a drift of the machine hits both alike
        plain = None
        if args.mode == "all" and rep % 2:
            plain = run_child(
                [__file__, "--plain-child", str(tmp / "trial.json"), "--steps", str(trials[-1]["window_steps"])]
            )
        r = run_trial_child(tmp / "trial.json")
        if r.status != "ok":
            raise SystemExit(f"trial failed: {r.error_type}: {r.error}")
        m = r.metrics
        trials.append(m)
        if args.mode == "all" and not rep % 2:
            plain = run_child([__file__, "--plain-child", str(tmp / "trial.json"), "--steps", str(m["window_steps"])])
        if plain:
            plains.append(plain["samples_per_s"])
        print(
            f"{rep:>3}  {m['samples_per_s']:>15.1f}  {m['window_steps']:>6}  {m['step_mean_ci95']:>6.1%}  "
            f"{m.get('profiler_overhead_frac', float('nan')):>8.1%}  {plain['samples_per_s'] if plain else float('nan'):>15.1f}"
        )
    tput = [m["samples_per_s"] for m in trials]
    cv = statistics.stdev(tput) / statistics.mean(tput) if len(tput) > 1 else None
    summary = {
        "device": r.device.name,
        "device_type": r.device.type,
        "workload": args.workload,
        "knobs": r.knobs,
        "reps": args.reps,
        "trial_samples_per_s_median": statistics.median(tput),
        "cv_throughput": cv,
        "plain_samples_per_s_median": statistics.median(plains) if plains else None,
        "trial_vs_plain_ratio": statistics.median(tput) / statistics.median(plains) if plains else None,
        "profiler_overhead": statistics.median(m.get("profiler_overhead_frac", 0.0) for m in trials),
    }
    target = 0.02 if summary["device_type"] == "cuda" else 0.05
    print(f"\nthroughput CV over {args.reps} fresh trials: {cv:.2%} (target <= {target:.0%})" if cv is not None else "")
    if plains:
        print(f"trial / plain loop: {summary['trial_vs_plain_ratio']:.3f} (target within 3%)")
    print(f"profiler overhead (profiled step time / timed step time - 1): {summary['profiler_overhead']:.1%}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
