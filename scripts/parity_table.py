"""Loss parity of each numerics-relevant knob against PyTorch defaults, on the
built-in workloads: identical weights, identical batches, N steps; the largest
per-step relative loss deviation. Needs torch only.

    python scripts/parity_table.py [--steps 20] [--workloads tiny_cnn,jpeg_pipeline]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune import knobs as K  # noqa: E402
from autotune import workload as W  # noqa: E402
from autotune.safety import loss_parity  # noqa: E402
from autotune.trial import detect_device  # noqa: E402

CHANGES = [("channels_last", True), ("set_to_none", False), ("cudnn_benchmark", True), ("precision", "tf32"),
           ("precision", "bf16-mixed"), ("precision", "16-mixed"), ("compile", "default")]
ARGS = {"resnet18_cifar": {"batch_size": 16, "image_size": 64}}  # small enough for a CPU


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--workloads", default="tiny_cnn,jpeg_pipeline,resnet18_cifar")
    p.add_argument("--skip-compile", action="store_true")
    args = p.parse_args()
    device = detect_device("auto")
    rows = []
    print(f"{'workload':16} {'knob':24} {'max dev':>9} {'mean dev':>9} {'floor':>9}  passed  note")
    for name in args.workloads.split(","):
        wl = W.load(name, ARGS.get(name))
        base = K.pytorch_defaults(wl.batch_size)
        for knob, value in CHANGES:
            why = K.KNOBS[knob].unavailable(value, device)
            if knob == "compile" and args.skip_compile:
                why = "skipped (--skip-compile)"
            if why and not (knob == "precision" and value == "16-mixed"):  # fp16 autocast also runs on a CPU
                print(f"{name:16} {knob + '=' + str(value):24} {'-':>9} {'-':>9} {'-':>9}  -       {why}")
                continue
            r = loss_parity(wl, base, {**base, knob: value}, device, steps=args.steps)
            rows.append({"workload": name, "knob": knob, "value": value, **r})
            print(f"{name:16} {knob + '=' + str(value):24} {r['max_rel_dev']:>9.2e} {r['mean_rel_dev']:>9.2e} "
                  f"{r['noise_floor']:>9.2e}  "
                  f"{str(r['passed']):6}  {r['reason'] or ''}")
    print(json.dumps({"device": device.name, "steps": args.steps, "rows": rows}))


if __name__ == "__main__":
    main()
