"""The classic hand-tuned case (DESIGN.md): ResNet-18 on CIFAR-sized images resized
to 224, batch 32, at PyTorch defaults vs 8 loader workers + pinned memory; GPU
utilization, throughput and the diagnosis of each. Needs torch and a CUDA GPU
(on a CPU it says so and prints a JSON line with "skipped").

    python scripts/classic_case.py [--workers 8]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fidelity import run_child  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=8)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("classic case skipped: no CUDA device")
        print(json.dumps({"skipped": "no CUDA device"}))
        return
    cases = {"defaults": {}, f"{args.workers} workers + pinned": {"num_workers": args.workers, "pin_memory": True}}
    rows = {}
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="classic"))
    print(f"{'config':24} {'samples/s':>10} {'step ms':>8} {'GPU busy':>9} {'NVML util':>9} {'loader':>7}  bottleneck")
    for name, knobs in cases.items():
        config = {"workload": {"name": "resnet18_cifar", "args": {"batch_size": 32}}, "knobs": knobs,
                  "warmup_steps": 10, "measure_steps": 50, "min_window_s": 3.0, "max_window_s": 20.0,
                  "trace_path": str(tmp / f"trace-{len(rows)}.json")}
        (tmp / "c.json").write_text(json.dumps(config))
        r = run_child(["-m", "autotune.trial", str(tmp / "c.json")])
        if r["status"] != "ok":
            raise SystemExit(f"{name}: {r['error_type']}: {r['error']}")
        m, d = r["metrics"], r["diagnosis"]
        rows[name] = {"samples_per_s": m["samples_per_s"], "step_ms": m["step_ms_mean"], "gpu_util": m.get("gpu_util_frac"),
                      "gpu_util_nvml_pct": m.get("gpu_util_nvml_pct"), "dataloader_frac": m.get("dataloader_frac"),
                      "bottleneck": d["bottleneck"], "evidence": d["evidence"], "recommendations": d["recommendations"]}
        nvml = m.get("gpu_util_nvml_pct")
        print(f"{name:24} {m['samples_per_s']:>10.1f} {m['step_ms_mean']:>8.1f} {m.get('gpu_util_frac', 0):>9.1%} "
              f"{'-' if nvml is None else f'{nvml:.0f}%':>9} {m.get('dataloader_frac', 0):>7.1%}  {d['bottleneck']}")
    base, tuned = rows.values()
    print(f"speedup: {tuned['samples_per_s'] / base['samples_per_s']:.2f}x")
    print(json.dumps({"device": r["device"]["name"], "cases": rows,
                      "speedup": tuned["samples_per_s"] / base["samples_per_s"]}))


if __name__ == "__main__":
    main()
