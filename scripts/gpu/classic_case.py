"""The classic hand-tuned case (docs/design.md): ResNet-18 on CIFAR-sized images resized
to 224, batch 32. One run measures, on the project's own trial runner: PyTorch
defaults (the user's host pipeline, and with uint8 shipped and normalized on the
GPU), the first hand step (8 loader workers + pinned memory), the hand-tuned end
state (8 workers, pinned, batch 1024, 16-mixed, compile default, gpu_normalize),
and, with --found, the config a search found (its best_config.yaml), beside the
defaults and the end state alone: throughput,
GPU utilization, the diagnosis, and each as a multiple of the defaults. Needs
torch and a CUDA GPU (on a CPU it says so and prints a JSON line with "skipped").

    python scripts/gpu/classic_case.py [--workers 8] [--found RUN_DIR/best_config.yaml]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_fidelity import run_trial_child  # noqa: E402

HOST = {"batch_size": 32}  # the user's pipeline: resize + normalize in the loader
GPU_NORMALIZE = {"batch_size": 32, "gpu_normalize": True}  # uint8 to the GPU, normalized there


def cases(workers: int, found: Path | None) -> dict[str, tuple[dict, dict]]:
    """name -> (workload args, knobs). With `found`: the defaults, the hand-tuned end state and
    the found config alone (the steps between are the plain run's; a short GPU loan has no time)."""
    out = {
        "defaults": (HOST, {}),
        "defaults, gpu_normalize": (GPU_NORMALIZE, {}),
        f"{workers} workers + pinned": (HOST, {"num_workers": workers, "pin_memory": True}),
        "hand-tuned end state": (
            GPU_NORMALIZE,
            {"num_workers": 8, "pin_memory": True, "batch_size": 1024, "precision": "16-mixed", "compile": "default"},
        ),
    }
    if found:
        del out["defaults, gpu_normalize"], out[f"{workers} workers + pinned"]
        from autotune import load_config

        best = load_config(found)  # as production reads it: the searched workload args too
        if best.file["workload"]["ref"] != "resnet18_cifar":
            raise SystemExit(f"{found}: a search of `{best.file['workload']['ref']}`, not resnet18_cifar")
        out["found by autotune"] = (best.trial_workload_args, best.knobs)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--found", type=Path, help="a search's best_config.yaml (resnet18_cifar)")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("classic case skipped: no CUDA device")
        print(json.dumps({"skipped": "no CUDA device"}))
        return
    rows = {}
    tmp = Path(tempfile.mkdtemp(prefix="classic"))
    print(
        f"{'config':26} {'samples/s':>10} {'x defaults':>10} {'step ms':>8} {'GPU busy':>9} {'NVML util':>9} "
        f"{'data wait':>9} {'compile s':>9}  bottleneck"
    )
    for name, (wl_args, knobs) in cases(args.workers, args.found).items():
        # as a search runs it: torch's default threads unless the case sets num_threads
        config = {
            "workload": {"name": "resnet18_cifar", "args": wl_args},
            "knobs": knobs,
            "warmup_steps": 10,
            "measure_steps": 50,
            "min_window_s": 3.0,
            "max_window_s": 20.0,
            "trace_path": str(tmp / f"trace-{len(rows)}.json"),
        }
        (tmp / "c.json").write_text(json.dumps(config))
        r = run_trial_child(tmp / "c.json")
        if r.status != "ok":
            print(f"{name:26} {r.status}: {r.error_type}: {r.error}")
            rows[name] = {"status": r.status, "error": r.error}
            continue
        m, d = r.metrics, r.diagnosis or {}
        rows[name] = {
            "knobs": r.knobs,
            "workload_args": wl_args,
            "samples_per_s": m["samples_per_s"],
            "step_ms": m["step_ms_mean"],
            "gpu_util": m.get("gpu_util_frac"),
            "gpu_util_nvml_pct": m.get("gpu_util_nvml_pct"),
            "data_wait_frac": m.get("data_wait_frac"),
            "dataloader_frac": m.get("dataloader_frac"),
            "compile_s": m.get("compile_s"),
            "compute_ceiling_samples_per_s": m.get("compute_ceiling_samples_per_s"),
            "loader_samples_per_s_per_worker": m.get("loader_samples_per_s_per_worker"),
            "bottleneck": d.get("bottleneck"),
            "evidence": d.get("evidence"),
            "recommendations": d.get("recommendations"),
        }
        base = rows["defaults"].get("samples_per_s")
        rows[name]["x_defaults"] = m["samples_per_s"] / base if base else None
        nvml, comp = m.get("gpu_util_nvml_pct"), m.get("compile_s")
        print(
            f"{name:26} {m['samples_per_s']:>10.1f} {rows[name]['x_defaults'] or 0:>9.2f}x {m['step_ms_mean']:>8.1f} "
            f"{m.get('gpu_util_frac', 0):>9.1%} {'-' if nvml is None else f'{nvml:.0f}%':>9} "
            f"{m.get('data_wait_frac', 0):>9.1%} {'-' if comp is None else f'{comp:.1f}':>9}  {d.get('bottleneck')}"
        )
    found, hand = rows.get("found by autotune", {}), rows.get("hand-tuned end state", {})
    versus = (
        found["samples_per_s"] / hand["samples_per_s"]
        if found.get("samples_per_s") and hand.get("samples_per_s")
        else None
    )
    if versus is not None:
        print(f"found by autotune: {versus:.2f}x the hand-tuned end state")
    print(json.dumps({"device": r.device.name if r.device else None, "cases": rows, "found_vs_hand_tuned": versus}))


if __name__ == "__main__":
    main()
