"""Activation checkpointing, side by side: tiny_transformer trained with and without
the `activation_checkpointing` knob, on the project's own trial runner (a fresh
`python -m autotune.trial` process per measurement, the two interleaved per rep,
warm-up untimed). Reports each side's step time and peak RSS over the timed window
(the CPU's memory measure, `mem_rss_peak_gib`), and the paired ratios' medians.
With --cap-gib, the batch ladder under that forced memory limit (`memory_limit_gib`,
checked after every step): the largest batch each side fits.

    python scripts/bench_checkpointing.py [--batch-size 32] [--reps 3] [--cap-gib 1.0]

Needs torch only. Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def measure(args, ac: bool, batch: int, tmp: Path, cap: float | None = None) -> dict:
    from autotune.launcher import run_in_process

    config = {"workload": {"name": "tiny_transformer", "args": {"batch_size": batch, "seq_len": args.seq_len,
                                                                "dim": args.dim, "layers": args.layers}},
              "knobs": {"activation_checkpointing": ac, "num_threads": args.threads}, "warmup_steps": 2,
              "measure_steps": args.steps, "min_window_s": 0, "max_window_s": 120, "profile_steps": 0,
              "diagnose": False, "device": "cpu", "memory_limit_gib": cap}
    result = run_in_process(config, tmp / f"ac{int(ac)}-b{batch}", 600, str(ROOT), launcher="spawn")
    m = result.get("metrics") or {}
    return {"status": result["status"], "step_ms": m.get("step_ms_mean"), "rss_gib": m.get("mem_rss_peak_gib")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--cap-gib", type=float, default=None, help="the ladder under this peak-RSS limit")
    p.add_argument("--ladder", default="16,32,64,128,256")
    args = p.parse_args()
    out: dict = {"batch_size": args.batch_size, "pairs": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print(f"{'rep':>3} {'ckpt':>5} {'step ms':>9} {'peak RSS GiB':>13}")
        for rep in range(args.reps):
            pair = {}
            for ac in ((False, True) if rep % 2 == 0 else (True, False)):
                pair[ac] = measure(args, ac, args.batch_size, tmp)
                print(f"{rep:>3} {str(ac):>5} {pair[ac]['step_ms'] or 0:>9.1f} {pair[ac]['rss_gib'] or 0:>13.3f}")
            out["pairs"].append({"off": pair[False], "on": pair[True]})
        ok = [q for q in out["pairs"] if q["off"]["step_ms"] and q["on"]["step_ms"]]
        if ok:
            out["step_time_ratio_on_off"] = statistics.median(q["on"]["step_ms"] / q["off"]["step_ms"] for q in ok)
            out["peak_rss_ratio_on_off"] = statistics.median(q["on"]["rss_gib"] / q["off"]["rss_gib"] for q in ok)
            print(f"checkpointing: step time x{out['step_time_ratio_on_off']:.2f}, "
                  f"peak RSS x{out['peak_rss_ratio_on_off']:.3f} (medians of {len(ok)} pairs)")
        if args.cap_gib:
            out["cap_gib"], out["ladder"] = args.cap_gib, {}
            for ac in (False, True):
                fits = None
                for batch in (int(b) for b in args.ladder.split(",")):
                    r = measure(args, ac, batch, tmp, args.cap_gib)
                    print(f"ladder ckpt={ac} batch {batch}: {r['status']} (peak RSS {r['rss_gib'] or 0:.3f} GiB)")
                    if r["status"] != "ok":
                        break
                    fits = batch
                out["ladder"]["on" if ac else "off"] = fits
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
