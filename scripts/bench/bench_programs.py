"""The programs of tests/programs/ searched with their specs beside them, and each search's claim checked
against the program itself in production mode (bench_program.py): issue 42's table, and issue 60's (`--only
plain_lm,nanogpt_loop,accelerate_lm,ddp_loop --no-spec --budget 4m`: a program of each style with no autotune line).

For each of memmap_loop, loader_loop, hf_bert, lightning_clip and trl_sft: a copy of tests/programs/ in a fresh
directory under `--out` (the spec's directory holds the program, as a user's does; memmap_loop's data.bin is made
there, and a program's own data by its `<name>_data.py` where it has one: trl_sft's model and texts; the run dir is
kept there, `<out>/<name>/run`), `autotune search
<name>.yaml`, then `bench_program.py` on the run dir. A program's best must leave at least 1.3x to find (`room`),
and the program's own speedup must agree with the claim (within 5%, or the claim inside the pairs' interval).

With `--no-spec`, each program is searched as a user with no spec runs it (issue 52): `autotune search --budget
BUDGET -- <its spec's command>`, from its directory, the space what the probe finds it takes.

    python scripts/bench/bench_programs.py                      # ~30 min on 2 cores
    python scripts/bench/bench_programs.py --only hf_bert --pairs 5
    python scripts/bench/bench_programs.py --only memmap_loop --smoke   # that it runs (CI): one trial, short windows
    python scripts/bench/bench_programs.py --only trl_sft --no-spec --budget 5m

Prints a table; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autotune.export import load as best_config  # noqa: E402
from autotune.trial.result import TrialResult  # noqa: E402

PROGRAMS = ROOT / "tests" / "programs"
NAMES = ("memmap_loop", "loader_loop", "hf_bert", "lightning_clip", "trl_sft")
# with no autotune line, one of each style: a plain DataLoader loop, nanoGPT's get_batch loop, an Accelerate loop and
# a torchrun DDP loop (issue 60: each searched with --no-spec --budget 4m)
ZERO_CODE = ("plain_lm", "nanogpt_loop", "accelerate_lm", "ddp_loop")
ROOM = 1.3
# --smoke: the baseline's trial at its floor (no profile, no diagnosis)
SMOKE_TRIAL = dict(warmup_steps=2, measure_steps=3, min_window_s=0.2, max_window_s=0.5, profile_steps=0, diagnose=False)


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def one(name: str, work: Path, a) -> dict:
    shutil.copytree(PROGRAMS, work, ignore=shutil.ignore_patterns("__pycache__"))
    np.random.default_rng(0).integers(0, 65, 200_000, dtype=np.uint16).tofile(work / "data.bin")
    run = work / "run"
    # datasets' cache (trl_sft's texts, tokenized) under the program's directory, not the user's home
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_CACHE": str(work / "hf_datasets")}
    data = work / f"{name}_data.py"
    if data.exists():
        made = subprocess.run([sys.executable, str(data), str(work)], cwd=work, capture_output=True, text=True)
        if made.returncode != 0:
            return {"program": name, "error": f"{data.name} exit {made.returncode}: {made.stderr.strip()[-400:]}"}
    spec = work / f"{name}.yaml"
    if a.smoke:  # the baseline alone: the script's path, not a claim
        data = yaml.safe_load(spec.read_text())
        data["search"] = {**data.get("search", {}), "n_trials": 1}
        data["trial"] = {**data.get("trial", {}), **SMOKE_TRIAL}
        spec.write_text(yaml.safe_dump(data))
    cli = Path(sys.executable).parent / "autotune"
    t = time.perf_counter()
    what = [str(spec)]
    if a.no_spec:  # the spec's command alone, after `--` (with --smoke: one trial)
        command = yaml.safe_load(spec.read_text())["workload"]["command"]
        what = ["--budget", a.budget, *(["--n-trials", "1"] if a.smoke else []), "--"]
        what += shlex.split(command) if isinstance(command, str) else command
    search = subprocess.run(
        [str(cli), "search", "-o", str(run), "-q", "--backend", a.backend, *what],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    search_s = time.perf_counter() - t
    if search.returncode != 0:
        return {"program": name, "error": f"search exit {search.returncode}: {search.stderr.strip()[-400:]}"}
    best = best_config.read(run / "best_config.yaml")
    baseline = yaml.safe_load((run / "spec.yaml").read_text())["workload"]["command"]
    best_trial = TrialResult.read(run / "trials" / f"{best['measured']['best_trial']:04d}" / "result.json")
    bench = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench" / "bench_program.py"), str(run), "--pairs", str(a.pairs)]
        + ["--steps", str(a.steps), "--warmup", str(a.warmup)],
        env=env,
        capture_output=True,
        text=True,
    )
    if bench.returncode != 0:
        return {"program": name, "error": f"bench_program exit {bench.returncode}: {bench.stderr.strip()[-400:]}"}
    b = last_json(bench.stdout)
    import csv

    with open(run / "trials.csv") as f:
        statuses = [row["status"] for row in csv.DictReader(f)]
    return {
        "program": name,
        "search_s": round(search_s, 1),
        "trials": len(statuses),
        "trials_ok": statuses.count("ok"),
        "unit": best["measured"].get("unit", "samples"),
        "baseline_command": " ".join(baseline),
        "best_command": b["best_command"],
        "best_env": best["workload"].get("env") or {},
        "best_sets": best_trial.knobs,  # what the best trial changed from the program's own settings
        "claimed_x": b["claimed_speedup_x"],
        "program_x": b["program_speedup_x"],
        "program_ci95": b["program_speedup_ci95"],
        "pairs": [round(x, 3) for x in b["pairs"]],
        "agrees": b["agrees"],
        "room": b["program_speedup_x"] >= ROOM and b["claimed_speedup_x"] >= ROOM,
        "load": [round(b["loadavg_min"], 1), round(b["loadavg_max"], 1)],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(NAMES), help="comma-separated program names")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=300, help="steps a production process runs before it is ended")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--backend", default="local", choices=["local", "ray"])
    p.add_argument("--smoke", action="store_true", help="one trial (the baseline), short windows: that it runs")
    p.add_argument("--no-spec", action="store_true", help="search each program's command with no spec (`-- CMD`)")
    p.add_argument("--budget", default="5m", help="with --no-spec: the search's time budget")
    p.add_argument("--out", default=f"runs/bench-programs-{time.strftime('%Y%m%d-%H%M%S')}", help="where runs stay")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n]
    unknown = sorted(set(names) - set(NAMES) - set(ZERO_CODE))
    if unknown:
        print(f"error: --only {','.join(unknown)}: not one of {', '.join(NAMES + ZERO_CODE)}", file=sys.stderr)
        return 2
    rows = []
    out = Path(a.out).resolve()
    for name in names:
        rows.append(one(name, out / name, a))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(
        f"{'program':<15} {'unit':>7} {'ok':>5} {'claimed':>8} {'program':>14} {'agrees':>6} {'>=1.3x':>6} {'search s':>8}  best"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['program']:<15} error: {r['error']}")
            continue
        print(
            f"{r['program']:<15} {r['unit']:>7} {r['trials_ok']:>2}/{r['trials']:<2} {r['claimed_x']:>7.2f}x "
            f"{r['program_x']:>6.2f}x +-{r['program_ci95']:.2f} "
            f"{'yes' if r['agrees'] else 'NO':>6} {'yes' if r['room'] else 'NO':>6} {r['search_s']:>8.0f}  "
            f"{r['best_sets'] or 'its own settings'}"
        )
    print(json.dumps({"programs": rows, "load_end": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
