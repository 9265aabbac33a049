"""Loss parity of every numerics knob the device supports, and of planted faults,
on the classic case (ResNet-18, SGD lr 0.1, momentum 0.9; small images on a CPU)
and a small transformer with dict batches (AdamW). Per knob: the per-step errors of
the loss, gradient and update from identical state against their bands, the
multi-step loss deviation against its band, the verdict. The baseline's reference
is computed once per workload and reused by every row (as a search does), so its
time is reported apart. Needs torch only.

    python scripts/bench/parity_table.py [--steps 20] [--workloads resnet18_cifar,tiny_transformer]
    python scripts/bench/parity_table.py --workloads resnet18_cifar --image-size 224   # the GPU rows at full size
    python scripts/bench/parity_table.py --battery --seeds 0,1,2   # the false-alarm battery (torchvision models)
    python scripts/bench/parity_table.py --workloads resnet50_128 --knobs compile --no-planted   # some rows only

The battery: torchvision models with weights=None on random images (SGD lr 0.1,
momentum 0.9, as the classic case): ResNet-18 at 224 px, ResNet-50 at 128 px,
MobileNetV3-Small and EfficientNet-B0 at 64 px, ViT-B/16 at 32 px, plus
tiny_transformer (AdamW: fused AdamW's row). Each row: its worst error-to-band
ratio over the per-step checks and seeds ("margin": below 1 passes), its falls on
one fixed batch ("@lr x0.1": at that share of the optimizer's learning rate, where
the baseline's loss did not fall at its own), and the checks that failed it
("caught by": planted faults).

Rows marked "emulated" run fp16 autocast on a CPU, which the knob registry does not
offer (it needs CUDA); planted faults use it on a CPU for fp16 overflow. The last
line is JSON: rows, false_alarms, planted_total, planted_caught.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from autotune import knobs as K  # noqa: E402
from autotune.safety import parity as S  # noqa: E402
from autotune import workload as W  # noqa: E402
from autotune.trial.runner import detect_device  # noqa: E402

KNOB_CHANGES = [
    ("precision", "tf32"),
    ("precision", "bf16-mixed"),
    ("precision", "16-mixed"),
    ("channels_last", True),
    ("cudnn_benchmark", True),
    ("set_to_none", False),
    ("compile", "default"),
    ("fused_optimizer", True),
]
ARGS = {"resnet18_cifar": {"batch_size": 16, "image_size": 32}}  # the classic case, small enough for a CPU
# planted faults (tests/workloads.py), each must fail parity: (workload, knob, value, what)
PLANTED = [
    ("tests.workloads:make_fp16_overflow", "precision", "16-mixed", "fp16 overflow: activations ~1e6 > 65504"),
    (
        "tests.workloads:make_vanishing",
        "precision",
        "bf16-mixed",
        "does not train: loss = difference of two large terms",
    ),
    ("tests.workloads:make_naive_variance", "precision", "bf16-mixed", "numerics bug: variance as E[x^2] - E[x]^2"),
    (
        "tests.workloads:make_stale_cast",
        "precision",
        "bf16-mixed",
        "does not train beside a diverging baseline: a stale bf16 weight copy",
    ),
]
PLANTED_STEPS = {"tests.workloads:make_stale_cast": 20}  # its baseline diverges (is chaotic) only over 20 steps
# the battery: name -> (torchvision model, its keyword arguments, image size, batch)
BATTERY = {
    "resnet18_224": ("resnet18", {}, 224, 16),
    "resnet50_128": ("resnet50", {}, 128, 8),
    "mobilenet_v3": ("mobilenet_v3_small", {}, 64, 16),
    "efficientnet_b0": ("efficientnet_b0", {}, 64, 8),
    "vit_b_16_32": ("vit_b_16", {"image_size": 32}, 32, 8),
}


def _battery(name: str):
    """A torchvision classifier (weights=None) on the classic case's random images."""
    import torch
    import torchvision

    from trials import resnet18_cifar as R

    arch, kwargs, size, batch = BATTERY[name]
    wl = R.make_workload(batch_size=batch, image_size=size)
    wl.model = lambda: getattr(torchvision.models, arch)(weights=None, num_classes=10, **kwargs)
    wl.optimizer = lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4)
    return wl


def _row(name: str, knob: str, value, r: dict, note: str = "") -> dict:
    ps = r["per_step"]
    return {
        "workload": name,
        "knob": knob,
        "value": value,
        "passed": r["passed"],
        "reason": r["reason"],
        "note": note,
        **{f"{m}_err": ps[m]["max"] for m in S.STEP_METRICS},
        **{f"{m}_band": ps[m]["band"] for m in S.STEP_METRICS},
        "grad_cos_min": ps["grad"]["cos_min"],
        "multi_loss_dev": r["max_rel_dev"],
        "multi_loss_band": r["multi_step"]["loss_dev"]["band"],
        "multi_judged": r["multi_step"]["loss_dev"]["judged"],
        "margin": max(ps[m]["max"] / ps[m]["band"] for m in S.STEP_METRICS),
        "moved": r["moved"]["candidate"],
        "moved_baseline": r["moved"]["baseline"],
        "fall": r["overfit"]["candidate"],
        "fall_baseline": r["overfit"]["baseline"],
        "fall_judged": r["overfit"]["judged"],
        "fall_lr_scale": r["overfit"]["lr_scale"],
        "fall_tried": r["overfit"]["tried"],  # every learning rate asked (parity._does_it_train)
        "caught_by": r["failed"],
        "skipped_steps": r["skipped_steps"],
        "parity_s": r["parity_s"],
    }


def _finite(obj):
    """Strict JSON: inf and NaN as strings."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _print(row: dict) -> None:
    cells = " ".join(f"{row[m + '_err']:>8.1e}/{row[m + '_band']:<8.1e}" for m in S.STEP_METRICS)
    verdict = "pass" if row["passed"] else "FAIL"
    band = f"{row['multi_loss_band']:.1e}" if row["multi_judged"] else "chaotic"  # noise alone above tolerance
    note = row["note"]
    if row["passed"] and len(row["fall_tried"]) > 1:  # it trained at a lower learning rate than it was first asked at
        asked = ", ".join(
            f"{t['candidate']:.1%}/{t['baseline']:.1%} at lr x{t['lr_scale']:g}" for t in row["fall_tried"][:-1]
        )
        note = f"{note}{'; ' if note else ''}first asked: {asked}"
    print(
        f"{row['workload'].split(':')[-1]:22} {row['knob'] + '=' + str(row['value']):24} {cells} "
        f"{row['multi_loss_dev']:>8.1e}/{band:<8} {row['margin']:6.2f} {row['fall']:>6.1%}/{row['fall_baseline']:<6.1%}"
        f"{'@lr x' + format(row['fall_lr_scale'], 'g') if row['fall_lr_scale'] != 1 else '':9} "
        f"{verdict:5} {row['parity_s']:6.1f}  "
        f"{note}{'; ' if note and row['reason'] else ''}{row['reason'] or ''}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="multi-step length (safety.parity_steps)")
    p.add_argument("--workloads", default="resnet18_cifar,tiny_transformer")
    p.add_argument("--skip-compile", action="store_true")
    p.add_argument("--cpu-fp16", action="store_true", help="on a CPU, also run the knob rows with fp16 (emulated)")
    p.add_argument(
        "--image-size",
        type=int,
        default=ARGS["resnet18_cifar"]["image_size"],
        help="resnet18_cifar's image size (224: the classic case as trained on a GPU)",
    )
    p.add_argument(
        "--batch-size", type=int, default=ARGS["resnet18_cifar"]["batch_size"], help="resnet18_cifar's batch"
    )
    p.add_argument("--battery", action="store_true", help="add the torchvision battery (BATTERY) to --workloads")
    p.add_argument("--seeds", default="0", help="comma-separated seeds: each row runs at every one")
    p.add_argument("--no-planted", action="store_true", help="skip the planted faults")
    p.add_argument("--knobs", help="comma-separated knob names: only their rows (default: every knob of KNOB_CHANGES)")
    args = p.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    only = set(args.knobs.split(",")) if args.knobs else {knob for knob, _ in KNOB_CHANGES}
    if only - {knob for knob, _ in KNOB_CHANGES}:
        p.error(f"--knobs {args.knobs}: allowed: {', '.join(dict.fromkeys(k for k, _ in KNOB_CHANGES))}")
    wl_args = {**ARGS, "resnet18_cifar": {"batch_size": args.batch_size, "image_size": args.image_size}}
    device = detect_device("auto")
    rows, references = [], {}
    print(
        f"{'workload':22} {'knob':24} "
        + " ".join(f"{m + ' err/band':17}" for m in S.STEP_METRICS)
        + f" {'multi loss/band':17} {'margin':>6} {'fall/base':22} {'verdict':5} {'time_s':>6}  note"
    )
    names = args.workloads.split(",") + (list(BATTERY) if args.battery else [])
    for name, seed in ((n, s) for n in names for s in seeds):
        wl = _battery(name) if name in BATTERY else W.load(name, wl_args.get(name))
        base = K.pytorch_defaults(wl.batch_size)
        levels = S.device_levels(base, device)
        if device.type == "cpu" and args.cpu_fp16:
            levels = sorted({*levels, S.roundoff(base, {"precision": "16-mixed"}, "cpu")})
        t = time.perf_counter()
        ref = S.build_reference(wl, base, device.type, steps=args.steps, seed=seed, levels=levels)
        references[f"{name} seed {seed}"] = time.perf_counter() - t
        print(f"{name} seed {seed}: baseline reference (once per search) {time.perf_counter() - t:.1f} s")
        trains = dataclasses.replace(device, optimizer=K.optimizer_of(wl))  # decides fused_optimizer
        for knob, value in [(k, v) for k, v in KNOB_CHANGES if k in only]:
            why = K.KNOBS[knob].unavailable(value, trains)
            emulated = why and (knob, value) == ("precision", "16-mixed") and args.cpu_fp16
            if knob == "compile" and args.skip_compile:
                why = "skipped (--skip-compile)"
            if why and not emulated:
                print(f"{name:22} {knob + '=' + str(value):24} -  {why}")
                continue
            r = S.loss_parity(wl, base, {**base, knob: value}, device, steps=args.steps, seed=seed, reference=ref)
            rows.append({**_row(name, knob, value, r, "emulated on the CPU" if emulated else ""), "seed": seed})
            _print(rows[-1])
    planted = []
    for ref_name, knob, value, what in [] if args.no_planted else PLANTED:
        wl = W.load(ref_name)
        base = K.pytorch_defaults(wl.batch_size)
        r = S.loss_parity(
            wl, base, {**base, knob: value}, device, steps=max(args.steps, PLANTED_STEPS.get(ref_name, 0)), seed=0
        )
        note = what + ("; emulated on the CPU" if K.KNOBS[knob].unavailable(value, device) else "")
        row = _row(ref_name, knob, value, r, note)
        planted.append({**row, "note": f"{note}; caught by: {', '.join(r['failed']) or 'nothing'}", "planted": True})
        _print(planted[-1])
    false_alarms = [f"{r['workload']} {r['knob']}={r['value']} seed {r['seed']}" for r in rows if not r["passed"]]
    if rows:
        print(f"worst margin (error / band, per step) over the knob rows: {max(r['margin'] for r in rows):.2f}")
    caught = sum(not r["passed"] for r in planted)
    print(
        f"false alarms: {len(false_alarms)} of {len(rows)} knob rows; planted faults caught: {caught} of {len(planted)}"
    )
    print(
        json.dumps(
            _finite(
                {
                    "device": device.name,
                    "steps": args.steps,
                    "workload_args": wl_args,
                    "reference_s": references,
                    "rows": rows + planted,
                    "false_alarms": len(false_alarms),
                    "false_alarm_rows": false_alarms,
                    "planted_total": len(planted),
                    "planted_caught": caught,
                }
            )
        )
    )


if __name__ == "__main__":
    main()
