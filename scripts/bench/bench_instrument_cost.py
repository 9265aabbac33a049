"""What the instrumentation costs a program in production: `autotune run` at the baseline's config (a
best_config.yaml that changes nothing: torch's hooks installed, every knob the program's own) against the bare
program, side by side, two ways:

- **in one process** (`--inproc-pairs`, the resolving one): tests/programs/plain_lm.py's model, data and step
  (its own classes, the loop's body as it writes it), 200 steps with torch's hooks installed (autotune.instrument
  ._torch, under a production config) and 200 without (uninstalled: every patch undone), alternating; a pair's
  cost is the ratio of the two medians of the step times (the first 20 steps left out) less 1. One process: the
  host's state between fresh processes (on this 2-core host their step times sit ~12 or ~16 ms, whichever
  process) does not enter;
- **fresh processes** (`--pairs`, the end-to-end one): the program's command, bare and under `autotune run`, each to
  S1 and to S2 optimizer steps (its own `--steps` flag); a step costs (wall(S2) - wall(S1)) / (S2 - S1) (start-up,
  imports, the model's build and the first steps cancel); the four runs of a pair interleaved, the order
  alternating. Its interval shows the spread between fresh processes, which a 1% cost sits far inside.

Each pair's cost is tuned/bare - 1; their median and a 95% interval (Student's t over the pairs) are reported.

    python scripts/bench/bench_instrument_cost.py --inproc-pairs 10 --pairs 6      # plain_lm.py, 200 and 800 steps

Needs torch only (and pyyaml). Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.stats import T95  # noqa: E402

PROGRAMS = ROOT / "tests" / "programs"
STEPS_FLAG = {"plain_lm.py": "--steps={}", "nanogpt_loop.py": "--max_iters={}", "loader_loop.py": "--steps={}"}


def wall(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(command)}` exit {proc.returncode}: {proc.stderr.strip()[-600:]}")
    return time.perf_counter() - started


def in_process(pairs: int, steps: int = 200) -> list[float]:
    """Step-time ratios, hooks installed over bare, in this process (see the module doc)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    sys.path.insert(0, str(PROGRAMS))
    import plain_lm

    from autotune.instrument import _torch

    work = Path(tempfile.mkdtemp(prefix="instrument-cost-"))
    (work / "baseline.yaml").write_text(yaml.safe_dump({"knobs": {}, "device": {"type": "cpu"}, "safety": []}))
    os.environ["AUTOTUNE_CONFIG"] = str(work / "baseline.yaml")

    def median_step(hooked: bool) -> float:
        if hooked:
            _torch.install()
        try:
            torch.manual_seed(0)
            loader = DataLoader(plain_lm.Windows(50_000, 64, 256), batch_size=16, shuffle=True, drop_last=True)
            model = plain_lm.TinyGPT(256, 64)
            optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
            batches, times = iter(loader), []
            for _ in range(steps):
                started = time.perf_counter()
                x, y = next(batches)
                logits = model(x)
                loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                times.append(time.perf_counter() - started)
            return statistics.median(times[20:])
        finally:
            if hooked:
                _torch.uninstall()

    out = []
    for i in range(pairs):
        got = {hooked: median_step(hooked) for hooked in ((True, False) if i % 2 else (False, True))}
        out.append(got[True] / got[False] - 1)
        print(f"in-process pair {i}: bare {got[False] * 1e3:.3f} ms/step, hooked {got[True] * 1e3:.3f}, {out[-1]:+.2%}")
    del os.environ["AUTOTUNE_CONFIG"]
    shutil.rmtree(work, ignore_errors=True)
    return out


def interval(costs: list[float]) -> list[float] | None:
    if len(costs) < 2:
        return None
    mean, half = statistics.fmean(costs), T95.get(len(costs) - 1, 1.96) * statistics.stdev(costs) / len(costs) ** 0.5
    return [round(mean - half, 4), round(mean + half, 4)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--program", default="plain_lm.py", choices=sorted(STEPS_FLAG))
    p.add_argument("--pairs", type=int, default=6, help="fresh-process pairs (0: none)")
    p.add_argument("--inproc-pairs", type=int, default=10, help="in-process pairs (plain_lm's step; 0: none)")
    p.add_argument("--short", type=int, default=200, help="S1: optimizer steps of the short runs")
    p.add_argument("--long", type=int, default=800, help="S2: optimizer steps of the long runs")
    p.add_argument("--args", default="", help="the program's other arguments")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="instrument-cost-"))
    shutil.copy(PROGRAMS / a.program, work / a.program)
    np.random.default_rng(0).integers(0, 65, 200_000, dtype=np.uint16).tofile(work / "train.bin")
    config = work / "baseline.yaml"  # changes nothing: the program's own settings, the instrumentation installed
    config.write_text(yaml.safe_dump({"knobs": {}, "device": {"type": "cpu"}, "safety": []}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    cli = [sys.executable, "-m", "autotune.cli", "run", str(config), "--"]

    def command(tuned: bool, steps: int) -> list[str]:
        own = [sys.executable, a.program, STEPS_FLAG[a.program].format(steps), *a.args.split()]
        return [*cli, *own] if tuned else own

    loads = [os.getloadavg()[0]]
    inproc = in_process(a.inproc_pairs) if a.inproc_pairs else []
    rows, costs = [], []
    for i in range(a.pairs):
        loads.append(os.getloadavg()[0])
        first = bool(i % 2)  # every other pair the tuned side first
        order = [(first, a.short), (not first, a.short), (first, a.long), (not first, a.long)]
        got = {(t, s): wall(command(t, s), work, env) for t, s in order}
        bare = (got[False, a.long] - got[False, a.short]) / (a.long - a.short)
        tuned = (got[True, a.long] - got[True, a.short]) / (a.long - a.short)
        costs.append(tuned / bare - 1)
        rows.append((i, bare * 1e3, tuned * 1e3, costs[-1]))
        print(f"pair {i}: bare {bare * 1e3:.3f} ms/step, tuned {tuned * 1e3:.3f} ms/step, cost {costs[-1]:+.2%}")
    loads.append(os.getloadavg()[0])
    print(f"\n{'way':<14} {'pairs':>5} {'median':>8} {'95% interval':>20}")
    for way, c in (("in-process", inproc), ("fresh", costs)):
        if c:
            ci = interval(c)
            shown = f"{ci[0]:+.2%} to {ci[1]:+.2%}" if ci else "-"
            print(f"{way:<14} {len(c):>5} {statistics.median(c):>+8.2%} {shown:>20}")
    print(f"load average {min(loads):.1f}-{max(loads):.1f}")
    shutil.rmtree(work, ignore_errors=True)
    out = {
        "program": a.program,
        "inproc_pairs": [round(c, 4) for c in inproc],
        "inproc_cost_median": round(statistics.median(inproc), 4) if inproc else None,
        "inproc_cost_ci95": interval(inproc),
        "steps": [a.short, a.long],
        "pairs": [round(c, 4) for c in costs],
        "cost_median": round(statistics.median(costs), 4) if costs else None,
        "cost_ci95": interval(costs),
        "loadavg": [round(min(loads), 2), round(max(loads), 2)],
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
