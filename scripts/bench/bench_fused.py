"""The fused-optimizer effect, side by side: ResNet-18 at 224 px (bf16, channels_last
by default) trained by each optimizer as built (torch's default, foreach kernels on a
GPU) and rebuilt with fused=True (the `fused_optimizer` knob), on the project's own
trial runner: a fresh `python -m autotune.trial` process per measurement, the two
interleaved per optimizer (unfused, fused; then fused, unfused; ...), several reps;
the effect is the median of the paired ratios. Loading is taken out of the
measurement: a pool of images already at size, shipped as uint8 and normalized on
the device.

    python scripts/bench/bench_fused.py [--optimizers sgd,adamw] [--batch-size 64] [--reps 3]

Needs torch only (no Ray, MLflow, Optuna or pydantic). Prints a table; the last line
is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

OPTIMIZERS = {  # torch.optim classes with a fused implementation, as a training job would set them up
    "sgd": ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}),
    "adam": ("Adam", {"lr": 1e-3}),
    "adamw": ("AdamW", {"lr": 1e-3, "weight_decay": 0.05}),
    "adagrad": ("Adagrad", {"lr": 1e-2}),
}
FACTORY = "scripts.bench.bench_fused:make_workload"  # the trial process imports this module (the repo root on its path)


class ImagePool:
    """`pool` uint8 images already at `size` px, cycled: indexing is all the loader does."""

    def __init__(self, size: int, pool: int = 256, length: int = 1_000_000):
        import torch

        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (pool, 3, size, size), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 10, (pool,), generator=g)
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return self.images[i % len(self.images)], self.labels[i % len(self.images)]


def make_workload(optimizer: str = "sgd", batch_size: int = 64, image_size: int = 224, model: str = "resnet18"):
    """ResNet-18 (or, for a smoke test, the tiny CNN), 10 classes, on pooled images
    normalized on the device, trained with `optimizer`."""
    import torch
    import torchvision

    from autotune.workload import Workload
    from trials.resnet18_cifar import loss, normalize_on_device
    from trials.tiny_cnn import tiny_cnn

    cls, kwargs = OPTIMIZERS[optimizer]
    build = {"resnet18": lambda: torchvision.models.resnet18(weights=None, num_classes=10), "tiny_cnn": tiny_cnn}[model]
    return Workload(
        model=build,
        dataset=ImagePool(image_size),
        loss=loss,
        batch_size=batch_size,
        optimizer=lambda params: getattr(torch.optim, cls)(params, **kwargs),
        preprocess=normalize_on_device,
    )


def measure(args, optimizer: str, fused: bool, cuda: bool, tmp: Path) -> dict:
    """One fresh trial process: the timed window only (no profile, no diagnosis)."""
    from bench_fidelity import run_trial_child

    knobs = {
        "batch_size": args.batch_size,
        "precision": args.precision,
        "channels_last": args.channels_last,
        "num_workers": args.workers,
        "pin_memory": cuda and args.workers > 0,
        "fused_optimizer": fused,
    }
    config = {
        "workload": {
            "factory": FACTORY,
            "args": {
                "optimizer": optimizer,
                "batch_size": args.batch_size,
                "image_size": args.image_size,
                "model": args.model,
            },
        },
        "knobs": knobs,
        "warmup_steps": args.warmup,
        "measure_steps": args.measure_steps,
        "min_window_s": args.min_window_s,
        "max_window_s": args.max_window_s,
        "profile_steps": 0,
        "diagnose": False,
    }
    path = tmp / f"{optimizer}-{fused}.json"
    path.write_text(json.dumps(config))
    r = run_trial_child(path)
    if r.status != "ok":
        raise SystemExit(f"bench_fused: {optimizer} fused={fused}: {r.status}: {r.error_type}: {r.error}")
    if r.optimizer_fused is not fused:  # what ran must be what was asked
        raise SystemExit(f"bench_fused: {optimizer} fused={fused} ran with optimizer_fused={r.optimizer_fused}")
    m = r.metrics
    return {
        "optimizer": r.optimizer,
        "fused": fused,
        "samples_per_s": m["samples_per_s"],
        "step_ms": m["step_ms_mean"],
        "step_time_cv": m["step_time_cv"],
        "data_wait_frac": m["data_wait_frac"],
        "device": r.device.name,
        "torch": r.torch,
    }


def effect(runs: list[dict]) -> dict:
    """Per optimizer: the medians, the paired ratios (fused / unfused, rep by rep) and the step time saved."""
    pairs = list(zip(*([r for r in runs if r["fused"] is x] for x in (False, True))))  # rep by rep
    ratios = [f["samples_per_s"] / u["samples_per_s"] for u, f in pairs]
    unfused = statistics.median(u["samples_per_s"] for u, _ in pairs)
    fused = statistics.median(f["samples_per_s"] for _, f in pairs)
    return {
        "unfused_samples_per_s": round(unfused, 2),
        "fused_samples_per_s": round(fused, 2),
        "speedup_x": round(statistics.median(ratios), 4),
        "speedup_low": round(min(ratios), 4),
        "speedup_high": round(max(ratios), 4),
        "saved_ms_per_step": round(statistics.median(u["step_ms"] - f["step_ms"] for u, f in pairs), 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--optimizers", default="sgd,adamw", help=f"comma-separated, of: {', '.join(OPTIMIZERS)}")
    p.add_argument("--model", choices=("resnet18", "tiny_cnn"), default="resnet18", help="tiny_cnn: a smoke test")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--precision", default="bf16-mixed", help="the precision knob (32-true, bf16-mixed, ...)")
    p.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    p.add_argument("--workers", type=int, default=None, help="loader workers (default: 4 with CUDA, else 0)")
    p.add_argument("--reps", type=int, default=3, help="measurements per optimizer and setting")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps")
    p.add_argument("--measure-steps", type=int, default=50)
    p.add_argument("--min-window-s", type=float, default=3.0)
    p.add_argument("--max-window-s", type=float, default=20.0)
    args = p.parse_args()
    optimizers = args.optimizers.split(",")
    unknown = [o for o in optimizers if o not in OPTIMIZERS]
    if unknown:
        p.error(f"--optimizers: {', '.join(unknown)} not allowed; torch fuses: {', '.join(OPTIMIZERS)}")
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_fidelity.run_child
    import torch

    cuda = torch.cuda.is_available()
    args.workers = (4 if cuda else 0) if args.workers is None else args.workers
    tmp = Path(tempfile.mkdtemp(prefix="bench_fused"))
    print(
        f"{args.model} at {args.image_size} px, batch {args.batch_size}, {args.precision}, "
        f"{'channels_last' if args.channels_last else 'contiguous'}, {args.workers} loader workers; "
        f"{args.reps} reps, a fresh process each, interleaved"
    )
    print(f"{'rep':>3}  {'optimizer':9} {'fused':5}  {'samples/s':>10}  {'step ms':>8}  {'cv':>6}  {'data wait':>9}")
    runs: dict[str, list[dict]] = {o: [] for o in optimizers}
    for rep in range(args.reps):
        for o in optimizers:
            for fused in (False, True) if rep % 2 == 0 else (True, False):
                r = measure(args, o, fused, cuda, tmp)
                runs[o].append({"rep": rep, **r})
                print(
                    f"{rep:>3}  {o:9} {str(fused):5}  {r['samples_per_s']:>10.1f}  {r['step_ms']:>8.2f}  "
                    f"{r['step_time_cv']:>6.1%}  {r['data_wait_frac']:>9.1%}",
                    flush=True,
                )
    effects = {o: effect(rs) for o, rs in runs.items()}
    print()
    print(f"{'optimizer':9}  {'unfused/s':>10}  {'fused/s':>10}  {'fused/unfused (pairs)':>24}  {'saved ms/step':>13}")
    for o, e in effects.items():
        print(
            f"{o:9}  {e['unfused_samples_per_s']:>10.1f}  {e['fused_samples_per_s']:>10.1f}  "
            f"{e['speedup_x']:>8.3f}x ({e['speedup_low']:.3f}-{e['speedup_high']:.3f})  {e['saved_ms_per_step']:>13.2f}"
        )
    first = runs[optimizers[0]][0]
    print(
        json.dumps(
            {
                "device": first["device"],
                "torch": first["torch"],
                "model": args.model,
                "image_size": args.image_size,
                "batch_size": args.batch_size,
                "precision": args.precision,
                "channels_last": args.channels_last,
                "workers": args.workers,
                "reps": args.reps,
                "effects": effects,
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
