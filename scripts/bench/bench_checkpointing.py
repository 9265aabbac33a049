"""Activation checkpointing, side by side: tiny_transformer trained with and without
the `activation_checkpointing` knob, on the project's own trial runner (a fresh
`python -m autotune.trial` process per measurement, the two interleaved per rep,
warm-up untimed). Reports each side's step time over the timed window and its
memory: the allocator's bytes in use at their peak (`mem_inuse_peak_gib`), what
a step adds to them (`mem_inuse_step_gib`: activations, gradients, temporaries),
both sampled in a memory window after the timed one (autotune.trial.memory), and the
window's peak RSS (`mem_rss_peak_gib`); then the paired ratios' medians. With
--cap-gib (default 0.3), the batch ladder under that forced memory limit
(`memory_limit_gib`, against the allocator's bytes in use): the largest batch
each side fits. One command:

    python scripts/bench/bench_checkpointing.py [--batch-size 32] [--reps 3] [--cap-gib 0.3]

Needs torch only. Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
COLUMNS = (
    ("step_ms", "step_ms_mean"),
    ("inuse_peak_gib", "mem_inuse_peak_gib"),
    ("inuse_step_gib", "mem_inuse_step_gib"),
    ("rss_peak_gib", "mem_rss_peak_gib"),
)


def measure(args, ac: bool, batch: int, tmp: Path, cap: float | None = None) -> dict:
    from autotune.execution.launcher import Launch, run_in_process

    # a ladder rung (cap): one warm-up step, a one-step window, the memory window; else a 10-step window
    window = {"warmup_steps": 1, "max_window_s": 1e-3} if cap else {"warmup_steps": 2, "max_window_s": 600}
    config = {
        "workload": {
            "name": "tiny_transformer",
            "args": {"batch_size": batch, "seq_len": args.seq_len, "dim": args.dim, "layers": args.layers},
        },
        "knobs": {"activation_checkpointing": ac, "num_threads": args.threads},
        **window,
        "measure_steps": args.steps,
        "min_window_s": 0,
        "target_ci": 1.0,
        "profile_steps": 0,
        "diagnose": False,
        "device": "cpu",
        "memory_limit_gib": cap,
    }
    result = run_in_process(config, tmp / f"ac{int(ac)}-b{batch}", 900, str(ROOT), launch=Launch("spawn"))
    m = result.metrics or {}
    return {"status": result.status, **{name: m.get(key) for name, key in COLUMNS}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=10, help="the timed window's steps")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument(
        "--cap-gib", type=float, default=0.3, help="the ladder under this limit on the bytes in use (0: none)"
    )
    p.add_argument("--ladder", default="16,32,64,128,256")
    args = p.parse_args()
    out: dict = {
        "workload": {
            "name": "tiny_transformer",
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "dim": args.dim,
            "layers": args.layers,
            "threads": args.threads,
        },
        "pairs": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print(
            f"{'rep':>3} {'ckpt':>5} {'step ms':>9} {'in use peak GiB':>16} {'step adds GiB':>14} {'peak RSS GiB':>13}"
        )
        for rep in range(args.reps):
            pair = {}
            for ac in (False, True) if rep % 2 == 0 else (True, False):
                r = pair[ac] = measure(args, ac, args.batch_size, tmp)
                print(
                    f"{rep:>3} {str(ac):>5} {r['step_ms'] or 0:>9.1f} {r['inuse_peak_gib'] or 0:>16.3f} "
                    f"{r['inuse_step_gib'] or 0:>14.3f} {r['rss_peak_gib'] or 0:>13.3f}  {r['status']}"
                )
            out["pairs"].append({"off": pair[False], "on": pair[True]})
        ok = [q for q in out["pairs"] if all(q[side][name] for side in ("off", "on") for name, _ in COLUMNS)]
        if ok:
            out["ratio_on_off"] = {
                name: statistics.median(q["on"][name] / q["off"][name] for q in ok) for name, _ in COLUMNS
            }
            print(
                f"checkpointing on/off (medians of {len(ok)} pairs): "
                + ", ".join(f"{name} x{ratio:.2f}" for name, ratio in out["ratio_on_off"].items())
            )
        if args.cap_gib:
            out["cap_gib"], out["ladder"] = args.cap_gib, {}
            for ac in (False, True):
                fits = None
                for batch in (int(b) for b in args.ladder.split(",")):
                    r = measure(args, ac, batch, tmp, args.cap_gib)
                    print(
                        f"ladder ckpt={ac!s:5} batch {batch:>4}: {r['status']:5} "
                        f"(in use peak {r['inuse_peak_gib'] or 0:.3f} GiB)"
                    )
                    if r["status"] != "ok":
                        break
                    fits = batch
                out["ladder"]["on" if ac else "off"] = fits
            print(
                f"largest batch under {args.cap_gib:g} GiB in use: {out['ladder']['off']} without checkpointing, "
                f"{out['ladder']['on']} with it"
            )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
